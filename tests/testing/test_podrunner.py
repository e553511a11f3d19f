"""The test pod runner behaves like a kubelet for what our pods use (env, volumes, sidecars, deletion)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for

pytestmark = [pytest.mark.controlplane]


def _pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": containers,
            **spec,
        },
    }


def _phase(core: Any, namespace: str, name: str) -> str:
    return str(core.read_namespaced_pod(name, namespace).status.phase)


def _finished(core: Any, namespace: str, name: str) -> str | None:
    phase = _phase(core, namespace, name)
    return phase if phase in ("Succeeded", "Failed") else None


def test_env_from_secret_configmap_and_field_refs_reaches_the_process(
    api_client: Any, pod_runner: PodRunner, namespace: str
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": "creds"}, "stringData": {"token": "s3cret"}}
    )
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "settings"}, "data": {"MODE": "train"}}
    )
    container = {
        "name": "main",
        "image": "asyncrl.test/shell",
        "command": ["sh", "-c", 'echo "$TOKEN $CFG_MODE $POD $LABEL $GREETING"'],
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "LABEL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "GREETING", "value": "hi-$(POD)"},
        ],
    }
    core.create_namespaced_pod(namespace, _pod("env", [container]))

    assert (
        wait_for(lambda: _finished(core, namespace, "env"), timeout=60, what="pod env to finish")
        == "Succeeded"
    )
    log = pod_runner.log_path(namespace, "env", "main").read_text()
    assert log.strip() == "s3cret train env demo hi-env"


def test_configmap_volume_is_materialized_at_its_mount_path(
    api_client: Any, pod_runner: PodRunner, namespace: str
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "cfg"}, "data": {"trainer.yaml": "step: 1\n"}}
    )
    container = {
        "name": "main",
        "image": "asyncrl.test/shell",
        "command": [
            "sh",
            "-c",
            "cat /etc/asyncrl/trainer.yaml && echo scratch > /scratch/x && cat /scratch/x",
        ],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/asyncrl"},
            {"name": "tmp", "mountPath": "/scratch"},
        ],
    }
    volumes = [{"name": "config", "configMap": {"name": "cfg"}}, {"name": "tmp", "emptyDir": {}}]
    core.create_namespaced_pod(namespace, _pod("vol", [container], volumes=volumes))

    assert (
        wait_for(lambda: _finished(core, namespace, "vol"), timeout=60, what="pod vol to finish")
        == "Succeeded"
    )
    assert pod_runner.log_path(namespace, "vol", "main").read_text() == "step: 1\nscratch\n"


def test_native_sidecar_starts_first_and_is_stopped_when_the_main_container_ends(
    api_client: Any, pod_runner: PodRunner, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    ready = tmp_path / "sidecar-up"
    sidecar = {
        "name": "gateway",
        "image": "asyncrl.test/shell",
        "restartPolicy": "Always",
        "command": [
            "sh",
            "-c",
            f"touch {ready}; trap 'echo sidecar-stopped; exit 0' TERM; while true; do sleep 0.1; done",
        ],
    }
    # A native sidecar counts as started once its process runs (as with a kubelet and no startupProbe), not
    # once its command has done anything: so the main container checks at its start that the sidecar's
    # process was started (the runner opens its log to start it), then waits, bounded, for it to be up.
    sidecar_log = pod_runner.log_path(namespace, "sidecar", "gateway")
    main = {
        "name": "trainer",
        "image": "asyncrl.test/shell",
        "command": [
            "sh",
            "-c",
            f"test -e {sidecar_log} || {{ echo main-started-first; exit 1; }}; "
            f"for i in $(seq 300); do test -e {ready} && {{ echo saw-sidecar; exit 0; }}; sleep 0.1; done; "
            "exit 1",
        ],
    }
    core.create_namespaced_pod(namespace, _pod("sidecar", [main], initContainers=[sidecar]))

    assert (
        wait_for(lambda: _finished(core, namespace, "sidecar"), timeout=60, what="pod to finish")
        == "Succeeded"
    )
    assert pod_runner.log_path(namespace, "sidecar", "trainer").read_text().strip() == "saw-sidecar"
    assert "sidecar-stopped" in pod_runner.log_path(namespace, "sidecar", "gateway").read_text()
    pod = core.read_namespaced_pod("sidecar", namespace)
    assert pod.status.init_container_statuses[0].state.terminated is not None


def test_deleting_a_running_pod_kills_its_process_and_completes_the_deletion(
    api_client: Any, pod_runner: PodRunner, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    pid_file = tmp_path / "pid"
    container = {
        "name": "main",
        "image": "asyncrl.test/shell",
        "command": ["sh", "-c", f"echo $$$$ > {pid_file}; exec sleep 300"],
    }
    core.create_namespaced_pod(namespace, _pod("victim", [container]))
    wait_for(lambda: _phase(core, namespace, "victim") == "Running", timeout=60, what="pod to run")
    pid = int(
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=30, what="pid file")
    )
    core.delete_namespaced_pod("victim", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("victim", namespace)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(gone, timeout=60, what="pod deletion to complete")
    assert not Path(f"/proc/{pid}").exists()


def test_unknown_image_leaves_the_pod_pending_with_a_reason(
    api_client: Any, pod_runner: PodRunner, namespace: str
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    container = {"name": "main", "image": "registry.example/unknown:1", "command": ["true"]}
    core.create_namespaced_pod(namespace, _pod("noimage", [container]))

    def waiting_reason() -> str | None:
        statuses = core.read_namespaced_pod("noimage", namespace).status.container_statuses or []
        waiting = statuses[0].state.waiting if statuses else None
        return waiting.reason if waiting and waiting.reason != "PodInitializing" else None

    assert wait_for(waiting_reason, timeout=60, what="a waiting reason") == "ErrImageNeverPull"
    assert _phase(core, namespace, "noimage") == "Pending"


def test_on_failure_restarts_the_container_and_counts_restarts(
    api_client: Any, pod_runner: PodRunner, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    attempts = tmp_path / "attempts"
    script = f"echo x >> {attempts}; test $(wc -l < {attempts}) -ge 2"
    container = {"name": "main", "image": "asyncrl.test/shell", "command": ["sh", "-c", script]}
    core.create_namespaced_pod(namespace, _pod("flaky", [container], restartPolicy="OnFailure"))

    assert (
        wait_for(lambda: _finished(core, namespace, "flaky"), timeout=60, what="pod to finish") == "Succeeded"
    )
    pod = core.read_namespaced_pod("flaky", namespace)
    assert pod.status.container_statuses[0].restart_count == 1
    assert attempts.read_text().count("x") == 2
