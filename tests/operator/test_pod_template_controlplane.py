"""The trainer pod template on the real API server: Pod Security `restricted`, refusals, invalid templates.

Real parts: kube-apiserver with its PodSecurity admission (on by default; the pods the Job controller creates
are checked against the namespace's `pod-security.kubernetes.io/enforce` label), the Job controller, the
`asyncrl operator` process, the gateway sidecar. Stand-ins: the pod runner for the kubelet and the stub
trainer for the trainer image.
"""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import WaitTimeout, wait_for
from asyncrl.workloads import names
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    AGENT_TEMPLATE,
    apply_ok,
    run_manifest,
    run_status,
    status_condition,
    wait_for_phase,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

ENFORCE_RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}
# The agents must meet `restricted` too in such a namespace: the template says so itself.
RESTRICTED_AGENT_TEMPLATE = AGENT_TEMPLATE.replace(
    "      - name: agent\n",
    "      - name: agent\n"
    "        securityContext:\n"
    "          runAsNonRoot: true\n"
    "          allowPrivilegeEscalation: false\n"
    "          capabilities: {drop: [ALL]}\n"
    "          seccompProfile: {type: RuntimeDefault}\n",
)


def _label_namespace(api_client: Any, namespace: str, labels: dict[str, str]) -> None:
    from kubernetes import client

    client.CoreV1Api(api_client).patch_namespace(namespace, {"metadata": {"labels": labels}})


def _events(api_client: Any, namespace: str, *, kind: str, name: str) -> list[dict[str, Any]]:
    """Events about one object, core and events.k8s.io alike (the Job controller and the operator differ)."""
    from kubernetes import client

    found = []
    for event in client.CoreV1Api(api_client).list_namespaced_event(namespace).items:
        if event.involved_object.kind == kind and event.involved_object.name == name:
            found.append({"reason": event.reason, "message": event.message or "", "type": event.type})
    return found


def _trainer_pods(api_client: Any, namespace: str, run: str) -> list[Any]:
    from kubernetes import client

    selector = f"{names.LABEL_RUN}={run},{names.LABEL_COMPONENT}={names.COMPONENT_TRAINER}"
    pods: list[Any] = (
        client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=selector).items
    )
    return pods


def test_a_run_starts_and_finishes_in_a_namespace_that_enforces_restricted(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    """No securityContext in the manifest: the operator's defaults are what PodSecurity admits."""
    _label_namespace(api_client, namespace, ENFORCE_RESTRICTED)
    start_operator()
    apply_ok(kubectl, namespace, run_manifest("strict", template=RESTRICTED_AGENT_TEMPLATE, totalSteps=1))
    (pod,) = wait_for(
        lambda: _trainer_pods(api_client, namespace, "strict"), timeout=90, what="the trainer pod"
    )
    for container in [*pod.spec.init_containers, *pod.spec.containers]:
        context = container.security_context
        assert context.run_as_non_root is True
        assert context.allow_privilege_escalation is False
        assert context.capabilities.drop == ["ALL"]
        assert context.seccomp_profile.type == "RuntimeDefault"
    wait_for_phase(
        api_client,
        namespace,
        "strict",
        "Succeeded",
        timeout=180,
        what="the run to succeed in the restricted namespace",
    )
    job_events = _events(api_client, namespace, kind="Job", name=names.trainer_job_name("strict"))
    assert [e for e in job_events if e["reason"] == "FailedCreate"] == []
    applied = status_condition(run_status(api_client, namespace, "strict"), "PodTemplateApplied")
    assert applied is not None
    assert (applied["status"], applied["reason"]) == ("True", "Applied")


def test_a_template_that_breaks_restricted_is_named_on_the_run(
    api_client: Any, namespace: str, kubectl: list[str], start_operator: OperatorStarter
) -> None:
    """The API server's own words reach the run: a Warning event and the condition, one line each."""
    _label_namespace(api_client, namespace, ENFORCE_RESTRICTED)
    start_operator()
    manifest = run_manifest(
        "escalates",
        trainer={
            "backend": "Reference",
            "gpus": 0,
            "podTemplate": {"trainerContainer": {"securityContext": {"allowPrivilegeEscalation": True}}},
        },
    )
    apply_ok(kubectl, namespace, manifest)

    def reported() -> dict[str, Any] | None:
        condition = status_condition(run_status(api_client, namespace, "escalates"), "PodTemplateApplied")
        return condition if condition and condition["status"] == "False" else None

    condition = wait_for(reported, timeout=90, what="the PodTemplateApplied condition")
    assert condition["reason"] == "ApiServerWarning"
    assert 'would violate PodSecurity "restricted:latest"' in condition["message"]
    assert (
        'container "trainer" must set securityContext.allowPrivilegeEscalation=false' in condition["message"]
    )
    assert "gateway" not in condition["message"].split("FailedCreate")[0]  # only the user's change breaks it
    assert "\n" not in condition["message"]
    run_events = _events(api_client, namespace, kind="AsyncTrainingRun", name="escalates")
    warned = [e for e in run_events if e["reason"] == "PodTemplateApiServerWarning"]
    assert len(warned) == 1
    assert warned[0]["type"] == "Warning"
    # And the refusal it warned of: the Job controller cannot create the pod.
    failed_create = wait_for(
        lambda: [
            e
            for e in _events(api_client, namespace, kind="Job", name=names.trainer_job_name("escalates"))
            if e["reason"] == "FailedCreate"
        ],
        timeout=60,
        what="the Job's FailedCreate event",
    )
    assert 'violates PodSecurity "restricted:latest"' in failed_create[0]["message"]
    assert _trainer_pods(api_client, namespace, "escalates") == []


def test_fields_the_operator_owns_are_refused_on_the_run_and_the_rest_applied(
    api_client: Any, namespace: str, kubectl: list[str], start_operator: OperatorStarter
) -> None:
    from kubernetes import client

    start_operator()
    pod_template = {
        "metadata": {"labels": {names.LABEL_RUN: "hijack", "team": "rl"}},
        "volumes": [{"name": "config", "emptyDir": {}}, {"name": "scratch", "emptyDir": {}}],
        "trainerContainer": {
            "env": [{"name": "ASYNCRL_GATEWAY_KEY", "value": "guess"}],
            "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
        },
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    manifest = run_manifest("owned", trainer={"backend": "Reference", "gpus": 0, "podTemplate": pod_template})
    apply_ok(kubectl, namespace, manifest)
    condition = wait_for(
        lambda: status_condition(run_status(api_client, namespace, "owned"), "PodTemplateApplied"),
        timeout=90,
        what="the PodTemplateApplied condition",
    )
    assert (condition["status"], condition["reason"]) == ("False", "FieldsRefused")
    assert condition["message"] == (
        "spec.trainer.podTemplate: the operator keeps its own value of metadata.labels[asyncrl.dev/run], "
        "volumes[name=config], trainerContainer.env[name=ASYNCRL_GATEWAY_KEY] (fields it sets for the run); "
        "rename or remove them"
    )
    refused = [
        e
        for e in _events(api_client, namespace, kind="AsyncTrainingRun", name="owned")
        if e["reason"] == "PodTemplateFieldsRefused"
    ]
    assert [e["message"] for e in refused] == [condition["message"]]
    job = client.BatchV1Api(api_client).read_namespaced_job(names.trainer_job_name("owned"), namespace)
    pod = job.spec.template
    assert pod.metadata.labels[names.LABEL_RUN] == "owned"
    assert pod.metadata.labels["team"] == "rl"
    assert [t.key for t in pod.spec.tolerations] == ["nvidia.com/gpu"]
    config = next(v for v in pod.spec.volumes if v.name == "config")
    assert config.config_map.name == names.config_map_name("owned")
    (trainer,) = pod.spec.containers
    key = next(e for e in trainer.env if e.name == "ASYNCRL_GATEWAY_KEY")
    assert key.value is None
    assert key.value_from.secret_key_ref is not None
    assert any(m.mount_path == "/scratch" for m in trainer.volume_mounts)


def test_a_template_the_api_server_refuses_fails_the_run_once_with_its_reason(
    api_client: Any, namespace: str, kubectl: list[str], start_operator: OperatorStarter
) -> None:
    """A 4xx on the trainer Job is final: the run fails with the API server's message, no retry loop."""
    from kubernetes import client

    start_operator()
    manifest = run_manifest(
        "sideways",
        trainer={
            "backend": "Reference",
            "gpus": 0,
            "podTemplate": {"tolerations": [{"key": "gpu", "operator": "Sideways"}]},
        },
    )
    apply_ok(kubectl, namespace, manifest)
    wait_for_phase(api_client, namespace, "sideways", "Failed", timeout=90, what="the run to fail")
    message = run_status(api_client, namespace, "sideways")["message"]
    assert message.startswith("the API server refused the trainer Job: Invalid (422): ")
    assert "spec.template.spec.tolerations[0].operator" in message
    assert "Sideways" in message
    assert "\n" not in message
    assert "HTTP response headers" not in message
    with pytest.raises(client.exceptions.ApiException):  # nothing half-made
        client.BatchV1Api(api_client).read_namespaced_job(names.trainer_job_name("sideways"), namespace)

    def rejections() -> list[dict[str, Any]]:
        events = _events(api_client, namespace, kind="AsyncTrainingRun", name="sideways")
        return [e for e in events if e["reason"] in ("TrainerJobRejected", "ReconcileError")]

    wait_for(rejections, timeout=30, what="the TrainerJobRejected event")
    # The supervisor restarts a failing controller after 10 s; a retried 4xx would post again by then.
    with pytest.raises(WaitTimeout):
        wait_for(lambda: len(rejections()) > 1, timeout=25, what="a second attempt")
    assert [e["reason"] for e in rejections()] == ["TrainerJobRejected"]
