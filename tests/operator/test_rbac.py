"""The operator runs, and only runs, with the RBAC of `operator/rbac/`, on the real control plane.

The manifests are applied as a user would (rewritten to the test's namespace; cluster-scoped names get a
per-test suffix and are deleted afterwards). The operator process then authenticates as the ServiceAccount
with a token from the TokenRequest API, the way a pod's projected token works, so every call it and kopf make
is authorized by the real RBAC authorizer. A run must go all the way to Succeeded under that identity and be
deleted cleanly (kopf removes its finalizer), the operator's log must show no RBAC denial, and
`kubectl auth can-i` with the same identity must refuse what the operator has no business doing.

Stand-ins, as in test_operator_controlplane.py: the pod runner for a kubelet, the stub trainer for the
trainer.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from asyncrl.testing.controlplane import ControlPlane, free_port
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.processes import ServerProcess
from asyncrl.testing.waiting import wait_for
from tests.support.kube import (
    apply_ok,
    find_run,
    multi_node_manifest,
    run_manifest,
    start_operator_process,
    wait_for_phase,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

RBAC_DIR = Path(__file__).resolve().parents[2] / "operator" / "rbac"
MANIFEST_NAMESPACE = "asyncrl-system"  # the namespace the committed manifests name
SERVICE_ACCOUNT = "asyncrl-operator"
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding"}


def load_rbac(path: Path, *, namespace: str, suffix: str) -> list[dict[str, Any]]:
    """The manifests of `path` moved to `namespace`; cluster-scoped objects renamed `<name>-<suffix>`."""
    documents = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    renamed = {doc["metadata"]["name"] for doc in documents if doc["kind"] in CLUSTER_SCOPED}
    for doc in documents:
        metadata = doc["metadata"]
        if doc["kind"] in CLUSTER_SCOPED:
            metadata["name"] = f"{metadata['name']}-{suffix}"
        else:
            assert metadata["namespace"] == MANIFEST_NAMESPACE, doc
            metadata["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            assert subject["namespace"] == MANIFEST_NAMESPACE, doc
            subject["namespace"] = namespace
        role_ref = doc.get("roleRef")
        if role_ref and role_ref["kind"] == "ClusterRole" and role_ref["name"] in renamed:
            role_ref["name"] = f"{role_ref['name']}-{suffix}"
    return documents


def service_account_kubeconfig(
    api_client: Any, control_plane: ControlPlane, *, namespace: str, name: str, path: Path
) -> Path:
    """A kubeconfig for ServiceAccount `namespace/name`: a TokenRequest token, the plane's server and CA."""
    from kubernetes import client

    token = (
        client.CoreV1Api(api_client)
        .create_namespaced_service_account_token(name, namespace, {"spec": {"expirationSeconds": 3600}})
        .status.token
    )
    admin = yaml.safe_load(control_plane.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "local", "user": name, "namespace": namespace}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# kopf lists namespaces to resolve namespace patterns even when given exact names; the namespaced Role does
# not grant it, and kopf falls back to the exact `--namespace` names (after about a minute of retries).
EXPECTED_DENIAL = re.compile(
    r'cannot (list|watch) resource "namespaces" in API group "" at the cluster scope'
)


def rbac_denials(log: str, *, namespace: str, service_account: str = SERVICE_ACCOUNT) -> list[str]:
    """Lines of an operator log where the API server refused the ServiceAccount something unexpected."""
    identity = f"system:serviceaccount:{namespace}:{service_account}"
    return [
        line
        for line in log.splitlines()
        if identity in line and "cannot" in line and not EXPECTED_DENIAL.search(line)
    ]


@dataclass
class Installed:
    namespace: str
    kubeconfig: Path
    documents: list[dict[str, Any]]

    def can_i(self, kubectl_bin: str, *args: str) -> bool:
        done = subprocess.run(
            [kubectl_bin, f"--kubeconfig={self.kubeconfig}", "auth", "can-i", *args],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.stdout.strip() in ("yes", "no"), (args, done.stdout, done.stderr)
        return done.stdout.strip() == "yes"


def _apply_list(kubectl: list[str], documents: list[dict[str, Any]]) -> None:
    done = subprocess.run(
        [*kubectl, "apply", "-f", "-"],
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def install_rbac(
    api_client: Any, control_plane: ControlPlane, kubectl: list[str], namespace: str, tmp_path: Path
) -> Iterator[Any]:
    """Apply one of operator/rbac/*.yaml for the test's namespace; delete its cluster-scoped part after."""
    applied: list[dict[str, Any]] = []

    def install(file_name: str) -> Installed:
        documents = load_rbac(RBAC_DIR / file_name, namespace=namespace, suffix=uuid.uuid4().hex[:8])
        _apply_list(kubectl, documents)
        applied.extend(documents)
        kubeconfig = service_account_kubeconfig(
            api_client,
            control_plane,
            namespace=namespace,
            name=SERVICE_ACCOUNT,
            path=tmp_path / "sa.kubeconfig",
        )
        return Installed(namespace=namespace, kubeconfig=kubeconfig, documents=documents)

    yield install
    for doc in applied:
        if doc["kind"] in CLUSTER_SCOPED:
            subprocess.run(
                [*kubectl, "delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found"],
                capture_output=True,
                check=False,
            )


def _a_run_succeeds_and_is_deleted(
    api_client: Any, kubectl: list[str], namespace: str, operator: ServerProcess
) -> None:
    """Children, agent Jobs, status, Events and the finalizer all work under the operator's identity."""
    from kubernetes import client

    apply_ok(kubectl, namespace, run_manifest("rbac"))
    try:
        status = wait_for_phase(
            api_client,
            namespace,
            "rbac",
            "Succeeded",
            timeout=180,
            what="the run to succeed under the operator's RBAC",
        )
    except AssertionError:
        print(operator.log()[-6000:])
        raise
    assert status["step"] == 1
    assert status["jobs"]["created"] == 8
    assert status["rollouts"]["succeeded"] == 8

    # Raw JSON: kopf's core/v1 Events have no eventTime, which the typed events.k8s.io model rejects.
    listing = client.EventsV1Api(api_client).list_namespaced_event(namespace, _preload_content=False)
    events = json.loads(listing.data)["items"]
    reasons = {(event["regarding"]["kind"], event.get("reason")) for event in events}
    assert ("AsyncTrainingRun", "PhaseRunning") in reasons, reasons

    # Deletion completes only when kopf, as this identity, removed its finalizer (a patch of the run).
    subprocess.run(
        [*kubectl, "delete", "atr", "rbac", "-n", namespace, "--wait=false"], check=True, capture_output=True
    )
    wait_for(
        lambda: find_run(api_client, namespace, "rbac") is None, timeout=60, what="the run to be deleted"
    )
    assert operator.process.poll() is None, operator.log()
    assert rbac_denials(operator.log(), namespace=namespace) == []


def test_the_namespaced_role_is_enough_for_a_run_to_succeed(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    install_rbac: Any,
    installed_crd: Path,
    tmp_path: Path,
) -> None:
    installed: Installed = install_rbac("role.yaml")
    operator = start_operator_process(
        kubeconfig=installed.kubeconfig,
        scope=["--namespace", namespace],
        log_path=tmp_path / "operator-namespaced.log",
    )
    try:
        _a_run_succeeds_and_is_deleted(api_client, kubectl, namespace, operator)
    finally:
        operator.stop()
    # Either kopf was denied the namespace listing and fell back to the exact --namespace, or it never tried.
    log = operator.log()
    assert ("Not enough permissions to list namespaces" in log) == bool(EXPECTED_DENIAL.search(log))


def test_an_operator_without_its_role_in_a_namespace_is_not_ready_and_says_what_is_missing(
    api_client: Any,
    namespace: str,
    kubectl: list[str],
    install_rbac: Any,
    installed_crd: Path,
    tmp_path: Path,
) -> None:
    """Issue 37 item 8: with `--namespace` of a namespace where its ServiceAccount has no Role, every request
    there is refused. Before, `/healthz` said 200, no error was counted and runs there stayed blank. Now
    `/readyz` is 503 naming the namespace, the permissions and the fix, the refusals are counted, and binding
    the Role there makes it ready within a review (30 s), without a restart."""
    from kubernetes import client

    installed: Installed = install_rbac("role.yaml")
    other = f"{namespace}-b"
    client.CoreV1Api(api_client).create_namespace({"metadata": {"name": other}})
    health, metrics = free_port(), free_port()
    operator = start_operator_process(
        kubeconfig=installed.kubeconfig,
        scope=["--namespace", namespace, "--namespace", other],
        log_path=tmp_path / "operator-two-namespaces.log",
        extra_args=[f"--metrics-port={metrics}"],
        health_port=health,
    )
    try:
        ready = f"http://127.0.0.1:{health}/readyz"
        answer = wait_for(
            lambda: (lambda r: r if r.status_code == 503 and "missing" in r.json() else None)(
                httpx.get(ready, timeout=10)
            ),
            timeout=120,
            what="/readyz naming the missing permissions",
        )
        body = answer.json()
        assert body["ready"] is False
        assert {entry["namespace"] for entry in body["missing"]} == {other}, body
        assert "list asynctrainingruns.asyncrl.dev" in {entry["permission"] for entry in body["missing"]}
        assert f"in namespace {other}" in body["reason"]
        assert "operator/rbac/role.yaml" in body["reason"]
        assert httpx.get(f"http://127.0.0.1:{health}/healthz", timeout=10).status_code == 200  # alive
        scrape = httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text
        labels = f'namespace="{other}",permission="create jobs.batch"'
        series = f"asyncrl_operator_missing_permissions{{{labels}}} 1.0"
        assert series in scrape, scrape
        wait_for(
            lambda: re.search(
                r'asyncrl_operator_errors_total\{kind="forbidden"\} [1-9]',
                httpx.get(f"http://127.0.0.1:{metrics}/metrics", timeout=10).text,
            ),
            timeout=120,
            what="the refused requests counted",
        )
        assert "not ready: " in operator.log()
        assert other in operator.log()

        # The fix the reason names: the operator's Role in the other namespace too.
        role = next(doc for doc in installed.documents if doc["kind"] == "Role")
        binding = next(doc for doc in installed.documents if doc["kind"] == "RoleBinding")
        _apply_list(
            kubectl, [{**doc, "metadata": {**doc["metadata"], "namespace": other}} for doc in (role, binding)]
        )
        wait_for(
            lambda: httpx.get(ready, timeout=10).status_code == 200,
            timeout=120,
            what="/readyz 200 once the Role is bound",
        )
        assert operator.process.poll() is None, operator.log()
    finally:
        operator.stop()
        client.CoreV1Api(api_client).delete_namespace(other)


def test_without_kuberay_rbac_a_multi_node_run_fails_once_naming_the_chart_value(
    api_client: Any,
    namespace: str,
    kubectl: list[str],
    install_rbac: Any,
    installed_crd: Path,
    tmp_path: Path,
) -> None:
    """The default install (role.yaml, `kuberay.enabled: false`) has no rights on RayClusters or claims: a
    multi-node run is told to enable them, not that the API server refused its spec."""
    installed: Installed = install_rbac("role.yaml")
    operator = start_operator_process(
        kubeconfig=installed.kubeconfig,
        scope=["--namespace", namespace],
        log_path=tmp_path / "operator-no-kuberay.log",
    )
    try:
        apply_ok(kubectl, namespace, multi_node_manifest("multi", claim="ckpt"))
        status = wait_for_phase(api_client, namespace, "multi", "Failed", timeout=180, what="multi Failed")
    finally:
        operator.stop()
    assert status["message"].startswith("spec.trainer.nodes > 1 runs the trainer on a KubeRay RayCluster")
    assert "kuberay.enabled=true" in status["message"]
    assert "spec.trainer.nodes: 1" in status["message"]


def test_the_namespaced_role_refuses_what_the_operator_does_not_need(
    namespace: str, kubectl: list[str], install_rbac: Any, installed_crd: Path
) -> None:
    installed: Installed = install_rbac("role.yaml")
    kubectl_bin = kubectl[0]
    ns = ["-n", namespace]
    allowed = [
        ["list", "asynctrainingruns.asyncrl.dev", *ns],
        ["patch", "asynctrainingruns.asyncrl.dev", "--subresource=status", *ns],
        ["create", "jobs.batch", *ns],
        ["delete", "jobs.batch", *ns],
        ["create", "deployments.apps", *ns],
        ["patch", "deployments.apps", *ns],
        ["list", "pods", *ns],
        ["get", "secrets", *ns],
        ["watch", "services", *ns],  # the operator's label-selected watches of its children
        ["watch", "configmaps", *ns],
        ["create", "events.events.k8s.io", *ns],
        ["watch", "customresourcedefinitions.apiextensions.k8s.io"],
    ]
    refused = [
        ["delete", "namespaces"],
        ["list", "namespaces"],
        ["get", "secrets", "-n", "default"],
        ["get", "secrets", "-n", "kube-system"],
        ["list", "secrets", *ns],  # get by name only: it cannot enumerate the namespace's Secrets
        ["watch", "secrets", *ns],
        ["update", "secrets", *ns],
        ["delete", "configmaps", *ns],
        ["create", "pods", *ns],
        ["delete", "pods", *ns],
        ["create", "pods/exec", *ns],
        ["delete", "deployments.apps", *ns],
        ["create", "deployments.apps", "-n", "default"],
        ["create", "jobs.batch", "-n", "default"],
        ["list", "asynctrainingruns.asyncrl.dev", "-n", "default"],
        ["create", "asynctrainingruns.asyncrl.dev", *ns],
        ["delete", "asynctrainingruns.asyncrl.dev", *ns],
        ["create", "roles.rbac.authorization.k8s.io", *ns],
        ["create", "rolebindings.rbac.authorization.k8s.io", *ns],
        ["create", "clusterrolebindings.rbac.authorization.k8s.io"],
        ["create", "serviceaccounts/token", *ns],
        ["get", "customresourcedefinitions.apiextensions.k8s.io"],
        ["delete", "customresourcedefinitions.apiextensions.k8s.io"],
        ["list", "nodes"],
    ]
    wrongly_refused = [args for args in allowed if not installed.can_i(kubectl_bin, *args)]
    wrongly_allowed = [args for args in refused if installed.can_i(kubectl_bin, *args)]
    assert wrongly_refused == []
    assert wrongly_allowed == []


def test_the_cluster_role_lets_an_all_namespaces_operator_run_a_run(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    install_rbac: Any,
    installed_crd: Path,
    tmp_path: Path,
) -> None:
    installed: Installed = install_rbac("clusterrole.yaml")
    kubectl_bin = kubectl[0]
    assert installed.can_i(kubectl_bin, "create", "jobs.batch", "-n", "default")
    for args in (
        ["delete", "namespaces"],
        ["list", "secrets", "-n", "default"],
        ["create", "pods", "-n", namespace],
        ["create", "clusterrolebindings.rbac.authorization.k8s.io"],
        ["update", "configmaps", "-n", namespace],
    ):
        assert not installed.can_i(kubectl_bin, *args), args
    operator = start_operator_process(
        kubeconfig=installed.kubeconfig,
        scope=["--all-namespaces"],
        log_path=tmp_path / "operator-cluster.log",
    )
    try:
        _a_run_succeeds_and_is_deleted(api_client, kubectl, namespace, operator)
    finally:
        operator.stop()
    assert not re.search(r"Not enough permissions", operator.log()), operator.log()[-3000:]
