"""Runs as users apply them, on the real control plane: every example, the GPU defaults, names at their
limits, bad resources, missing and oversized inputs, and how a run ends (conditions, a trainer that fails).

Real parts: kube-apiserver (CRD schema, CEL), the Job/GC controllers, the `asyncrl operator` process, the
gateway sidecar. Stand-ins: the pod runner for the kubelet (it advertises `nvidia.com/gpu`, so GPU pods are
scheduled), and `tests/operator/stub_trainer.py` for the trainer image.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.operator.reconciliation.ray_child import KUBERAY_MISSING
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for
from asyncrl.workloads import names
from tests.api.conftest import EXAMPLES
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    AGENT_TEMPLATE,
    TRAINER_IMAGE,
    apply_ok,
    apply_run,
    create_claim,
    events,
    kubectl_run,
    run_manifest,
    run_status,
    status_condition,
    trainer_job,
    wait_for_phase,
    wait_for_trainer_job,
    wait_for_trainer_stopped,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

EXAMPLE_FILES = sorted(path.name for path in EXAMPLES.glob("*.yaml") if "invalid" not in path.name)
MULTI_NODE_EXAMPLES = [
    name
    for name in EXAMPLE_FILES
    if yaml.safe_load((EXAMPLES / name).read_text())["spec"]["trainer"].get("nodes")
]


@pytest.mark.parametrize("example", EXAMPLE_FILES)
def test_every_example_gets_its_trainer_job_with_its_gpus(
    example: str,
    api_client: Any,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    """`kubectl apply -f examples/<file>` exactly as a user runs it; the GPU run gets its GPU trainer Job.

    A multi-node example on this control plane, which has no KubeRay, fails once saying what to install
    (test_kuberay_controlplane.py applies it where KubeRay runs)."""
    start_operator()
    manifest = yaml.safe_load((EXAMPLES / example).read_text())
    name = manifest["metadata"]["name"]
    if example in MULTI_NODE_EXAMPLES:  # its checkpoint claim first, as its comment says
        create_claim(api_client, namespace, manifest["spec"]["trainer"]["checkpoint"]["claimName"])
    applied = kubectl_run(kubectl, "apply", "-n", namespace, "-f", str(EXAMPLES / example))
    assert applied.returncode == 0, applied.stderr
    if example in MULTI_NODE_EXAMPLES:
        status = wait_for_phase(api_client, namespace, name, "Failed", timeout=90, what="the run Failed")
        assert status["message"] == KUBERAY_MISSING
        assert trainer_job(api_client, namespace, name) is None
        return
    job = wait_for_trainer_job(api_client, namespace, name, timeout=90, what="the trainer Job")
    (trainer,) = job.spec.template.spec.containers
    gpus = int(manifest["spec"].get("trainer", {}).get("gpus", 1))
    limits = (trainer.resources.limits or {}) if trainer.resources else {}
    if gpus:
        assert limits["nvidia.com/gpu"] == str(gpus)
        assert trainer.resources.requests["nvidia.com/gpu"] == str(gpus)
    else:
        assert "nvidia.com/gpu" not in limits
    assert events(kubectl, namespace, reason="ReconcileError") == []


def test_a_run_with_the_default_gpu_trainer_trains_to_completion(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    """The defaults as a user gets them (`gpus` unset: 1 GPU) and quantities in the user's resources."""
    start_operator()
    manifest = run_manifest("gpu-default", totalSteps=1)
    manifest["spec"]["trainer"] = {
        "image": TRAINER_IMAGE,
        "resources": {"limits": {"memory": "2Gi", "cpu": 2}, "requests": {"cpu": "500m"}},
    }
    apply_ok(kubectl, namespace, manifest)
    job = wait_for_trainer_job(api_client, namespace, "gpu-default", timeout=90, what="the Job")
    (trainer,) = job.spec.template.spec.containers
    assert trainer.resources.limits == {"nvidia.com/gpu": "1", "memory": "2Gi", "cpu": "2"}
    assert trainer.resources.requests == {"nvidia.com/gpu": "1", "cpu": "500m"}
    wait_for_phase(
        api_client, namespace, "gpu-default", "Succeeded", timeout=180, what="the GPU run to succeed"
    )
    waited = kubectl_run(
        kubectl, "wait", "-n", namespace, "atr/gpu-default", "--for=condition=Complete", "--timeout=30s"
    )
    assert waited.returncode == 0, waited.stderr
    status = run_status(api_client, namespace, "gpu-default")
    failed = status_condition(status, "Failed")
    assert failed is not None
    assert failed["status"] == "False"


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("r" * 64, "64 characters: over the 63 of a label value"),
        ("my.run", "a dot: not a Service name"),
        ("9lives", "a leading digit: not a Service name"),
    ],
)
def test_names_that_cannot_name_the_children_are_refused_at_admission(
    name: str, why: str, namespace: str, kubectl: list[str], installed_crd: Path
) -> None:
    result = apply_run(kubectl, namespace, run_manifest(name))
    assert result.returncode != 0, why
    assert "metadata.name must be at most 63 characters" in result.stderr, result.stderr


def test_a_name_at_the_length_limit_gets_all_its_children(
    api_client: Any, namespace: str, kubectl: list[str], start_operator: OperatorStarter
) -> None:
    from kubernetes import client

    start_operator()
    name = "a" * 63
    apply_ok(kubectl, namespace, run_manifest(name))
    wait_for_trainer_job(api_client, namespace, name, timeout=90, what="the trainer Job")
    core = client.CoreV1Api(api_client)
    service = core.read_namespaced_service(names.gateway_service_name(name), namespace)
    assert len(service.metadata.name) <= 63


def test_resources_that_are_not_quantities_are_refused_at_admission(
    namespace: str, kubectl: list[str], installed_crd: Path
) -> None:
    manifest = run_manifest("bad-resources")
    manifest["spec"]["trainer"]["resources"] = {"limits": {"memory": "lots"}}
    result = apply_run(kubectl, namespace, manifest)
    assert result.returncode != 0
    assert "spec.trainer.resources.limits.memory" in result.stderr, result.stderr


def test_a_missing_template_config_map_is_reported_and_picked_up_once_created(
    api_client: Any, namespace: str, kubectl: list[str], start_operator: OperatorStarter
) -> None:
    from kubernetes import client

    start_operator()
    manifest = run_manifest("later-template")
    manifest["spec"]["agents"]["template"] = {"configMapRef": {"name": "agent-template", "key": "job.j2"}}
    apply_ok(kubectl, namespace, manifest)
    status = wait_for(
        lambda: (s := run_status(api_client, namespace, "later-template")).get("message") and s,
        timeout=60,
        what="a status message",
    )
    assert status["phase"] == "Pending"
    assert 'configmaps "agent-template" not found' in status["message"]
    reconcile_errors = events(kubectl, namespace, reason="ReconcileError")
    assert reconcile_errors
    assert all("\n" not in e["note"] and "HTTP response headers" not in e["note"] for e in reconcile_errors)
    client.CoreV1Api(api_client).create_namespaced_config_map(
        namespace, {"metadata": {"name": "agent-template"}, "data": {"job.j2": AGENT_TEMPLATE}}
    )
    wait_for_trainer_job(api_client, namespace, "later-template", timeout=90, what="the Job")


def test_inline_data_too_large_for_a_config_map_fails_the_run_with_advice(
    api_client: Any, namespace: str, kubectl: list[str], start_operator: OperatorStarter
) -> None:
    from kubernetes import client

    start_operator()
    manifest = run_manifest("big-data")
    manifest["spec"]["data"]["inline"] = [{"question": "x" * 1000, "index": i} for i in range(1100)]
    # `create`, not `apply`: apply's last-applied annotation could not hold a 1 MiB spec.
    created = kubectl_run(kubectl, "create", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))
    assert created.returncode == 0, created.stderr
    status = wait_for_phase(api_client, namespace, "big-data", "Failed", timeout=60, what="the run to fail")
    assert "spec.data.configMapRef" in status["message"]
    assert client.BatchV1Api(api_client).list_namespaced_job(namespace).items == []


def test_a_trainer_configuration_error_fails_the_run_and_the_trainer_is_stopped(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    start_operator()
    executions = tmp_path / "trainer-executions"
    manifest = run_manifest("bad-config", totalSteps=3)
    manifest["spec"]["model"]["path"] = f"stub-fail:config_error:{executions}"
    apply_ok(kubectl, namespace, manifest)
    status = wait_for_phase(
        api_client, namespace, "bad-config", "Failed", timeout=120, what="the run to fail"
    )
    assert "configuration error" in status["message"]
    assert "stub config_error" in status["message"]
    failed = status_condition(status, "Failed")
    assert failed is not None
    assert failed["status"] == "True"
    waited = kubectl_run(
        kubectl, "wait", "-n", namespace, "atr/bad-config", "--for=condition=Failed", "--timeout=30s"
    )
    assert waited.returncode == 0, waited.stderr

    # Not restarted: the Job is suspended and its pod goes; the pod runner restarts a container after 1 s
    # (a kubelet after 10 s), so at most one restart can slip in before the operator's reaction.
    wait_for_trainer_stopped(
        api_client,
        namespace,
        "bad-config",
        timeout=90,
        what="the trainer Job to be suspended and its pod gone",
    )
    assert 1 <= len(executions.read_text().splitlines()) <= 2
