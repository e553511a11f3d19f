"""Two-node runs on a real KubeRay operator, against its own local control plane: a run that succeeds and
is deleted, a run whose trainer reports a permanent failure, examples/run-multi-node.yaml as applied, and the
real `asyncrl trainer` as the Ray driver, through its preflight up to the first step that needs a GPU.

Real parts: kube-apiserver and kube-controller-manager (owner GC), the KubeRay operator built from its Go
module (scripts/provision-kuberay.sh) with the CRDs of the same module, the `asyncrl operator` process, the
gateway sidecar, and Ray itself: the head and worker pods KubeRay creates run its generated `ray start`
commands as real processes (asyncrl.testing.kuberay_pods adapts host names and ports to one host). Stand-ins:
the pod runner for the kubelet, and, except in the real trainer's test, tests/operator/ray_driver_probe.py
for `asyncrl trainer` (it composes verl's config from the run and joins the Ray cluster as the verl backend
does, then reports and exits).
No GPUs here: each Ray node advertises the GPUs of its pod's limit (`ray start --num-gpus=N`, which KubeRay
derives from `nvidia.com/gpu`), which Ray takes on trust.

Its own control plane, so that the session's one keeps no KubeRay CRDs (tests/operator/
test_multi_node_controlplane.py needs them absent). KubeRay's readiness probes call `wget` against the
dashboard agent; they are switched off with KubeRay's own ENABLE_PROBES_INJECTION=false.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.api.types.spec import GatewaySpec
from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.testing.controlplane import ControlPlane, free_port
from asyncrl.testing.kuberay_pods import KubeRayLocalPods
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.processes import start_server
from asyncrl.testing.waiting import WaitTimeout, wait_for
from asyncrl.workloads import names
from asyncrl.workloads.ray_cluster import RAY_CLUSTER_PLURAL, RAY_GROUP
from tests.api.conftest import EXAMPLES
from tests.support.kube import (
    GATEWAY_IMAGE,
    REPO,
    TRAINER_IMAGE,
    api_client_for,
    apply_ok,
    create_claim,
    delete_run,
    fresh_namespace,
    kubectl_for,
    kubectl_run,
    multi_node_manifest,
    pod_base_env,
    run_object,
    run_status,
    running_control_plane,
    start_operator_process,
    wait_established,
    wait_for_phase,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

KUBERAY_VERSION = "1.5.0"


def kuberay_dir() -> Path:
    cache = Path(os.environ.get("ASYNCRL_CACHE_DIR", Path.home() / ".cache" / "asyncrl"))
    return cache / "kuberay" / f"v{KUBERAY_VERSION}"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    if not (kuberay_dir() / "bin" / "ray-operator").exists():
        pytest.fail(
            f"KubeRay v{KUBERAY_VERSION} is not provisioned in {kuberay_dir()}: "
            "run scripts/provision-kuberay.sh",
            pytrace=False,
        )
    with running_control_plane(tmp_path_factory.mktemp("kuberay-plane")) as control:
        yield control


@pytest.fixture(scope="module")
def client_of(plane: ControlPlane) -> Iterator[Any]:
    with api_client_for(plane) as api:
        yield api


@pytest.fixture(scope="module")
def kubectl_of(plane: ControlPlane) -> list[str]:
    return kubectl_for(plane)


@pytest.fixture(scope="module")
def kuberay(
    plane: ControlPlane, kubectl_of: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """The CRDs (ours and all of KubeRay's, applied as a user would) and the KubeRay operator process. Without
    the RayJob and RayService CRDs, KubeRay waits for their caches and exits after two minutes, and the tests
    that came later in the module waited for pods no one created."""
    ray_crds = ("rayclusters", "rayjobs", "rayservices")
    crds = [REPO / "crds", *(kuberay_dir() / "crds" / f"ray.io_{plural}.yaml" for plural in ray_crds)]
    for path in crds:
        done = kubectl_run(kubectl_of, "apply", "--server-side", "--force-conflicts", "-f", str(path))
        assert done.returncode == 0, done.stderr
    for crd in ("asynctrainingruns.asyncrl.dev", *(f"{plural}.ray.io" for plural in ray_crds)):
        wait_established(kubectl_of, crd)
    health = free_port()
    operator = start_server(
        [
            str(kuberay_dir() / "bin" / "ray-operator"),
            f"--kubeconfig={plane.kubeconfig}",
            f"--metrics-addr=127.0.0.1:{free_port()}",
            f"--health-probe-bind-address=127.0.0.1:{health}",
            "--log-stdout-encoder=console",
            "--enable-leader-election=false",
        ],
        ready_url=f"http://127.0.0.1:{health}/healthz",
        log_path=tmp_path_factory.mktemp("kuberay") / "ray-operator.log",
        env={**os.environ, "ENABLE_PROBES_INJECTION": "false"},
        timeout_seconds=120,
    )
    yield
    assert operator.process.poll() is None, f"KubeRay's operator exited:\n{operator.log()[-3000:]}"
    operator.stop()


@pytest.fixture
def ns(client_of: Any) -> Iterator[str]:
    with fresh_namespace(client_of, prefix="kr") as name:
        yield name


def _pods(client_of: Any, namespace: str, selector: str) -> list[Any]:
    from kubernetes import client

    return list(client.CoreV1Api(client_of).list_namespaced_pod(namespace, label_selector=selector).items)


def _ray_cluster(client_of: Any, namespace: str, run: str) -> dict[str, Any] | None:
    from kubernetes import client

    try:
        found: dict[str, Any] = client.CustomObjectsApi(client_of).get_namespaced_custom_object(
            RAY_GROUP, "v1", namespace, RAY_CLUSTER_PLURAL, names.ray_cluster_name(run)
        )
    except client.exceptions.ApiException as error:
        if error.status == 404:
            return None
        raise
    return found


@contextmanager
def _ray_pods_and_operator(
    plane: ControlPlane,
    client_of: Any,
    ns: str,
    tmp_path: Path,
    *,
    probe_env: dict[str, str],
    images: dict[str, str] | None = None,
    real_trainer: bool = False,
) -> Iterator[PodRunner]:
    """The pod runner (KubeRay's pods as real Ray processes, the driver probe as the trainer) and our
    operator for `ns`. `images` maps more image names to the test's (an example's own image names).
    `real_trainer`: the trainer container runs its own command, the real `asyncrl trainer`."""
    driver = (
        Image()
        if real_trainer
        else Image(
            entrypoint=(sys.executable, "-m", "tests.operator.ray_driver_probe"),
            env=probe_env,
            replace_command=True,
        )
    )
    table = ImageTable({GATEWAY_IMAGE: Image(), TRAINER_IMAGE: driver})
    for name, stands_for in (images or {}).items():
        table[name] = Image() if stands_for == GATEWAY_IMAGE else driver
    # Ray's own temp dir, not the host's /tmp/ray: a killed head leaves /tmp/ray/ray_current_cluster behind,
    # and any later `ray.init()` on this machine would then try to join that dead cluster. Short, because
    # Ray's unix sockets live under it (108 characters at most).
    ray_tmp = Path(tempfile.mkdtemp(prefix="kr-", dir="/tmp"))
    base_env = {**pod_base_env(), "HOME": str(tmp_path), "RAY_TMPDIR": str(ray_tmp)}
    runner = PodRunner(
        api_client=client_of,
        images=table,
        work_dir=tmp_path / "pods",
        base_env=base_env,
        rewrite=KubeRayLocalPods(free_port),
    )
    try:
        with runner:
            operator = start_operator_process(
                kubeconfig=plane.kubeconfig, scope=["--namespace", ns], log_path=tmp_path / "operator.log"
            )
            try:
                try:
                    yield runner
                except WaitTimeout as error:  # what Ray's processes said: their logs go with the runner
                    raise WaitTimeout(f"{error}\n{_pod_log_tails(runner, operator.log())}") from error
                # Where a head got going (a run that fails at once may have its pods deleted before), its
                # session is under the test's temp dir, not the host's /tmp/ray.
                logs = (runner.work_dir / "pods").glob("*/*.log")
                if any("Ray runtime started" in log.read_text(errors="replace") for log in logs):
                    assert list((ray_tmp / "ray").glob("session_*")), "Ray did not use its own temp dir"
            finally:
                operator.stop()
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _pod_log_tails(runner: PodRunner, operator_log: str, lines: int = 25) -> str:
    """The last lines of every container's log of the test's pods, and of the operator's."""
    parts = ["--- operator:\n" + "\n".join(operator_log.splitlines()[-lines:])]
    for log in sorted((runner.work_dir / "pods").glob("*/*.log")):
        tail = log.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {log.parent.name}/{log.name}:\n" + "\n".join(tail))
    return "\n".join(parts)


def _multi_node_manifest(name: str) -> dict[str, Any]:
    return multi_node_manifest(name, resources={"limits": {"cpu": "1", "memory": "2Gi"}})


def test_a_two_node_run_gets_a_ray_cluster_whose_driver_sees_both_nodes_and_deletion_leaves_nothing(
    plane: ControlPlane, client_of: Any, kubectl_of: list[str], kuberay: None, ns: str, tmp_path: Path
) -> None:
    report = tmp_path / "driver-report.json"
    with _ray_pods_and_operator(
        plane, client_of, ns, tmp_path, probe_env={"ASYNCRL_PROBE_REPORT": str(report)}
    ):
        _two_node_run(client_of, kubectl_of, ns, report)


def test_a_trainer_that_reports_a_permanent_failure_fails_the_run_and_its_cluster_is_suspended_at_once(
    plane: ControlPlane, client_of: Any, kubectl_of: list[str], kuberay: None, ns: str, tmp_path: Path
) -> None:
    """The driver reports a configuration error and does not exit: the run is Failed with its message and the
    RayCluster suspended (every node's GPUs released) without waiting for the driver's restarts."""
    failure = "verlOverrides: actor_rollout_ref.rollout.tensor_model_parallel_size does not divide 16 GPUs"
    with _ray_pods_and_operator(plane, client_of, ns, tmp_path, probe_env={"ASYNCRL_PROBE_FAIL": failure}):
        create_claim(client_of, ns, "shared")
        apply_ok(kubectl_of, ns, _multi_node_manifest("failing"))
        status = wait_for_phase(client_of, ns, "failing", "Failed", timeout=420, what="the run Failed")
        assert status["message"] == f"the trainer stopped (configuration error): {failure}"
        wait_for(
            lambda: (_ray_cluster(client_of, ns, "failing") or {}).get("spec", {}).get("suspend") is True,
            timeout=120,  # the operator looks every 5 s
            what="the failed run's RayCluster suspended",
        )
        wait_for(
            lambda: not _pods(client_of, ns, "ray.io/cluster"), timeout=180, what="the cluster's pods gone"
        )
        assert not _restarted_drivers(client_of, ns)


def test_the_real_trainer_as_ray_driver_passes_its_own_checks_and_checks_the_cluster_through_ray(
    plane: ControlPlane, client_of: Any, kubectl_of: list[str], kuberay: None, ns: str, tmp_path: Path
) -> None:
    """The head pod's trainer container runs the operator's own command, the real `asyncrl trainer` with
    backend Verl (no stand-in), against the RayCluster KubeRay made. Its preflight checks in its own
    GPU-less container only what the driver uses, joins the real Ray head at RAY_ADDRESS, waits for the
    worker, and checks the cluster through Ray: the GPUs each pod declared to `ray start --num-gpus` (Ray
    takes them on trust; there is no GPU here), the CPUs of each node for verl's bundles, and each node's
    container by a Ray task on that node. It stops there, at the first step that needs a GPU: the task finds
    no CUDA on either node, truthfully. So do the dev venv's packages, which are not the trainer image's
    pins. Both are configuration errors: the trainer reports them and the run is Failed with them, its
    cluster suspended.

    Real: the control plane, KubeRay and its pods' `ray start`, Ray, the operator, the gateway sidecar, the
    trainer. Not: the pod runner for the kubelet; the model folder is a host folder (every pod is a process
    on this host, so the driver and both nodes see it, as a shared volume would give them)."""
    from asyncrl.api.types.spec import TrainerBackend
    from asyncrl.trainer.preflight import MACHINE, check_packages, cuda_state

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    manifest = multi_node_manifest("real", resources={"limits": {"cpu": "8", "memory": "2Gi"}})
    manifest["spec"]["model"]["path"] = str(model)
    with _ray_pods_and_operator(plane, client_of, ns, tmp_path, probe_env={}, real_trainer=True) as runner:
        create_claim(client_of, ns, "shared")
        apply_ok(kubectl_of, ns, manifest)
        status = wait_for_phase(client_of, ns, "real", "Failed", timeout=600, what="the run Failed")
        (head,) = _pods(client_of, ns, "ray.io/node-type=head")
        log = (runner.pod_dir(ns, head.metadata.name) / "trainer.log").read_text(errors="replace")
        wait_for(
            lambda: (_ray_cluster(client_of, ns, "real") or {}).get("spec", {}).get("suspend") is True,
            timeout=120,
            what="the failed run's RayCluster suspended",
        )

    report = log.split("asyncrl.trainer.main preflight:\n", 1)[1].splitlines()
    lines = [line for line in report[:30] if line.startswith(("ok    ", "FAIL  "))]
    names = [line[len("FAIL  ") :].split(": ", 1)[0] for line in lines]
    found = dict(zip(names, lines, strict=True))
    # The driver's own container: what it uses, and no CUDA, Ray CPUs in its cgroup or /dev/shm per GPU
    # (the one `ray cpus` line is the cluster's, below).
    assert names[:5] == ["packages", "model", "context length", "checkpoints", "checkpoint resume"]
    assert found["packages"] == check_packages(TrainerBackend.VERL, MACHINE).line()
    assert found["model"] == f"ok    model: {model}"
    assert found["context length"].startswith("ok    context length: "), found  # no positions in "{}"
    assert found["checkpoints"].startswith("ok    checkpoints: ")
    assert found["checkpoint resume"] == "ok    checkpoint resume: no checkpoint to resume", found
    assert not {"cuda", "gpus", "/dev/shm"} & set(names)
    assert names.count("ray cpus") == 1
    # The cluster, through Ray: the head reached, both nodes, their declared GPUs and CPUs.
    assert found["ray head"].startswith("ok    ray head: joined the run's Ray cluster at 127.0.0.1:")
    assert found["ray nodes"].startswith("ok    ray nodes: 2 of 2 joined")
    assert found["ray gpus"].startswith("ok    ray gpus: 2 in Ray (")
    assert "verl needs 2 nodes x 1 (spec.trainer.gpusPerNode)" in found["ray gpus"]
    assert found["ray cpus"].startswith("ok    ray cpus: 8 needed on every node")
    for name in ("/dev/shm", "model", "checkpoints"):
        assert found[f"{name} on every node"].startswith("ok"), found
    node_cuda = [line for name, line in found.items() if name.startswith("cuda on ")]
    if not cuda_state()[0]:
        assert len(node_cuda) == 2, found
        assert all(line.startswith("FAIL") and "sees no CUDA device" in line for line in node_cuda)
    assert status["message"].startswith(
        "the trainer stopped (configuration error): asyncrl trainer: preflight"
    )
    assert "cuda on " in status["message"]


def _restarted_drivers(client_of: Any, ns: str) -> list[str]:
    return [
        pod.metadata.name
        for pod in _pods(client_of, ns, "ray.io/node-type=head")
        for container in pod.status.container_statuses or []
        if container.name == "trainer" and container.restart_count
    ]


def test_the_multi_node_example_runs_on_kuberay_as_its_comment_says(
    plane: ControlPlane, client_of: Any, kubectl_of: list[str], kuberay: None, ns: str, tmp_path: Path
) -> None:
    """`kubectl apply -f examples/run-multi-node.yaml` after creating what its comment lists: the cluster
    has its 8 GPUs per node in Ray, verl's config has 2 nodes of 8, and the model volume and NCCL setting of
    its pod template reach the Ray containers on both nodes, where verl's workers run."""
    from kubernetes import client

    example = yaml.safe_load((EXAMPLES / "run-multi-node.yaml").read_text())
    name, spec = example["metadata"]["name"], example["spec"]
    report = tmp_path / "driver-report.json"
    images = {spec["trainer"]["image"]: TRAINER_IMAGE, GatewaySpec().image: GATEWAY_IMAGE}
    with _ray_pods_and_operator(
        plane, client_of, ns, tmp_path, probe_env={"ASYNCRL_PROBE_REPORT": str(report)}, images=images
    ):
        create_claim(client_of, ns, spec["trainer"]["checkpoint"]["claimName"])
        create_claim(client_of, ns, "models")
        data = spec["data"]["configMapRef"]
        client.CoreV1Api(client_of).create_namespaced_config_map(
            ns, {"metadata": {"name": data["name"]}, "data": {data["key"]: '{"prompt": "2+2?"}\n'}}
        )
        applied = kubectl_run(kubectl_of, "apply", "-n", ns, "-f", str(EXAMPLES / "run-multi-node.yaml"))
        assert applied.returncode == 0, applied.stderr

        seen = wait_for(
            lambda: json.loads(report.read_text()) if report.exists() else None,
            timeout=420,
            what="the driver's report of the Ray cluster",
            interval=1.0,
        )
        assert seen["verl"] == {"nnodes": 2, "n_gpus_per_node": 8}
        assert sorted(node["resources"]["GPU"] for node in seen["nodes"]) == [8.0, 8.0]
        assert seen["cluster_resources"]["GPU"] == 16.0
        pods = _pods(client_of, ns, "ray.io/cluster")
        ray_containers = [
            c for pod in pods for c in pod.spec.containers if c.name in ("ray-head", "ray-worker")
        ]
        assert sorted(c.name for c in ray_containers) == ["ray-head", "ray-worker"]
        for container in ray_containers:
            assert "/models" in {mount.mount_path for mount in container.volume_mounts}, container.name
            assert {"NCCL_SOCKET_IFNAME": "eth0"}.items() <= {e.name: e.value for e in container.env}.items()
        wait_for_phase(client_of, ns, name, "Succeeded", timeout=180, what="the example run Succeeded")
        deleted = delete_run(kubectl_of, ns, name)
        assert deleted.returncode == 0, deleted.stderr
        wait_for(
            lambda: _ray_cluster(client_of, ns, name) is None, timeout=180, what="the RayCluster deleted"
        )


def _two_node_run(client_of: Any, kubectl_of: list[str], ns: str, report: Path) -> None:
    from kubernetes import client

    core = client.CoreV1Api(client_of)
    create_claim(client_of, ns, "shared")
    apply_ok(kubectl_of, ns, _multi_node_manifest("multi"))
    run_uid = wait_for(
        lambda: run_object(client_of, ns, "multi")["metadata"].get("uid"), timeout=30, what="the run stored"
    )

    cluster = wait_for(lambda: _ray_cluster(client_of, ns, "multi"), timeout=120, what="the RayCluster")
    (owner,) = cluster["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == ("AsyncTrainingRun", run_uid)
    batch = client.BatchV1Api(client_of)
    assert not batch.list_namespaced_job(ns).items  # no one-node trainer Job beside the cluster

    # KubeRay's head and worker pods, Ray's processes in them, and the driver joining: its report.
    states: set[str] = set()

    def reported() -> dict[str, Any] | None:
        states.add(str(run_status(client_of, ns, "multi").get("rayCluster")))
        return json.loads(report.read_text()) if report.exists() else None

    seen = wait_for(reported, timeout=420, what="the driver's report of the Ray cluster", interval=1.0)
    assert seen["verl"] == {"nnodes": 2, "n_gpus_per_node": 1}
    assert len(seen["nodes"]) == 2, seen
    assert len({node["id"] for node in seen["nodes"]}) == 2
    for node in seen["nodes"]:  # each pod's limits, as KubeRay passed them to `ray start`
        assert node["resources"]["GPU"] == 1.0
        assert node["resources"]["CPU"] == 1.0
    assert seen["cluster_resources"]["GPU"] == 2.0
    head = _pods(client_of, ns, "ray.io/node-type=head")
    workers = _pods(client_of, ns, "ray.io/node-type=worker")
    assert (len(head), len(workers)) == (1, 1)
    assert [c.name for c in head[0].spec.containers] == ["ray-head", "trainer"]
    assert [c.name for c in workers[0].spec.init_containers] == ["wait-gcs-ready"]  # KubeRay's own

    # The driver exited 0: the run succeeded, the status showed the cluster, and its GPUs are released.
    def succeeded() -> dict[str, Any] | None:
        status = run_status(client_of, ns, "multi")
        states.add(str(status.get("rayCluster")))
        return status if status.get("phase") == "Succeeded" else None

    wait_for(succeeded, timeout=180, what="the run Succeeded", interval=1.0)
    assert any(state.startswith("ready") for state in states), states
    wait_for(
        lambda: not _pods(client_of, ns, "ray.io/cluster"),
        timeout=180,
        what="the finished cluster's pods gone",
    )
    assert (_ray_cluster(client_of, ns, "multi") or {}).get("spec", {}).get("suspend") is True

    # Deleting the run deletes the cluster (owner GC) and everything of it.
    deleted = delete_run(kubectl_of, ns, "multi")
    assert deleted.returncode == 0, deleted.stderr

    def leftovers() -> list[str]:
        found = (
            [f"RayCluster {names.ray_cluster_name('multi')}"] if _ray_cluster(client_of, ns, "multi") else []
        )
        found += [f"pod {p.metadata.name}" for p in core.list_namespaced_pod(ns).items]
        found += [f"service {s.metadata.name}" for s in core.list_namespaced_service(ns).items]
        found += [
            f"configmap {c.metadata.name}"
            for c in core.list_namespaced_config_map(ns).items
            if c.metadata.name != "kube-root-ca.crt"
        ]
        found += [f"secret {s.metadata.name}" for s in core.list_namespaced_secret(ns).items]
        return found

    wait_for(lambda: not leftovers() or None, timeout=180, what="nothing left of the run")
