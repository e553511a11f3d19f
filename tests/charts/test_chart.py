"""The Helm chart `charts/asyncrl-operator`: lint, rendering, and a real install on the local control plane.

Real parts: helm v3 (the provisioned binary), kube-apiserver (server-side dry-run and the install), RBAC. The
local plane has no Deployment controller, so the chart's Deployment never gets a pod by itself; the install
test therefore creates one pod from the Deployment's own pod template, as its ReplicaSet would, and the pod
runner runs it with the operator image mapped to the local `asyncrl operator` (kept: the chart's args; the
stand-in: the identity comes from a TokenRequest token of the chart's ServiceAccount in a kubeconfig, as no
kubelet mounts one). That operator must serve its liveness and metrics endpoints and take a run to Succeeded
under the chart's RBAC; then `helm uninstall` removes what the chart made and keeps the CRD.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.agent_templates.pod_policy import AgentPodPolicy
from asyncrl.api.crd import default_path
from asyncrl.api.types.meta import CRD_NAME
from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.operator.main import add_arguments, render_settings
from asyncrl.testing.controlplane import ControlPlane, free_port
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for
from tests.operator.test_rbac import RBAC_DIR, rbac_denials, service_account_kubeconfig
from tests.support.kube import AGENT_IMAGE, GATEWAY_IMAGE, TRAINER_IMAGE, find_run, run_manifest

pytestmark = pytest.mark.controlplane

CHART = Path(__file__).resolve().parents[2] / "charts" / "asyncrl-operator"
KUBE_VERSION = "1.36.3"  # `helm template` assumes v1.20 when built without version stamps, below kubeVersion
OPERATOR_IMAGE = "asyncrl.test/operator"
Manifest = dict[str, Any]


def _helm(
    helm: list[str], env: dict[str, str], *args: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*helm, *args], capture_output=True, text=True, env=env, timeout=120, check=False)
    if check:
        assert done.returncode == 0, f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done


def _values(**values: Any) -> list[str]:
    return [f"--set-json={key}={json.dumps(value)}" for key, value in values.items()]


def render(helm: list[str], env: dict[str, str], namespace: str = "asyncrl-system", **values: Any) -> str:
    args = ["template", "asyncrl", str(CHART), "--namespace", namespace, f"--kube-version={KUBE_VERSION}"]
    return _helm(helm, env, *args, *_values(**values)).stdout


def documents(rendered: str) -> list[Manifest]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def one(docs: list[Manifest], kind: str) -> Manifest:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, (kind, [doc["kind"] for doc in docs])
    return found[0]


def rbac_rules(path: Path, kind: str) -> list[list[Manifest]]:
    return [doc["rules"] for doc in yaml.safe_load_all(path.read_text()) if doc and doc["kind"] == kind]


LEASE_ROLE_SUFFIX = "-leader-election"


def for_runs(docs: list[Manifest]) -> list[Manifest]:
    """The documents without the leader election's Role and RoleBinding (those of the runs' namespaces)."""
    return [doc for doc in docs if not doc["metadata"]["name"].endswith(LEASE_ROLE_SUFFIX)]


def for_the_lease(docs: list[Manifest]) -> list[Manifest]:
    return [doc for doc in docs if doc["metadata"]["name"].endswith(LEASE_ROLE_SUFFIX)]


# -- lint and files ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"watch.clusterWide": True, "serviceMonitor.enabled": True},
        {"watch.namespaces": ["a", "b"]},
        {
            "runServiceMonitor.enabled": True,
            "prometheusRule.enabled": True,
            "grafanaDashboard.enabled": True,
        },
    ],
    ids=["default", "cluster-wide-with-service-monitor", "two-namespaces", "monitoring"],
)
def test_helm_lint_strict_reports_no_warning(helm: list[str], helm_env: dict[str, str], values: Any) -> None:
    done = _helm(helm, helm_env, "lint", "--strict", str(CHART), *_values(**values))
    assert "[WARNING]" not in done.stdout, done.stdout
    assert "[ERROR]" not in done.stdout, done.stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


def test_the_charts_crd_is_the_committed_crd_byte_for_byte() -> None:
    chart_crds = sorted((CHART / "crds").iterdir())
    assert [path.name for path in chart_crds] == [default_path().name]
    assert chart_crds[0].read_bytes() == default_path().read_bytes(), (
        "charts/asyncrl-operator/crds/ differs from crds/: copy the regenerated CRD into the chart"
    )


def test_the_charts_rbac_rules_are_those_of_operator_rbac(helm: list[str], helm_env: dict[str, str]) -> None:
    namespaced = for_runs(documents(render(helm, helm_env)))
    assert [one(namespaced, "Role")["rules"]] == rbac_rules(RBAC_DIR / "role.yaml", "Role")
    assert [one(namespaced, "ClusterRole")["rules"]] == rbac_rules(RBAC_DIR / "role.yaml", "ClusterRole")
    cluster_wide = documents(render(helm, helm_env, **{"watch.clusterWide": True}))
    assert [one(cluster_wide, "ClusterRole")["rules"]] == rbac_rules(
        RBAC_DIR / "clusterrole.yaml", "ClusterRole"
    )
    # The Lease's Role, in the release namespace whatever is watched.
    for values in ({}, {"watch.clusterWide": True}):
        lease_role = one(for_the_lease(documents(render(helm, helm_env, **values))), "Role")
        assert [lease_role["rules"]] == rbac_rules(RBAC_DIR / "leader-election.yaml", "Role")


def test_kuberay_rules_are_rendered_only_when_enabled_and_are_those_of_operator_rbac(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    base = rbac_rules(RBAC_DIR / "role.yaml", "Role")[0]
    (extra,) = rbac_rules(RBAC_DIR / "kuberay.yaml", "Role")
    default = for_runs(documents(render(helm, helm_env)))
    assert one(default, "Role")["rules"] == base
    assert not [rule for rule in one(default, "Role")["rules"] if "ray.io" in rule["apiGroups"]]
    enabled = for_runs(documents(render(helm, helm_env, **{"kuberay.enabled": True})))
    assert one(enabled, "Role")["rules"] == base + extra
    cluster_wide = documents(render(helm, helm_env, **{"kuberay.enabled": True, "watch.clusterWide": True}))
    assert all(rule in one(cluster_wide, "ClusterRole")["rules"] for rule in extra)


# -- rendering --------------------------------------------------------------------------------------------


def test_default_values_render_a_hardened_elected_operator_for_the_release_namespace(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    all_docs = documents(render(helm, helm_env, namespace="ml"))
    kinds = sorted(doc["kind"] for doc in all_docs)
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    docs = for_runs(all_docs)
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    # Elected even alone: an upgrade's new pod stands by (Ready) until the old one releases the Lease.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    assert container["image"] == "ghcr.io/asyncrl/operator:0.1.0"
    assert container["command"] == ["asyncrl", "operator"]
    assert container["args"] == [
        "--namespace=ml",
        "--health-port=8080",
        "--metrics-port=9090",
        "--log-level=info",
        "--agent-pod-policy=restricted",
        "--leader-elect",
        "--leader-election-lease=asyncrl-asyncrl-operator",
    ]
    downward = {
        variable["name"]: variable["valueFrom"]["fieldRef"]["fieldPath"]
        for variable in container["env"]
        if "valueFrom" in variable
    }
    assert downward == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert {port["name"]: port["containerPort"] for port in container["ports"]} == {
        "health": 8080,
        "metrics": 9090,
    }
    assert container["resources"]["requests"]
    assert container["resources"]["limits"]["memory"]
    service = one(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    role, binding = one(docs, "Role"), one(docs, "RoleBinding")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "ml"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": "ml"}
    ]
    lease_role, lease_binding = (
        one(for_the_lease(all_docs), "Role"),
        one(for_the_lease(all_docs), "RoleBinding"),
    )
    assert lease_role["metadata"]["namespace"] == lease_binding["metadata"]["namespace"] == "ml"
    assert lease_binding["roleRef"]["name"] == lease_role["metadata"]["name"]
    assert lease_binding["subjects"] == binding["subjects"]
    # The namespaced install's only cluster-wide grant is reading CRDs.
    assert one(docs, "ClusterRole")["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "verbs": ["list", "watch"],
        }
    ]


def test_cluster_wide_values_render_all_namespaces_and_a_cluster_role(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    all_docs = documents(render(helm, helm_env, namespace="ml", **{"watch.clusterWide": True}))
    docs = for_runs(all_docs)
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Service", "ServiceAccount"]
    # The Lease is namespaced: a Role in the release namespace, no cluster-wide grant on leases.
    assert [(doc["kind"], doc["metadata"]["namespace"]) for doc in for_the_lease(all_docs)] == [
        ("Role", "ml"),
        ("RoleBinding", "ml"),
    ]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[0] == "--all-namespaces"
    assert not any(arg.startswith("--namespace") for arg in args)
    assert one(docs, "ClusterRoleBinding")["roleRef"]["name"] == one(docs, "ClusterRole")["metadata"]["name"]


def test_watch_namespaces_render_one_role_per_namespace(helm: list[str], helm_env: dict[str, str]) -> None:
    docs = for_runs(documents(render(helm, helm_env, **{"watch.namespaces": ["team-a", "team-b"]})))
    roles = sorted(doc["metadata"]["namespace"] for doc in docs if doc["kind"] == "Role")
    bindings = sorted(doc["metadata"]["namespace"] for doc in docs if doc["kind"] == "RoleBinding")
    assert roles == bindings == ["team-a", "team-b"]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--namespace=team-a", "--namespace=team-b"]


def test_a_service_monitor_is_rendered_only_when_enabled(helm: list[str], helm_env: dict[str, str]) -> None:
    for values in ({}, {"watch.clusterWide": True}):
        assert "kind: ServiceMonitor" not in render(helm, helm_env, **values)
    docs = documents(
        render(
            helm, helm_env, **{"serviceMonitor.enabled": True, "serviceMonitor.labels": {"release": "prom"}}
        )
    )
    monitor = one(docs, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items()
        <= one(docs, "Service")["metadata"]["labels"].items()
    )


# -- agent pod policy -------------------------------------------------------------------------------------


def _operator_args(rendered: str) -> list[str]:
    deployment = one(documents(rendered), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    return args


def test_agent_pods_are_restricted_by_default(helm: list[str], helm_env: dict[str, str]) -> None:
    args = _operator_args(render(helm, helm_env))
    assert [arg for arg in args if arg.startswith("--agent-pod-policy")] == ["--agent-pod-policy=restricted"]


def test_the_policy_can_be_lifted_explicitly(helm: list[str], helm_env: dict[str, str]) -> None:
    args = _operator_args(render(helm, helm_env, agentPodPolicy="unrestricted"))
    assert "--agent-pod-policy=unrestricted" in args
    assert "--agent-pod-policy=restricted" not in args


def test_an_unknown_policy_is_rejected_by_the_schema(helm: list[str], helm_env: dict[str, str]) -> None:
    args = ["template", "asyncrl", str(CHART), f"--kube-version={KUBE_VERSION}"]
    done = _helm(helm, helm_env, *args, *_values(agentPodPolicy="off"), check=False)
    assert done.returncode != 0
    assert "agentPodPolicy" in done.stderr


def test_the_operator_accepts_the_charts_policy_flag() -> None:
    """The flag the chart passes is one `asyncrl operator` parses (a rename would break every install)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert render_settings(parser.parse_args([])).policy is AgentPodPolicy.RESTRICTED
    parsed = parser.parse_args(["--agent-pod-policy=unrestricted", "--template-render-seconds=2"])
    assert render_settings(parsed).policy is AgentPodPolicy.UNRESTRICTED
    assert render_settings(parsed).timeout_seconds == 2.0
    with pytest.raises(SystemExit):
        parser.parse_args(["--agent-pod-policy=off"])


def test_values_are_checked_against_the_schema(helm: list[str], helm_env: dict[str, str]) -> None:
    args = ["template", "asyncrl", str(CHART), f"--kube-version={KUBE_VERSION}"]
    typo = _helm(helm, helm_env, *args, *_values(**{"watch.clusterwide": True}), check=False)
    assert typo.returncode != 0
    assert "clusterwide" in typo.stderr
    bad_level = _helm(helm, helm_env, *args, *_values(logLevel="verbose"), check=False)
    assert bad_level.returncode != 0
    assert "logLevel" in bad_level.stderr
    orphan_monitor = _helm(
        helm,
        helm_env,
        *args,
        *_values(**{"serviceMonitor.enabled": True, "metrics.enabled": False}),
        check=False,
    )
    assert orphan_monitor.returncode != 0
    assert "serviceMonitor.enabled needs metrics.enabled" in orphan_monitor.stderr


def test_two_or_more_replicas_render_elected_replicas_and_negative_ones_are_refused(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    args = ["template", "asyncrl", str(CHART), f"--kube-version={KUBE_VERSION}"]
    for replicas in (2, 3):
        deployment = one(documents(render(helm, helm_env, replicas=replicas)), "Deployment")
        assert deployment["spec"]["replicas"] == replicas
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert "--leader-elect" in container["args"]
    negative = _helm(helm, helm_env, *args, *_values(replicas=-1), check=False)
    assert negative.returncode != 0
    assert "replicas" in negative.stderr
    stopped = one(documents(render(helm, helm_env, replicas=0)), "Deployment")
    assert stopped["spec"]["replicas"] == 0


def test_security_contexts_and_env_are_values_merged_into_the_restricted_defaults(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    args = ["template", "asyncrl", str(CHART), f"--kube-version={KUBE_VERSION}"]
    docs = documents(
        _helm(
            helm,
            helm_env,
            *args,
            *_values(
                **{
                    "podSecurityContext.fsGroup": 2000,
                    "securityContext.readOnlyRootFilesystem": None,
                    "env": [
                        {"name": "HTTPS_PROXY", "value": "http://proxy:3128"},
                        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                    ],
                }
            ),
        ).stdout
    )
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "fsGroup": 2000,
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = pod["containers"]
    assert "readOnlyRootFilesystem" not in container["securityContext"]  # null drops a default
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert [variable["name"] for variable in container["env"]] == [
        "PYTHONUNBUFFERED",
        "POD_NAME",
        "POD_NAMESPACE",
        "HTTPS_PROXY",
        "TOKEN",
    ]
    assert container["env"][4]["valueFrom"] == {"secretKeyRef": {"name": "s", "key": "k"}}


def test_an_env_entry_without_a_name_is_rejected_by_the_schema(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    args = ["template", "asyncrl", str(CHART), f"--kube-version={KUBE_VERSION}"]
    nameless = _helm(helm, helm_env, *args, *_values(env=[{"value": "1"}]), check=False)
    assert nameless.returncode != 0
    assert "/env/0" in nameless.stderr
    assert "name" in nameless.stderr


# -- against the control plane ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [{}, {"watch.clusterWide": True}, {"metrics.enabled": False, "rbac.create": True}],
    ids=["default", "cluster-wide", "no-metrics"],
)
def test_rendered_chart_passes_a_server_side_dry_run(
    helm: list[str], helm_env: dict[str, str], kubectl: list[str], namespace: str, values: Any
) -> None:
    """The API server validates every object and the CRD, storing nothing (the ServiceMonitor CRD is absent
    here, so none is rendered)."""
    rendered = _helm(
        helm,
        helm_env,
        "template",
        "asyncrl",
        str(CHART),
        "--namespace",
        namespace,
        f"--kube-version={KUBE_VERSION}",
        "--include-crds",
        *_values(**values),
    ).stdout
    assert "kind: ServiceMonitor" not in rendered
    done = subprocess.run(
        [*kubectl, "apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", "-"],
        input=rendered,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    applied = done.stdout.splitlines()
    assert any(line.startswith("deployment.apps/") for line in applied), applied
    assert any(
        line.startswith(f"customresourcedefinition.apiextensions.k8s.io/{CRD_NAME}") for line in applied
    )
    assert all(line.endswith("(server dry run)") for line in applied), applied


@pytest.fixture
def release(
    helm: list[str], helm_env: dict[str, str], control_plane: ControlPlane, namespace: str
) -> Iterator[str]:
    """The name of a release installed in the test's namespace by the test; uninstalled afterwards if left."""
    name = "asyncrl-operator"  # the chart's objects are then named asyncrl-operator, as in operator/rbac
    yield name
    _helm(
        helm,
        helm_env,
        "uninstall",
        name,
        "--namespace",
        namespace,
        f"--kubeconfig={control_plane.kubeconfig}",
        "--ignore-not-found",
        check=False,
    )


@pytest.fixture
def identity_dir() -> Iterator[Path]:
    cache = Path(os.environ.get("ASYNCRL_CACHE_DIR", Path.home() / ".cache" / "asyncrl"))
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="test-identity-", dir=cache) as folder:
        yield Path(folder)


def _read(api_client: Any, kind: str, name: str, namespace: str | None) -> Any | None:
    from kubernetes import client

    readers = {
        "Deployment": lambda: client.AppsV1Api(api_client).read_namespaced_deployment(name, namespace),
        "ServiceAccount": lambda: client.CoreV1Api(api_client).read_namespaced_service_account(
            name, namespace
        ),
        "Service": lambda: client.CoreV1Api(api_client).read_namespaced_service(name, namespace),
        "Role": lambda: client.RbacAuthorizationV1Api(api_client).read_namespaced_role(name, namespace),
        "RoleBinding": lambda: client.RbacAuthorizationV1Api(api_client).read_namespaced_role_binding(
            name, namespace
        ),
        "ClusterRole": lambda: client.RbacAuthorizationV1Api(api_client).read_cluster_role(name),
        "ClusterRoleBinding": lambda: client.RbacAuthorizationV1Api(api_client).read_cluster_role_binding(
            name
        ),
        "CustomResourceDefinition": lambda: client.ApiextensionsV1Api(
            api_client
        ).read_custom_resource_definition(name),
    }
    try:
        return readers[kind]()
    except client.exceptions.ApiException as error:
        if error.status == 404:
            return None
        raise


def _get_url(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body.decode()


def _run_phase(api_client: Any, namespace: str, name: str) -> str | None:
    run = find_run(api_client, namespace, name)
    if run is None:
        return "Deleted"
    phase: str | None = (run.get("status") or {}).get("phase")
    return phase


@pytest.mark.slow
def test_helm_install_runs_the_operator_with_the_charts_rbac_and_uninstall_keeps_the_crd(
    helm: list[str],
    helm_env: dict[str, str],
    control_plane: ControlPlane,
    api_client: Any,
    kubectl: list[str],
    pod_runner: PodRunner,
    image_table: ImageTable,
    namespace: str,
    release: str,
    identity_dir: Path,
) -> None:
    from kubernetes import client

    health_port, metrics_port = free_port(), free_port()
    _helm(
        helm,
        helm_env,
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        f"--kubeconfig={control_plane.kubeconfig}",
        *_values(
            **{
                "image.repository": OPERATOR_IMAGE,
                "image.tag": "test",
                "health.port": health_port,
                "metrics.port": metrics_port,
                # The local plane has no cluster DNS: reach each run's gateway on loopback.
                "extraArgs": ["--gateway-address=localhost"],
            }
        ),
    )
    kubeconfig_flag = f"--kubeconfig={control_plane.kubeconfig}"
    manifest = _helm(
        helm, helm_env, "get", "manifest", release, "--namespace", namespace, kubeconfig_flag
    ).stdout
    objects = [
        (doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace"))
        for doc in documents(manifest)
    ]
    assert sorted(kind for kind, _, _ in objects) == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "Service",
        "ServiceAccount",
    ]
    for kind, name, object_namespace in objects:
        assert _read(api_client, kind, name, object_namespace) is not None, (kind, name)
    assert _read(api_client, "CustomResourceDefinition", CRD_NAME, None) is not None

    # What the Deployment's ReplicaSet would create: a pod from its template, run by the pod runner.
    deployment = next(doc for doc in documents(manifest) if doc["kind"] == "Deployment")
    service_account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    # The pod runner maps container paths under the pod's /tmp emptyDir, so the kubeconfig (the stand-in for
    # a kubelet-mounted token) lives outside /tmp.
    kubeconfig = service_account_kubeconfig(
        api_client, control_plane, namespace=namespace, name=service_account, path=identity_dir / "kubeconfig"
    )
    image_table[f"{OPERATOR_IMAGE}:test"] = Image(
        entrypoint=(sys.executable, "-m", "asyncrl.cli", "operator"),
        env={"KUBECONFIG": str(kubeconfig)},
        replace_command=True,
    )
    image_table[GATEWAY_IMAGE] = Image()
    image_table[TRAINER_IMAGE] = Image(
        entrypoint=(sys.executable, "-m", "tests.operator.stub_trainer"), replace_command=True
    )
    image_table[AGENT_IMAGE] = Image(entrypoint=(sys.executable,))
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **deployment["spec"]["template"]["metadata"],
            "name": "operator",
            "namespace": namespace,
        },
        "spec": deployment["spec"]["template"]["spec"],
    }
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, pod)

    def running() -> bool:
        phase = core.read_namespaced_pod("operator", namespace).status.phase
        assert phase in ("Pending", "Running"), pod_runner.log_path(
            namespace, "operator", "operator"
        ).read_text()
        return bool(phase == "Running")

    wait_for(running, timeout=60, what="the operator pod to run")
    log_path = pod_runner.log_path(namespace, "operator", "operator")
    try:
        # Generous: on a fresh, busy CI machine the operator's first start has been seen to take over 60 s.
        wait_for(
            lambda: _try(lambda: _get_url(f"http://127.0.0.1:{health_port}/healthz")),
            timeout=180,
            what="/healthz",
        )
        # Ready: the chart's RBAC grants every permission the operator's review asks the API server about.
        wait_for(
            lambda: _try(lambda: _get_url(f"http://127.0.0.1:{health_port}/readyz")),
            timeout=120,
            what="/readyz 200 under the chart's RBAC",
        )
    except AssertionError as error:
        raise AssertionError(f"{error}\noperator pod log:\n{log_path.read_text()[-4000:]}") from error
    done = subprocess.run(
        [*kubectl, "apply", "-n", namespace, "-f", "-"],
        input=json.dumps(run_manifest("charted", totalSteps=1)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    try:
        wait_for(
            lambda: _run_phase(api_client, namespace, "charted") == "Succeeded",
            timeout=180,
            what="the run to succeed under the chart's operator",
        )
    except AssertionError:
        print(log_path.read_text()[-6000:])
        raise
    metrics = _get_url(f"http://127.0.0.1:{metrics_port}/metrics")
    assert "asyncrl_operator_status_writes_total" in metrics
    # Elected under the chart's Lease Role: the pod's name (downward API) holds the release's Lease.
    assert "asyncrl_operator_leader 1.0" in metrics
    assert json.loads(_get_url(f"http://127.0.0.1:{health_port}/readyz"))["leading"] is True
    lease = client.CoordinationV1Api(api_client).read_namespaced_lease(release, namespace)
    assert lease.spec.holder_identity == "operator"
    assert service_account == "asyncrl-operator"
    assert rbac_denials(log_path.read_text(), namespace=namespace, service_account=service_account) == []
    subprocess.run([*kubectl, "delete", "atr", "charted", "-n", namespace, "--wait=false"], check=True)
    wait_for(
        lambda: _run_phase(api_client, namespace, "charted") == "Deleted", timeout=60, what="run deletion"
    )
    core.delete_namespaced_pod("operator", namespace, grace_period_seconds=0)

    _helm(helm, helm_env, "uninstall", release, "--namespace", namespace, "--wait", kubeconfig_flag)
    for kind, name, object_namespace in objects:
        assert _read(api_client, kind, name, object_namespace) is None, (kind, name)
    assert _read(api_client, "CustomResourceDefinition", CRD_NAME, None) is not None, "Helm keeps crds/"


def _try(probe: Any) -> Any:
    try:
        return probe()
    except OSError:
        return None
