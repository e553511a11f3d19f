"""Runs queued by a real Kueue: admitted, held suspended while the quota is taken, resumed when it frees.

Real parts: kube-apiserver and kube-controller-manager (the Job controller), Kueue's manager built from its Go
module with the CRDs of the same module (scripts/provision-kueue.sh), the `asyncrl operator` process, the
gateway sidecar. Stand-ins: the pod runner for the kubelet and the stub trainer for the trainer image.

Its own control plane, so that no other test meets Kueue's CRDs or its manager. Kueue runs without its
webhooks (the API server is not told of them; the operator creates a queued trainer suspended itself, which is
what Kueue's Job webhook would do) and without its internal certificate management, so it needs a serving
certificate on disk. Its manager reads the metrics server's certificate from a fixed path
(/etc/kueue/metrics/certs); it is started in a private mount namespace (`unshare -m`) whose /etc is a tmpfs
holding that certificate, so the machine's /etc is never written.

A multi-node run's RayCluster is checked against Kueue's RayCluster integration with KubeRay's CRD installed
but no KubeRay operator: admission is Kueue's part (it resumes the cluster); running the nodes is
test_kuberay_controlplane.py's.
"""

from __future__ import annotations

import datetime
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.launch.processes import free_port
from asyncrl.testing.controlplane import ControlPlane
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.processes import ServerProcess, start_server
from asyncrl.testing.waiting import wait_for
from asyncrl.workloads import names
from asyncrl.workloads.ray_cluster import RAY_CLUSTER_PLURAL, RAY_GROUP
from tests.support.kube import (
    AGENT_IMAGE,
    GATEWAY_IMAGE,
    REPO,
    TRAINER_IMAGE,
    api_client_for,
    apply_ok,
    create_claim,
    fresh_namespace,
    kubectl_for,
    kubectl_run,
    multi_node_manifest,
    pod_base_env,
    run_manifest,
    run_status,
    running_control_plane,
    start_operator_process,
    trainer_job,
    wait_established,
    wait_for_phase,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

KUEUE_VERSION = "0.17.0"
KUBERAY_VERSION = "1.5.0"
KUEUE_GROUP = "kueue.x-k8s.io"
QUEUE = "runs"
# One run's trainer pod asks for the gateway sidecar's default 500m CPU (the stub trainer asks for nothing):
# a quota of 750m admits one run at a time.
CPU_QUOTA = "750m"


def _cache() -> Path:
    return Path(os.environ.get("ASYNCRL_CACHE_DIR", Path.home() / ".cache" / "asyncrl"))


def kueue_dir() -> Path:
    return _cache() / "kueue" / f"v{KUEUE_VERSION}"


def kuberay_crd() -> Path:
    return _cache() / "kuberay" / f"v{KUBERAY_VERSION}" / "crds" / "ray.io_rayclusters.yaml"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    missing = [str(path) for path in (kueue_dir() / "bin" / "kueue", kuberay_crd()) if not path.exists()]
    if missing:
        pytest.fail(
            f"not provisioned: {', '.join(missing)}; run scripts/provision-kueue.sh and "
            "scripts/provision-kuberay.sh",
            pytrace=False,
        )
    if shutil.which("unshare") is None:
        pytest.fail("`unshare` (util-linux) is needed to give Kueue its certificate path", pytrace=False)
    with running_control_plane(tmp_path_factory.mktemp("kueue-plane")) as control:
        yield control


@pytest.fixture(scope="module")
def client_of(plane: ControlPlane) -> Iterator[Any]:
    with api_client_for(plane) as api:
        yield api


@pytest.fixture(scope="module")
def kubectl_of(plane: ControlPlane) -> list[str]:
    return kubectl_for(plane)


def _self_signed(directory: Path) -> None:
    """tls.crt and tls.key for 127.0.0.1 in `directory` (Kueue's webhook and metrics servers need one)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kueue-test")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


@pytest.fixture(scope="module")
def kueue(
    plane: ControlPlane, kubectl_of: list[str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """Our CRD, Kueue's and KubeRay's RayCluster CRD (applied as a user would), and Kueue's manager."""
    for path in (REPO / "crds", kueue_dir() / "crds", kuberay_crd()):
        done = kubectl_run(kubectl_of, "apply", "--server-side", "--force-conflicts", "-f", str(path))
        assert done.returncode == 0, done.stderr
    for crd in ("asynctrainingruns.asyncrl.dev", "workloads.kueue.x-k8s.io", "rayclusters.ray.io"):
        wait_established(kubectl_of, crd)
    work = tmp_path_factory.mktemp("kueue")
    _self_signed(work / "certs")
    health = free_port()
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
        "metrics": {"bindAddress": f"127.0.0.1:{free_port()}"},
        "webhook": {"host": "127.0.0.1", "port": free_port(), "certDir": str(work / "certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["batch/job", "ray.io/raycluster"]},
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    # /etc/kueue/metrics/certs is fixed in Kueue's code: a tmpfs /etc in a private mount namespace holds it.
    script = (
        "set -e; mount -t tmpfs tmpfs /etc; mkdir -p /etc/kueue/metrics/certs; "
        f'cp "{work}/certs/tls.crt" "{work}/certs/tls.key" /etc/kueue/metrics/certs/; exec "$@"'
    )
    manager = start_server(
        [
            "unshare",
            "--mount",
            "sh",
            "-c",
            script,
            "kueue",
            str(kueue_dir() / "bin" / "kueue"),
            f"--config={work / 'config.yaml'}",
            f"--kubeconfig={plane.kubeconfig}",
            # Its on-demand visibility API server reads a certificate from a fixed /visibility path; it is
            # not what is tested here.
            "--feature-gates=VisibilityOnDemand=false",
        ],
        ready_url=f"http://127.0.0.1:{health}/readyz",
        log_path=work / "kueue.log",
        env=dict(os.environ),
        timeout_seconds=180,
    )
    yield manager
    manager.stop()


@pytest.fixture
def ns(client_of: Any, kueue: ServerProcess) -> Iterator[str]:
    with fresh_namespace(client_of, prefix="kq") as name:
        yield name


def _custom(client_of: Any) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(client_of)


def _queue(client_of: Any, ns: str) -> None:
    """A ResourceFlavor, a ClusterQueue of CPU_QUOTA for this namespace, and its LocalQueue QUEUE."""
    custom = _custom(client_of)
    flavor = f"flavor-{ns}"
    custom.create_cluster_custom_object(
        KUEUE_GROUP,
        "v1beta2",
        "resourceflavors",
        {"kind": "ResourceFlavor", "apiVersion": f"{KUEUE_GROUP}/v1beta2", "metadata": {"name": flavor}},
    )
    custom.create_cluster_custom_object(
        KUEUE_GROUP,
        "v1beta2",
        "clusterqueues",
        {
            "apiVersion": f"{KUEUE_GROUP}/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": f"cq-{ns}"},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": flavor,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": CPU_QUOTA},
                                    {"name": "memory", "nominalQuota": "1000Gi"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "8"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
    )
    custom.create_namespaced_custom_object(
        KUEUE_GROUP,
        "v1beta2",
        ns,
        "localqueues",
        {
            "apiVersion": f"{KUEUE_GROUP}/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": QUEUE, "namespace": ns},
            "spec": {"clusterQueue": f"cq-{ns}"},
        },
    )


def _queued(manifest: dict[str, Any]) -> dict[str, Any]:
    labels = {names.KUEUE_QUEUE_LABEL: QUEUE}
    manifest["spec"]["trainer"]["podTemplate"] = {"metadata": {"labels": labels}}
    return manifest


def _job_suspended(client_of: Any, ns: str, run: str) -> bool | None:
    job = trainer_job(client_of, ns, run)
    return None if job is None else bool(job.spec.suspend)


def _workloads(client_of: Any, ns: str) -> list[dict[str, Any]]:
    found = _custom(client_of).list_namespaced_custom_object(KUEUE_GROUP, "v1beta2", ns, "workloads")
    return list(found["items"])


def _admitted(workload: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Admitted" and c.get("status") == "True"
        for c in (workload.get("status") or {}).get("conditions") or []
    )


def test_queued_runs_are_admitted_one_at_a_time_by_the_quota(
    plane: ControlPlane, client_of: Any, kubectl_of: list[str], ns: str, tmp_path: Path
) -> None:
    _queue(client_of, ns)
    table = ImageTable(
        {
            GATEWAY_IMAGE: Image(),
            AGENT_IMAGE: Image(entrypoint=(sys.executable,)),
            TRAINER_IMAGE: Image(
                entrypoint=(sys.executable, "-m", "tests.operator.stub_trainer"), replace_command=True
            ),
        }
    )
    runner = PodRunner(
        api_client=client_of, images=table, work_dir=tmp_path / "pods", base_env=pod_base_env()
    )
    with runner:
        operator = start_operator_process(
            kubeconfig=plane.kubeconfig, scope=["--namespace", ns], log_path=tmp_path / "operator.log"
        )
        try:
            apply_ok(kubectl_of, ns, _queued(run_manifest("first", totalSteps=4)))
            wait_for(
                lambda: _job_suspended(client_of, ns, "first") is False,
                timeout=180,
                what="Kueue admits the first run's trainer Job (suspend false)",
            )
            apply_ok(kubectl_of, ns, _queued(run_manifest("second", totalSteps=1)))

            # The second waits: its Job exists, suspended, with an unadmitted Workload, and the run says why.
            def waiting() -> dict[str, Any] | None:
                status = run_status(client_of, ns, "second")
                return status if "waiting for Kueue (queue runs)" in (status.get("message") or "") else None

            status = wait_for(waiting, timeout=180, what="the second run's status naming its queue")
            assert status["phase"] == "Pending", status
            assert _job_suspended(client_of, ns, "second") is True
            pending = [w for w in _workloads(client_of, ns) if "second" in w["metadata"]["name"]]
            assert pending, _workloads(client_of, ns)
            assert not any(_admitted(w) for w in pending), pending
            # The first finishes: its quota is freed, Kueue admits the second, which runs to its end.
            wait_for_phase(client_of, ns, "first", "Succeeded", timeout=300, what="the first run to end")
            wait_for_phase(
                client_of, ns, "second", "Succeeded", timeout=300, what="the second run, admitted, to end"
            )
        finally:
            operator.stop()


def test_a_queued_multi_node_run_creates_its_cluster_suspended_and_kueue_resumes_it(
    plane: ControlPlane, client_of: Any, kubectl_of: list[str], ns: str, tmp_path: Path
) -> None:
    """Admission only: no KubeRay operator runs here, so the cluster's nodes never start."""
    _queue(client_of, ns)
    operator = start_operator_process(
        kubeconfig=plane.kubeconfig, scope=["--namespace", ns], log_path=tmp_path / "operator.log"
    )
    try:
        create_claim(client_of, ns, "shared")
        manifest = _queued(
            multi_node_manifest("gang", resources={"requests": {"cpu": "100m", "memory": "1Gi"}})
        )
        apply_ok(kubectl_of, ns, manifest)

        def cluster() -> dict[str, Any] | None:
            from kubernetes import client

            try:
                found: dict[str, Any] = _custom(client_of).get_namespaced_custom_object(
                    RAY_GROUP, "v1", ns, RAY_CLUSTER_PLURAL, names.ray_cluster_name("gang")
                )
            except client.exceptions.ApiException as error:
                if error.status == 404:
                    return None
                raise
            return found

        created = wait_for(cluster, timeout=120, what="the run's RayCluster")
        assert created["metadata"]["labels"][names.KUEUE_QUEUE_LABEL] == QUEUE
        wait_for(
            lambda: any(_admitted(w) for w in _workloads(client_of, ns)),
            timeout=180,
            what="Kueue admits the RayCluster's workload",
        )
        wait_for(
            lambda: (cluster() or {}).get("spec", {}).get("suspend") is False,
            timeout=120,
            what="Kueue resumes the admitted RayCluster",
        )
    finally:
        operator.stop()
