"""The local control plane is the real thing: real API semantics, the real Job/GC/TTL controllers.

Pods are run by the test pod runner (there is no kubelet here): it binds them to a fake Node and runs their
containers as local processes. Everything else below is Kubernetes' own behaviour.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from asyncrl.testing.controlplane import DEFAULT_K8S_VERSION, ControlPlane
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for

pytestmark = [pytest.mark.controlplane]


def _job(name: str, command: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            **spec,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "main", "image": "asyncrl.test/shell", "command": command}],
                }
            },
        },
    }


def _job_condition(batch: Any, namespace: str, name: str) -> tuple[str, str] | None:
    job = batch.read_namespaced_job_status(name, namespace)
    for condition in job.status.conditions or []:
        if condition.type in ("Complete", "Failed") and condition.status == "True":
            return condition.type, condition.reason or ""
    return None


def _pods_of(core: Any, namespace: str, job: str) -> list[Any]:
    return list(core.list_namespaced_pod(namespace, label_selector=f"job-name={job}").items)


def test_api_server_reports_the_built_kubernetes_version(
    control_plane: ControlPlane, kubectl: list[str]
) -> None:
    out = subprocess.run([*kubectl, "version", "-o", "json"], capture_output=True, text=True, check=True)
    server = json.loads(out.stdout)["serverVersion"]
    assert server["gitVersion"] == f"v{DEFAULT_K8S_VERSION}"
    assert server["minor"] == DEFAULT_K8S_VERSION.split(".")[1]


def test_rbac_is_enforced_for_an_identity_without_roles(
    control_plane: ControlPlane, kubectl: list[str]
) -> None:
    out = subprocess.run(
        [*kubectl, "auth", "can-i", "create", "jobs", "--as=system:serviceaccount:default:nobody"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.stdout.strip() == "no"


def test_job_runs_its_command_through_the_pod_runner_and_completes(
    api_client: Any, pod_runner: PodRunner, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client

    batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)
    marker = tmp_path / "ran"
    batch.create_namespaced_job(namespace, _job("ok", ["sh", "-c", f"echo hello-from-pod > {marker}"]))

    assert wait_for(lambda: _job_condition(batch, namespace, "ok"), timeout=60, what="job ok to finish") == (
        "Complete",
        "CompletionsReached",
    )
    assert marker.read_text().strip() == "hello-from-pod"
    (pod,) = _pods_of(core, namespace, "ok")
    assert pod.spec.node_name == pod_runner.node_name
    assert pod.status.phase == "Succeeded"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0


def test_failing_command_fails_the_job_with_its_exit_code(
    api_client: Any, pod_runner: PodRunner, namespace: str
) -> None:
    from kubernetes import client

    batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)
    batch.create_namespaced_job(namespace, _job("bad", ["sh", "-c", "echo failing >&2; exit 3"]))

    condition = wait_for(
        lambda: _job_condition(batch, namespace, "bad"), timeout=60, what="job bad to finish"
    )
    assert condition == ("Failed", "BackoffLimitExceeded")
    (pod,) = _pods_of(core, namespace, "bad")
    assert pod.status.phase == "Failed"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3
    log = pod_runner.log_path(namespace, pod.metadata.name, "main").read_text()
    assert "failing" in log


def test_active_deadline_fails_a_slow_job_and_kills_its_process(
    api_client: Any, pod_runner: PodRunner, namespace: str, tmp_path: Path
) -> None:
    from kubernetes import client

    batch = client.BatchV1Api(api_client)
    pid_file = tmp_path / "pid"
    batch.create_namespaced_job(
        namespace,
        _job("slow", ["sh", "-c", f"echo $$$$ > {pid_file}; exec sleep 300"], activeDeadlineSeconds=3),
    )

    pid = int(
        wait_for(
            lambda: pid_file.exists() and pid_file.read_text().strip(), timeout=60, what="slow pod to start"
        )
    )
    condition = wait_for(
        lambda: _job_condition(batch, namespace, "slow"), timeout=60, what="job slow to fail"
    )
    assert condition == ("Failed", "DeadlineExceeded")
    wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=30, what=f"process {pid} to be killed")


def test_deleting_an_owner_garbage_collects_its_dependents(api_client: Any, namespace: str) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}, "data": {"k": "v"}})
    reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_secret(
        namespace,
        {"metadata": {"name": "dependent", "ownerReferences": [reference]}, "stringData": {"a": "b"}},
    )
    core.delete_namespaced_config_map("owner", namespace)

    def dependent_gone() -> bool:
        try:
            core.read_namespaced_secret("dependent", namespace)
        except ApiException as error:
            return error.status == 404
        return False

    wait_for(dependent_gone, timeout=60, what="the garbage collector to delete the dependent secret")


def test_ttl_after_finished_removes_a_finished_job(
    api_client: Any, pod_runner: PodRunner, namespace: str
) -> None:
    from kubernetes import client

    batch = client.BatchV1Api(api_client)
    batch.create_namespaced_job(namespace, _job("short-lived", ["true"], ttlSecondsAfterFinished=1))
    wait_for(lambda: _job_condition(batch, namespace, "short-lived"), timeout=60, what="job to finish")

    def job_gone() -> bool:
        return not any(
            job.metadata.name == "short-lived" for job in batch.list_namespaced_job(namespace).items
        )

    wait_for(job_gone, timeout=60, what="the TTL controller to delete the finished job")
