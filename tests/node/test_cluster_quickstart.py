"""The cluster path as a user takes it, on a real node: the project's images, `helm install`, `kubectl apply`.

Nothing here is a stand-in. The operator runs as the chart's Deployment from the image that
scripts/provision-images.sh built, with the chart's ServiceAccount and RBAC (in-cluster config, no kubeconfig
from outside). `examples/quickstart-cluster.yaml` is applied unchanged, into a namespace that enforces the
restricted Pod Security level: its trainer pod (the CPU trainer image, with the gateway image as a native
sidecar) and every agent Job run in containerd on the kubelet of `asyncrl.testing.node`.

Mid-run the test kills the gateway and the trainer containers with SIGKILL (the processes, found through the
CRI), deletes the trainer pod and the operator pod, and checks that the run still finishes with every rollout
executed at most once: each agent pod that ever started is recorded by a watch, by rollout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.launch.processes import free_port
from asyncrl.testing.controlplane import default_bin_dir, images_dir
from asyncrl.testing.node import NodeCluster
from asyncrl.testing.waiting import wait_for
from asyncrl.workloads import names
from tests.node.conftest import REQUIRE_ENV
from tests.support.kube import REPO, kubectl_run

pytestmark = [pytest.mark.node, pytest.mark.slow]

CHART = REPO / "charts" / "asyncrl-operator"
QUICKSTART = REPO / "examples" / "quickstart-cluster.yaml"
IMAGES = ("operator", "gateway", "trainer-cpu")
SYSTEM_NAMESPACE = "asyncrl-system"
RELEASE = "asyncrl-operator"
REPLICAS = 2
# Two cores run the node, the control plane, the trainer and up to 32 agent pods: a generous bound.
RUN_TIMEOUT = 1200.0


@dataclass
class Installed:
    """The operator installed by helm, and the namespace (restricted) whose runs it reconciles."""

    cluster: NodeCluster
    kubectl: list[str]
    runs_namespace: str
    api: Any


@pytest.fixture(scope="module")
def project_images(node_cluster: NodeCluster) -> list[str]:
    """The images scripts/provision-images.sh built, imported into the node's containerd."""
    tarballs = [images_dir() / f"{image}.tar" for image in IMAGES]
    missing = [str(path) for path in tarballs if not path.is_file()]
    if missing:
        message = (
            f"the project's images are not built ({', '.join(missing)}): run scripts/provision-images.sh"
        )
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return node_cluster.import_images(tarballs)


def _helm(*args: str, kubeconfig: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run(
        [str(default_bin_dir() / "helm"), *args], capture_output=True, text=True, env=env, timeout=600
    )


def _restricted_namespace(kubectl: list[str], name: str) -> None:
    created = kubectl_run(kubectl, "create", "namespace", name)
    assert created.returncode == 0, created.stderr
    labelled = kubectl_run(
        kubectl,
        "label",
        "namespace",
        name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    assert labelled.returncode == 0, labelled.stderr


@pytest.fixture(scope="module")
def installed(
    node_cluster: NodeCluster, project_images: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    from kubernetes import config

    kubectl = node_cluster.kubectl()
    runs_namespace = f"runs-{os.urandom(3).hex()}"
    _restricted_namespace(kubectl, SYSTEM_NAMESPACE)
    _restricted_namespace(kubectl, runs_namespace)
    home = tmp_path_factory.mktemp("helm")
    install = _helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        SYSTEM_NAMESPACE,
        "--set-json",
        f'watch.namespaces=["{runs_namespace}"]',
        "--set",
        f"replicas={REPLICAS}",  # one leads, one stands by: the quickstart kills the leader mid-run
        "--wait",
        "--timeout=5m",
        kubeconfig=node_cluster.kubeconfig,
        home=home,
    )
    assert install.returncode == 0, f"{install.stdout}\n{install.stderr}\n{node_cluster.describe_failure()}"
    api = config.new_client_from_config(config_file=str(node_cluster.kubeconfig))  # type: ignore[no-untyped-call]
    try:
        yield Installed(cluster=node_cluster, kubectl=kubectl, runs_namespace=runs_namespace, api=api)
    finally:
        kubectl_run(kubectl, "delete", "namespace", runs_namespace, "--wait=false")
        _helm(
            "uninstall",
            RELEASE,
            "--namespace",
            SYSTEM_NAMESPACE,
            kubeconfig=node_cluster.kubeconfig,
            home=home,
        )
        api.close()


# -- reading the cluster ----------------------------------------------------------------------------------


def _get(kubectl: list[str], *args: str) -> dict[str, Any]:
    found = kubectl_run(kubectl, "get", *args, "-o", "json")
    assert found.returncode == 0, found.stderr
    document: dict[str, Any] = json.loads(found.stdout)
    return document


def _pods(kubectl: list[str], namespace: str, selector: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = _get(kubectl, "pods", "-n", namespace, "-l", selector)["items"]
    return items


def _status(kubectl: list[str], namespace: str, run: str) -> dict[str, Any]:
    status: dict[str, Any] = _get(kubectl, "atr", run, "-n", namespace).get("status") or {}
    return status


def _leader(kubectl: list[str]) -> str:
    """The pod that holds the chart's Lease (named like its Deployment), or "" when none does."""
    lease = _get(kubectl, "lease", RELEASE, "-n", SYSTEM_NAMESPACE)
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def _container_ids(pod: dict[str, Any]) -> list[str]:
    statuses = [
        *(pod.get("status", {}).get("containerStatuses") or []),
        *(pod.get("status", {}).get("initContainerStatuses") or []),
    ]
    return [status.get("containerID", "") for status in statuses]


def _restart_count(pod: dict[str, Any], container: str) -> int:
    statuses = [
        *(pod.get("status", {}).get("containerStatuses") or []),
        *(pod.get("status", {}).get("initContainerStatuses") or []),
    ]
    return int(next(status["restartCount"] for status in statuses if status["name"] == container))


def _kill_container(cluster: NodeCluster, namespace: str, pod: str, container: str) -> int:
    """SIGKILL of the container's main process, found through the CRI (what `kill -9` on the node does)."""
    listed = subprocess.run(
        [
            *cluster.crictl(),
            "ps",
            "--quiet",
            "--state=running",
            f"--name=^{container}$",
            f"--label=io.kubernetes.pod.namespace={namespace}",
            f"--label=io.kubernetes.pod.name={pod}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    (container_id,) = listed.stdout.split()
    inspected = subprocess.run(
        [*cluster.crictl(), "inspect", container_id], capture_output=True, text=True, check=True
    )
    pid = int(json.loads(inspected.stdout)["info"]["pid"])
    os.kill(pid, signal.SIGKILL)
    return pid


@dataclass
class AgentPodLedger:
    """Every agent pod that started, by rollout, as a watch saw them (a restart-proof record: a pod deleted
    and created again is still two executions), and the largest carry-over counts the test's polls saw."""

    started: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    restarts: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    carry_over_seen: int = 0
    max_age_seen: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def record(self, pod: Any) -> None:
        statuses = pod.status.container_statuses or []
        if not any(status.state.running or status.state.terminated for status in statuses):
            return
        rollout = (pod.metadata.labels or {}).get(names.LABEL_ROLLOUT, "?")
        self.started[rollout].add(pod.metadata.uid)
        self.restarts[pod.metadata.uid] = max(status.restart_count for status in statuses)

    def watch(self, api: Any, namespace: str) -> None:
        from kubernetes import client, watch

        core = client.CoreV1Api(api)
        selector = f"{names.LABEL_COMPONENT}={names.COMPONENT_AGENT}"
        while not self._stop.is_set():
            try:
                for event in watch.Watch().stream(  # type: ignore[no-untyped-call]
                    core.list_namespaced_pod, namespace, label_selector=selector, timeout_seconds=5
                ):
                    self.record(event["object"])
                    if self._stop.is_set():
                        return
            except Exception as error:  # a dropped watch is resumed; its reason is kept for the failure
                self.errors.append(repr(error))
                time.sleep(0.5)

    def stop(self) -> None:
        self._stop.set()

    def saw_status(self, status: dict[str, Any]) -> None:
        """The run's carry-over counts as the test polled them (they are per step, so keep the largest)."""
        self.carry_over_seen = max(self.carry_over_seen, int(status.get("newCarryOverRollouts") or 0))
        self.max_age_seen = max(self.max_age_seen, int(status.get("carryOverAgeMaxSteps") or 0))


@contextlib.contextmanager
def watching_agent_pods(api: Any, namespace: str) -> Iterator[AgentPodLedger]:
    ledger = AgentPodLedger()
    thread = threading.Thread(target=ledger.watch, args=(api, namespace), daemon=True)
    thread.start()
    try:
        yield ledger
    finally:
        ledger.stop()
        thread.join(timeout=30)


def _quickstart(name: str) -> dict[str, Any]:
    manifest: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())
    manifest["metadata"]["name"] = name
    return manifest


def _wait_for_step(
    kubectl: list[str], namespace: str, run: str, step: int, *, what: str, ledger: AgentPodLedger
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        status = _status(kubectl, namespace, run)
        ledger.saw_status(status)
        assert status.get("phase") != "Failed", f"the run failed: {status.get('message')}"
        return status if (status.get("step") or -1) >= step or status.get("phase") == "Succeeded" else None

    return wait_for(reached, timeout=RUN_TIMEOUT, what=what, interval=1.0)


def _wait_for_end(kubectl: list[str], namespace: str, run: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        status = _status(kubectl, namespace, run)
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    return wait_for(ended, timeout=RUN_TIMEOUT, what=f"the run {run} to end", interval=2.0)


@contextlib.contextmanager
def port_forward(kubectl: list[str], namespace: str, target: str, remote_port: int) -> Iterator[int]:
    """`kubectl port-forward` on 127.0.0.1; yields the local port once it answers. A port-forward that
    exits (its pod not running yet, say) is started again; a timeout shows what the last one said."""
    local = free_port()
    argv = [
        *kubectl,
        "port-forward",
        "-n",
        namespace,
        "--address=127.0.0.1",
        target,
        f"{local}:{remote_port}",
    ]
    said: list[str] = []
    process: subprocess.Popen[str] | None = None

    def answering() -> bool:
        nonlocal process
        if process is None or process.poll() is not None:
            if process is not None and process.stdout is not None:
                said[:] = [process.stdout.read()]
            process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return _http_status(f"http://127.0.0.1:{local}/") is not None

    try:
        try:
            wait_for(answering, timeout=180, what=f"port-forward to {namespace}/{target}")
        except AssertionError as error:
            raise AssertionError(f"{error}; the last port-forward said: {said}") from None
        yield local
    finally:
        if process is not None:
            process.kill()
            process.wait()


def _http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except OSError:
        return None


def _http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


# -- the tests --------------------------------------------------------------------------------------------


def test_helm_install_runs_the_operator_from_its_image_under_the_charts_identity(
    installed: Installed,
) -> None:
    kubectl = installed.kubectl
    pods = _pods(kubectl, SYSTEM_NAMESPACE, f"app.kubernetes.io/instance={RELEASE}")
    assert len(pods) == REPLICAS, [p["metadata"]["name"] for p in pods]
    for pod in pods:
        assert all(cid.startswith("containerd://") for cid in _container_ids(pod)), _container_ids(pod)
        spec = pod["spec"]
        (container,) = spec["containers"]
        assert container["image"] == "ghcr.io/asyncrl/operator:0.1.0"
        assert spec["serviceAccountName"] == RELEASE
        assert not any(env["name"] == "KUBECONFIG" for env in container.get("env") or [])
        conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert conditions["Ready"] == "True"  # the standby too: `helm install --wait` returned
        # The liveness probe answered (the kubelet would have restarted a container whose /healthz failed).
        assert _restart_count(pod, "operator") == 0
    # One of them leads, through the chart's Lease, under the chart's identity (its Role for leases).
    holder = _leader(kubectl)
    assert holder in {p["metadata"]["name"] for p in pods}, holder
    with port_forward(kubectl, SYSTEM_NAMESPACE, f"svc/{RELEASE}-metrics", 9090) as port:
        metrics = _http_text(f"http://127.0.0.1:{port}/metrics")
    assert "asyncrl_operator_" in metrics


# Its own waits allow RUN_TIMEOUT; pytest's 900 s backstop cut it in a loaded CI run (2 operator replicas, the
# vLLM tests beside it): 500 s alone, more than 900 s there.
@pytest.mark.timeout(1800)
def test_the_quickstart_trains_to_succeeded_through_kills_executing_each_rollout_once(
    installed: Installed,
) -> None:
    cluster, kubectl, namespace = installed.cluster, installed.kubectl, installed.runs_namespace
    run = "quickstart"
    trainer_selector = f"{names.LABEL_RUN}={run},{names.LABEL_COMPONENT}=trainer"
    started = time.monotonic()
    with watching_agent_pods(installed.api, namespace) as ledger:
        applied = kubectl_run(kubectl, "apply", "-n", namespace, "-f", str(QUICKSTART))
        assert applied.returncode == 0, applied.stderr
        first = _wait_for_step(kubectl, namespace, run, 1, what="the quickstart's first steps", ledger=ledger)
        first_reward = float((first.get("reward") or {}).get("last", 0.0))

        # The trainer pod: both containers in containerd, the gateway reachable through its Service.
        (trainer_pod,) = [
            p for p in _pods(kubectl, namespace, trainer_selector) if p["status"]["phase"] == "Running"
        ]
        pod_name, pod_uid = trainer_pod["metadata"]["name"], trainer_pod["metadata"]["uid"]
        assert all(cid.startswith("containerd://") for cid in _container_ids(trainer_pod))
        with port_forward(kubectl, namespace, f"svc/{run}-gateway", 8090) as port:
            assert _http_status(f"http://127.0.0.1:{port}/healthz") == 200
        logs = kubectl_run(kubectl, "logs", "-n", namespace, f"job/{run}-trainer", "-c", "trainer")
        assert logs.returncode == 0, logs.stderr

        # kill -9 of the gateway sidecar: restarted in place (same pod), and the run goes on.
        _kill_container(cluster, namespace, pod_name, "gateway")
        wait_for(
            lambda: _restart_count(_get(kubectl, "pod", pod_name, "-n", namespace), "gateway") >= 1,
            timeout=180,
            what="the gateway sidecar restarted after SIGKILL",
        )
        assert _get(kubectl, "pod", pod_name, "-n", namespace)["metadata"]["uid"] == pod_uid

        step = int(_status(kubectl, namespace, run).get("step") or 0)
        _wait_for_step(
            kubectl, namespace, run, step + 1, what="a step after the gateway's restart", ledger=ledger
        )

        # kill -9 of the trainer container: restarted, it resumes from its checkpoint.
        _kill_container(cluster, namespace, pod_name, "trainer")
        step = int(_status(kubectl, namespace, run).get("step") or 0)
        _wait_for_step(
            kubectl, namespace, run, step + 1, what="a step after the trainer's SIGKILL", ledger=ledger
        )

        # The trainer pod deleted: its Job makes another, which resumes.
        deleted = kubectl_run(kubectl, "delete", "pod", "-n", namespace, pod_name, "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
        step = int(_status(kubectl, namespace, run).get("step") or 0)
        _wait_for_step(
            kubectl, namespace, run, step + 1, what="a step after the trainer pod's deletion", ledger=ledger
        )

        # The leading operator's pod deleted: it releases the Lease, and the replica that stood by takes the
        # run over (the Deployment also makes a new pod, which stands by in its turn).
        leader = _leader(kubectl)
        standby = {
            p["metadata"]["name"]
            for p in _pods(kubectl, SYSTEM_NAMESPACE, f"app.kubernetes.io/instance={RELEASE}")
        } - {leader}
        deleted = kubectl_run(kubectl, "delete", "pod", "-n", SYSTEM_NAMESPACE, leader, "--wait=false")
        assert deleted.returncode == 0, deleted.stderr
        new_leader = wait_for(
            lambda: (holder := _leader(kubectl)) != leader and holder, timeout=180, what="another leader"
        )
        assert new_leader in standby, (new_leader, standby)
        step = int(_status(kubectl, namespace, run).get("step") or 0)
        _wait_for_step(
            kubectl, namespace, run, step + 1, what="a step served by the new leader", ledger=ledger
        )

        final = _wait_for_end(kubectl, namespace, run)
        assert final["phase"] == "Succeeded", final
        wall_clock = time.monotonic() - started
        table = kubectl_run(kubectl, "get", "atr", "-n", namespace, run, "-o", "wide")
        print(f"\nquickstart on the real node: {wall_clock:.0f}s\n{table.stdout}")

    total_steps = int(_quickstart(run)["spec"]["totalSteps"])
    assert final["step"] == total_steps - 1, final
    reward = final["reward"]
    print(f"reward: first seen {first_reward:.3f}, last {reward['last']:.3f}, best {reward['best']:.3f}")
    # The toy policy learns: a broken update leaves the reward where it started (about 0.0-0.1). Not "reaches
    # 0.3": on some seeds plain async stalls below it for 16 steps (issue 39: 2 of 18 runs); here it failed
    # once at best 0.158 from 0.014 (CI of 9c5f87e). Time to reward is the benchmarks' to judge.
    assert reward["best"] >= first_reward + 0.1, (first_reward, reward)
    assert reward["last"] > first_reward, (first_reward, reward)

    # Every rollout ran at most once, in containers, and never restarted in place.
    assert not [rollout for rollout, pods in ledger.started.items() if len(pods) > 1], dict(ledger.started)
    assert not [uid for uid, restarts in ledger.restarts.items() if restarts], ledger.restarts
    agent_pods = _pods(kubectl, namespace, f"{names.LABEL_RUN}={run},{names.LABEL_COMPONENT}=agent")
    assert agent_pods
    assert all(cid.startswith("containerd://") for p in agent_pods for cid in _container_ids(p) if cid)
    # Carry-over happened (the async window's point) and the gateway's restart was said on the run.
    assert ledger.carry_over_seen > 0, ledger
    assert ledger.max_age_seen >= 1, ledger
    reasons = {event.get("reason") for event in _get(kubectl, "events", "-n", namespace)["items"]}
    assert "GatewayRestarted" in reasons, reasons
    rollouts = final["rollouts"]
    assert rollouts["succeeded"] >= total_steps * 4 * 4, rollouts  # trainBatchSize x samplesPerPrompt a step
    assert len(ledger.started) >= rollouts["succeeded"], (len(ledger.started), rollouts)
    assert re.search(r"\bSucceeded\b", table.stdout)


def test_deleting_a_run_mid_run_leaves_no_child_and_no_orphan_pod(installed: Installed) -> None:
    kubectl, namespace = installed.kubectl, installed.runs_namespace
    run = "deleted-midway"
    applied = kubectl_run(kubectl, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(_quickstart(run)))
    assert applied.returncode == 0, applied.stderr
    selector = f"{names.LABEL_RUN}={run}"
    wait_for(
        lambda: any(
            p["status"]["phase"] == "Running"
            for p in _pods(kubectl, namespace, f"{selector},{names.LABEL_COMPONENT}=agent")
        ),
        timeout=RUN_TIMEOUT,
        what="agent pods of the run running",
    )
    deleted = kubectl_run(kubectl, "delete", "atr", "-n", namespace, run, "--wait=true", "--timeout=300s")
    assert deleted.returncode == 0, deleted.stderr

    def nothing_left() -> bool:
        found = _get(kubectl, "jobs,pods,services,configmaps,secrets", "-n", namespace, "-l", selector)
        return not found["items"]

    wait_for(nothing_left, timeout=300, what=f"every child of {run} gone", interval=1.0)


def test_a_misspelled_agent_image_is_named_on_the_run_from_a_real_pull_failure(installed: Installed) -> None:
    """Issue 37 item 6, on the real kubelet: the agent image cannot be pulled (no such image, and no registry
    reachable from here). Before, the run stayed Running, "training", Ready=True and said nothing."""
    kubectl, namespace = installed.kubectl, installed.runs_namespace
    run, image = "typo-image", "ghcr.io/asyncrl/agnet:0.1.0"
    manifest = _quickstart(run)
    template = manifest["spec"]["agents"]["template"]["inline"]
    assert "image: ghcr.io/asyncrl/trainer-cpu:0.1.0" in template
    manifest["spec"]["agents"]["template"]["inline"] = template.replace(
        "image: ghcr.io/asyncrl/trainer-cpu:0.1.0", f"image: {image}"
    )
    applied = kubectl_run(kubectl, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    assert applied.returncode == 0, applied.stderr
    try:

        def pull_failure() -> str | None:
            for pod in _pods(kubectl, namespace, f"{names.LABEL_RUN}={run},{names.LABEL_COMPONENT}=agent"):
                for container in pod.get("status", {}).get("containerStatuses") or []:
                    reason = (container.get("state", {}).get("waiting") or {}).get("reason")
                    if reason in ("ErrImagePull", "ImagePullBackOff"):
                        return str(reason)
            return None

        wait_for(
            pull_failure, timeout=RUN_TIMEOUT, what="an agent pod failing to pull its image", interval=1.0
        )

        def named() -> dict[str, Any] | None:
            condition = next(
                (
                    c
                    for c in _status(kubectl, namespace, run).get("conditions") or []
                    if c["type"] == "AgentPodsStarting"
                ),
                None,
            )
            return condition if condition is not None and condition["status"] == "False" else None

        condition = wait_for(named, timeout=120, what="AgentPodsStarting=False on the run", interval=1.0)
        assert condition["reason"] in ("ErrImagePull", "ImagePullBackOff"), condition
        assert image in condition["message"], condition
        status = _status(kubectl, namespace, run)
        assert status["phase"] == "Running", status
        assert "cannot start" in status["message"], status
        warnings = _get(kubectl, "events.events.k8s.io", "-n", namespace)["items"]
        assert any(
            event.get("reason") == "AgentPodCannotStart" and image in (event.get("note") or "")
            for event in warnings
        ), [event.get("reason") for event in warnings]
    finally:
        kubectl_run(kubectl, "delete", "atr", "-n", namespace, run, "--wait=true", "--timeout=300s")
