"""The operator's one level-triggered reconcile on the real control plane (issue 25).

Real parts: kube-apiserver, the Job/GC controllers, the `asyncrl operator` process, the gateway sidecar.
Stand-ins: the pod runner for the kubelet, `tests/operator/stub_trainer.py` for the trainer image, and, where
a test needs a gateway that never answers or a trainer that always fails, images that only sleep or exit.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.operator.reconciliation.reconciler import REQUEUE_SECONDS
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import WaitTimeout, wait_for
from asyncrl.workloads import names
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    AGENT_TEMPLATE,
    agent_jobs,
    apply_ok,
    events,
    explain_run,
    kubectl_run,
    pod_logs,
    run_manifest,
    run_object,
    run_status,
    status_condition,
    trainer_job,
    wait_for_phase,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

CHILD_NAMES = {
    "job": names.trainer_job_name,
    "service": names.gateway_service_name,
    "secret": names.gateway_key_secret_name,
    "configmap": names.config_map_name,
}
KINDS = {"job": "Job", "service": "Service", "secret": "Secret", "configmap": "ConfigMap"}
SILENT_GATEWAY_IMAGE = "asyncrl.test/silent-gateway"  # runs, never listens
FAILING_TRAINER_IMAGE = "asyncrl.test/failing-trainer"  # exits 3 at once, every time


@pytest.fixture(autouse=True)
def _broken_images(image_table: ImageTable) -> None:
    image_table[SILENT_GATEWAY_IMAGE] = Image(
        entrypoint=(sys.executable, "-c", "import time; time.sleep(3600)"), replace_command=True
    )
    image_table[FAILING_TRAINER_IMAGE] = Image(
        entrypoint=(sys.executable, "-c", "import sys; sys.exit(3)"), replace_command=True
    )


def _children(api_client: Any, namespace: str, run: str) -> dict[str, str | None]:
    """The uid of each of the run's children (None: absent)."""
    from kubernetes import client

    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    reads = {
        "Secret": lambda: core.read_namespaced_secret(names.gateway_key_secret_name(run), namespace),
        "ConfigMap": lambda: core.read_namespaced_config_map(names.config_map_name(run), namespace),
        "Service": lambda: core.read_namespaced_service(names.gateway_service_name(run), namespace),
        "Job": lambda: batch.read_namespaced_job(names.trainer_job_name(run), namespace),
    }
    uids: dict[str, str | None] = {}
    for kind, read in reads.items():
        try:
            uids[kind] = read().metadata.uid
        except client.exceptions.ApiException as error:
            if error.status != 404:
                raise
            uids[kind] = None
    return uids


def _secret_key(api_client: Any, namespace: str, run: str) -> str:
    from kubernetes import client

    secret = client.CoreV1Api(api_client).read_namespaced_secret(
        names.gateway_key_secret_name(run), namespace
    )
    return str(secret.data["key"])


def test_the_trainer_job_service_secret_and_config_map_deleted_mid_run_are_recreated(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
    tmp_path: Path,
) -> None:
    start_operator()
    # TTL 0: the agent Jobs of the first trainer pod go at once, so the restarted trainer's rollouts (the same
    # ids on a new gateway) get their own Jobs.
    manifest = run_manifest("heal", totalSteps=10)
    manifest["spec"]["agents"]["ttlSecondsAfterFinished"] = 0
    apply_ok(kubectl, namespace, manifest)
    wait_for_phase(api_client, namespace, "heal", "Running", timeout=120, what="the run to be Running")
    before = _children(api_client, namespace, "heal")
    key = _secret_key(api_client, namespace, "heal")
    assert None not in before.values(), before

    # What the trainer pod mounts first (the pod runner, unlike a kubelet, does not retry a missing volume),
    # then the trainer Job itself.
    for kinds in (("service", "secret", "configmap"), ("job",)):
        for kind in kinds:
            deleted = kubectl_run(kubectl, "delete", "-n", namespace, kind, CHILD_NAMES[kind]("heal"))
            assert deleted.returncode == 0, deleted.stderr

        def recreated(kinds: tuple[str, ...] = kinds) -> dict[str, str | None] | None:
            now = _children(api_client, namespace, "heal")
            fresh = all(now[KINDS[kind]] not in (None, before[KINDS[kind]]) for kind in kinds)
            return now if fresh else None

        wait_for(recreated, timeout=120, what=f"{', '.join(kinds)} recreated (new uids)")
    assert _secret_key(api_client, namespace, "heal") == key  # the gateway key the run already uses

    def warned_of_each() -> list[dict[str, Any]] | None:
        """The ChildRecreated events, once one names each child (posted after the round's creations)."""
        warned = events(kubectl, namespace, reason="ChildRecreated")
        notes = " ".join(event["note"] for event in warned)
        named = all(word in notes for word in ("Secret", "ConfigMap", "Service", "trainer Job"))
        return warned if named else None

    warned = wait_for(warned_of_each, timeout=30, what="a ChildRecreated event naming each recreated child")
    assert {event["type"] for event in warned} == {"Warning"}
    # The recreated trainer pod starts (its ConfigMap and Secret are there) and the run trains to the end.
    try:
        status = wait_for_phase(
            api_client, namespace, "heal", "Succeeded", "Failed", timeout=300, what="the run to end"
        )
    except WaitTimeout as timeout:
        logs = [*sorted(tmp_path.glob("operator-*.log")), *pod_logs(pod_runner.work_dir, namespace)]
        pytest.fail(f"{timeout}\n{explain_run(api_client, kubectl, namespace, 'heal', logs=logs)}")
    assert status["phase"] == "Succeeded", status


def test_a_trainer_job_that_fails_while_its_gateway_never_answers_fails_the_run_with_the_jobs_reason(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    start_operator()
    manifest = run_manifest("no-gateway")
    manifest["spec"]["gateway"]["image"] = SILENT_GATEWAY_IMAGE
    manifest["spec"]["trainer"]["image"] = FAILING_TRAINER_IMAGE
    apply_ok(kubectl, namespace, manifest)
    status = wait_for_phase(
        api_client, namespace, "no-gateway", "Failed", timeout=240, what="the run to fail"
    )
    assert "the trainer Job failed (BackoffLimitExceeded)" in status["message"]
    assert "its gateway never answered" in status["message"]
    failed = status_condition(status, "Failed")
    assert failed is not None
    assert (failed["status"], failed["reason"]) == ("True", "Failed")
    assert status_condition(status, "GatewayReachable") is None  # not a fault of a run that ended
    (event,) = events(kubectl, namespace, reason="PhaseFailed")
    assert event["type"] == "Warning"
    assert "BackoffLimitExceeded" in event["note"]


def test_a_run_goes_through_the_phases_once_and_ends_without_flapping(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    start_operator()
    apply_ok(kubectl, namespace, run_manifest("phases"))
    wait_for_phase(api_client, namespace, "phases", "Succeeded", timeout=240, what="the run to succeed")
    # The phase events in the order they were posted: the machine's path, each phase once.
    posted = sorted(
        (event for event in events(kubectl, namespace) if event["reason"].startswith("Phase")),
        key=lambda event: (event.get("eventTime") or "", event["metadata"]["creationTimestamp"]),
    )
    path = [event["reason"].removeprefix("Phase") for event in posted]
    assert path in (["Starting", "Running", "Succeeded"], ["Pending", "Starting", "Running", "Succeeded"]), (
        path
    )
    assert {event["type"] for event in posted} == {"Normal"}
    status = run_status(api_client, namespace, "phases")
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Complete"] == ("True", "Succeeded")
    assert conditions["Failed"] == ("False", "Succeeded")
    assert conditions["Ready"][0] == "False"
    assert "GatewayReachable" not in conditions


def test_a_template_edited_while_suspended_is_used_for_the_rollouts_launched_after(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    start_operator()
    apply_ok(kubectl, namespace, run_manifest("edit", suspend=True))
    wait_for_phase(api_client, namespace, "edit", "Suspended", timeout=120, what="the run to be Suspended")
    edited = AGENT_TEMPLATE.replace(
        "        env:\n", '        env:\n        - name: TEMPLATE_EDIT\n          value: "2"\n'
    )
    assert edited != AGENT_TEMPLATE
    patch = {"spec": {"agents": {"template": {"inline": edited}}}}
    out = kubectl_run(
        kubectl, "patch", "-n", namespace, "atr", "edit", "--type=merge", "-p", json.dumps(patch)
    )
    assert out.returncode == 0, out.stderr
    wait_for(
        lambda: events(kubectl, namespace, reason="SpecChanged"), timeout=60, what="the SpecChanged event"
    )
    (changed,) = events(kubectl, namespace, reason="SpecChanged")
    assert "agents.template.inline" in changed["note"]
    assert run_object(api_client, namespace, "edit")["spec"]["suspend"] is True
    out = kubectl_run(
        kubectl, "patch", "-n", namespace, "atr", "edit", "--type=merge", "-p", '{"spec": {"suspend": false}}'
    )
    assert out.returncode == 0, out.stderr
    wait_for_phase(api_client, namespace, "edit", "Succeeded", timeout=240, what="the run to succeed")
    jobs = agent_jobs(api_client, namespace, "edit")
    assert jobs
    for job in jobs:
        env = {item.name: item.value for item in job.spec.template.spec.containers[0].env or []}
        assert env.get("TEMPLATE_EDIT") == "2", job.metadata.name


def test_a_child_that_cannot_be_recreated_is_said_once_not_every_requeue(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    """A ResourceQuota of 0 Services refuses the deleted gateway Service on every requeue (5 s): the operator
    tries each time (its log says so) but posts one ChildRecreateFailed event, not one per try. Once the quota
    goes, the Service is recreated. (The run outlasts the test: a finished run recreates nothing.)"""
    operator = start_operator()
    manifest = run_manifest("quota", totalSteps=100000)
    apply_ok(kubectl, namespace, manifest)
    wait_for_phase(api_client, namespace, "quota", "Running", timeout=120, what="the run to be Running")
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-services", "namespace": namespace},
        "spec": {"hard": {"services": "0"}},
    }
    created = kubectl_run(kubectl, "apply", "-f", "-", stdin=json.dumps(quota))
    assert created.returncode == 0, created.stderr
    service = names.gateway_service_name("quota")
    deleted = kubectl_run(kubectl, "delete", "-n", namespace, "service", service)
    assert deleted.returncode == 0, deleted.stderr

    attempt = "could not recreate the run's Service"
    wait_for(
        lambda: operator.log().count(attempt) >= 4 or None,
        timeout=180,
        what="four refused attempts to recreate the Service in the operator's log",
    )
    failed = events(kubectl, namespace, reason="ChildRecreateFailed")
    assert len(failed) == 1, [event["note"] for event in failed]
    recreating = events(kubectl, namespace, reason="ChildRecreated")
    assert len(recreating) == 1, [event["note"] for event in recreating]
    assert failed[0]["type"] == "Warning"
    assert "quota" in failed[0]["note"], failed[0]["note"]

    removed = kubectl_run(kubectl, "delete", "-n", namespace, "resourcequota", "no-services")
    assert removed.returncode == 0, removed.stderr
    wait_for(
        lambda: _children(api_client, namespace, "quota")["Service"],
        timeout=120,
        what="the Service recreated once the quota is gone",
    )
    assert run_status(api_client, namespace, "quota")["phase"] in ("Running", "Starting")


def test_a_trainer_job_refused_for_now_at_the_start_is_handled_as_on_a_recreation(
    api_client: Any,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    """One policy for a refused child, at the start as mid-run (issue 38): a quota of 0 Jobs refuses the first
    trainer Job (403), which a cluster admin can lift without a new run. The run waits, Pending with the API
    server's reason, one Warning event, tried again at every requeue; it used to fail for good at the start
    while the same refusal on a recreation was retried. Once the quota goes, the trainer Job is created."""
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-jobs", "namespace": namespace},
        "spec": {"hard": {"count/jobs.batch": "0"}},
    }
    created = kubectl_run(kubectl, "apply", "-f", "-", stdin=json.dumps(quota))
    assert created.returncode == 0, created.stderr
    wait_for(  # the quota controller fills in its usage before the admission enforces it
        lambda: kubectl_run(kubectl, "get", "-n", namespace, "resourcequota", "no-jobs", "-o", "json").stdout,
        timeout=30,
        what="the quota",
    )
    operator = start_operator()
    apply_ok(kubectl, namespace, run_manifest("refused"))
    attempt = "could not create the run's trainer Job"
    wait_for(
        lambda: operator.log().count(attempt) >= 3 or None,
        timeout=120,
        what="three refused attempts to create the trainer Job in the operator's log",
    )
    # Tried again at the requeue, not at every round: three attempts are at least two requeues apart (the
    # log's timestamps; a busy machine only spreads them further). At every round it was one a second.
    stamps = [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        for line in operator.log().splitlines()
        if attempt in line
    ]
    spread = (stamps[2] - stamps[0]).total_seconds()
    assert spread >= 2 * REQUEUE_SECONDS * 0.9, f"3 attempts in {spread:.1f} s"
    status = run_status(api_client, namespace, "refused")
    assert status["phase"] == "Pending", status
    assert status["message"].startswith(attempt), status["message"]
    assert "quota" in status["message"], status["message"]
    failed = events(kubectl, namespace, reason="ChildCreateFailed")
    assert len(failed) == 1, [event["note"] for event in failed]
    assert failed[0]["type"] == "Warning"
    assert not events(kubectl, namespace, reason="TrainerJobRejected")
    assert not events(kubectl, namespace, reason="ChildRecreated")  # the start is no recreation

    removed = kubectl_run(kubectl, "delete", "-n", namespace, "resourcequota", "no-jobs")
    assert removed.returncode == 0, removed.stderr
    wait_for(
        lambda: trainer_job(api_client, namespace, "refused"),
        timeout=120,
        what="the trainer Job created once the quota is gone",
    )
    assert run_status(api_client, namespace, "refused")["phase"] != "Failed"
