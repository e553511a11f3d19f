"""Agent templates on the real control plane: an invalid one fails its run at the start and launches nothing;
a slow one never stalls another run of the same operator.

Real parts: kube-apiserver, the Job controller, the `asyncrl operator` process with its render workers, the
gateway sidecar. Stand-ins: the pod runner for a kubelet, `stub_trainer.py` for the trainer.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from asyncrl.operator.dispatcher.launching import REFUSALS_BEFORE_FAILING
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    AGENT_TEMPLATE,
    agent_jobs,
    apply_ok,
    events,
    run_manifest,
    status_condition,
    wait_for_phase,
    wait_for_trainer_stopped,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

BROKEN = {
    # a container written as a string (the structure), a Pod instead of a Job, a pod on the node's network
    "typo": (
        "apiVersion: batch/v1\nkind: Job\nspec:\n  template:\n    spec:\n      containers: [agent]\n",
        "spec.template.spec.containers[0]: expected a mapping with name and image, got the string 'agent'",
    ),
    "pod": (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: {{ question }}}\n",
        "must render a batch/v1 Job; got v1/Pod",
    ),
    "hostnet": (
        AGENT_TEMPLATE.replace("      containers:\n", "      hostNetwork: true\n      containers:\n"),
        "spec.template.spec.hostNetwork: sharing the node's namespaces is not allowed; refused by the "
        "operator's --agent-pod-policy=restricted",
    ),
    # issue 24: another run's checkpoint claim, and a Job that picks its own pods (it could adopt others')
    "claim": (
        AGENT_TEMPLATE.replace(
            "      containers:\n",
            "      volumes: [{name: ckpt, persistentVolumeClaim: {claimName: other-run-checkpoints}}]\n"
            "      containers:\n",
        ),
        "spec.template.spec.volumes[0].persistentVolumeClaim: a claim of the namespace is not allowed",
    ),
    "selector": (
        AGENT_TEMPLATE.replace("spec:\n  template:\n", "spec:\n  manualSelector: true\n  template:\n", 1),
        "spec.manualSelector: a Job that picks its own pods is not allowed",
    ),
    # a label key the API server refuses (not DNS-valid): every agent Job would get 422, so the run went on
    # failing each rollout and consuming steps; the start check names it (agent_templates/job_schema.py,
    # issue 26)
    "label": (
        AGENT_TEMPLATE.replace("kind: Job\n", "kind: Job\nmetadata:\n  labels: {'team name!': x}\n", 1),
        "agent template: metadata.labels.team name!: label key 'team name!': the name 'team name!' must be",
    ),
    # a field the Job schema lacks: the API server would drop it and run agents without their command
    "comand": (
        AGENT_TEMPLATE.replace("        command:\n", "        comand:\n", 1),
        "agent template: spec.template.spec.containers[0].comand: unknown field; did you mean command?",
    ),
    # what only the API server knows (a port out of range): the dry-run create names its reason at the start
    "port": (
        AGENT_TEMPLATE.replace(
            "        env:\n", "        ports: [{containerPort: 99999}]\n        env:\n", 1
        ),
        'the API server rejects the agent Job the template gives: Invalid (422): Job.batch "port-r-',
    ),
}
# Fast for the first row (so the start check passes), a 10**10-step loop for the second: every rollout of
# that row runs into the render time limit while the operator serves other runs.
SLOW_FOR_ONE_ROW = (
    AGENT_TEMPLATE
    + '{% if question == "and 3+3?" %}{% for i in range(100000) %}{% for j in range(100000) %}'
    + "{% endfor %}{% endfor %}{% endif %}\n"
)


def _template_events(kubectl: list[str], namespace: str, run: str) -> list[dict[str, Any]]:
    return [
        e for e in events(kubectl, namespace, reason="AgentTemplateError") if e["regarding"]["name"] == run
    ]


def test_an_invalid_template_fails_the_run_at_the_start_and_launches_no_agent_job(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    start_operator()
    manifests = {name: run_manifest(name, template=template) for name, (template, _) in BROKEN.items()}
    for manifest in manifests.values():
        apply_ok(kubectl, namespace, manifest)

    for name, (_, reason) in BROKEN.items():
        status = wait_for_phase(
            api_client, namespace, name, "Failed", timeout=120, what=f"run {name} to fail"
        )
        assert reason in status["message"], (name, status["message"])
        if name == "port":
            assert "containerPort: Invalid value: 99999" in status["message"]
        valid = status_condition(status, "AgentTemplateValid") or {}
        assert (valid.get("status"), valid.get("reason")) == ("False", "TemplateError"), name
        assert reason in valid["message"], name
        (event,) = wait_for(
            functools.partial(_template_events, kubectl, namespace, name), timeout=30, what="the event"
        )
        assert event["type"] == "Warning"
        assert reason in event["note"]
        assert "\n" not in event["note"]

    # A failed run stops: its trainer Job is suspended (the pod goes, the GPUs are freed) and no agent Job
    # is ever created.
    for name in BROKEN:
        wait_for_trainer_stopped(
            api_client, namespace, name, timeout=120, what=f"run {name}'s trainer to stop"
        )
        assert agent_jobs(api_client, namespace, name) == [], name


def test_a_run_whose_every_agent_job_the_api_server_refuses_fails_once_with_the_servers_reason(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    """Rows from a ConfigMap: the start's dry run has no real row to try, so only the agent Jobs meet the API
    server. Before, such a run failed every rollout of every step and went on (issue 24 item 7)."""
    from kubernetes import client

    start_operator()
    rows = [{"question": "what is 2+2?"}, {"question": "and 3+3?"}]
    body = {"metadata": {"name": "rows"}, "data": {"rows.json": json.dumps(rows)}}
    client.CoreV1Api(api_client).create_namespaced_config_map(namespace, body)
    template, _ = BROKEN["port"]  # a port out of range: only the API server refuses it
    data = {"configMapRef": {"name": "rows", "key": "rows.json"}}
    apply_ok(kubectl, namespace, run_manifest("refused", template=template, totalSteps=20, data=data))

    status = wait_for_phase(
        api_client, namespace, "refused", "Failed", "Succeeded", timeout=240, what="the run to end"
    )
    assert status["phase"] == "Failed", status
    message = status["message"]
    assert f"the API server refused each of the first {REFUSALS_BEFORE_FAILING} agent Jobs" in message
    assert "containerPort: Invalid value: 99999" in message  # the server's own reason
    refused = [
        e
        for e in events(kubectl, namespace, reason="AgentJobsRefused")
        if e["regarding"]["name"] == "refused"
    ]
    assert [e["type"] for e in refused] == ["Warning"]  # said once
    wait_for_trainer_stopped(api_client, namespace, "refused", timeout=120, what="the run's trainer to stop")
    assert agent_jobs(api_client, namespace, "refused") == []


def test_a_template_that_renders_slowly_for_some_rows_does_not_stall_a_healthy_run(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    operator = start_operator()
    apply_ok(kubectl, namespace, run_manifest("slow", template=SLOW_FOR_ONE_ROW, totalSteps=4))
    wait_for(
        lambda: _template_events(kubectl, namespace, "slow"),
        timeout=120,
        what="the first slow render to fail",
    )
    apply_ok(kubectl, namespace, run_manifest("healthy"))

    status = wait_for_phase(
        api_client,
        namespace,
        "healthy",
        "Succeeded",
        timeout=240,
        what="the healthy run to finish while the slow run's renders time out",
    )
    assert status["rollouts"]["succeeded"] == 8
    assert len(agent_jobs(api_client, namespace, "healthy")) == 8
    (event, *_) = _template_events(kubectl, namespace, "slow")
    assert "longer than 5 s to render (the render time limit" in event["note"]
    # The first row's rollouts of the slow run got their Jobs: only the slow row's renders failed.
    assert len(agent_jobs(api_client, namespace, "slow")) >= 2
    assert operator.process.poll() is None
