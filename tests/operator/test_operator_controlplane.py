"""The operator end to end on the real control plane.

Real parts: kube-apiserver (CRD validation, CEL), the Job/GC/TTL controllers, the `asyncrl operator` process
(kopf), the `asyncrl gateway` process as the trainer pod's sidecar, and agents that call the model through
it. Stand-ins: the pod runner instead of a kubelet, and `tests/operator/stub_trainer.py` instead of the
trainer (it creates the rollouts and posts step summaries; the trainer itself is tested on its own).
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest

from asyncrl.operator.dispatcher.vanished_launches import VANISHED_WITHOUT_REWARD
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for
from asyncrl.workloads import names
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    agent_jobs,
    apply_ok,
    apply_run,
    delete_run,
    events,
    run_manifest,
    run_object,
    run_status,
    wait_for_no_jobs_or_pods,
    wait_for_phase,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]


def test_a_run_trains_through_agent_jobs_and_reports_progress_in_its_status(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    from kubernetes import client

    start_operator()
    apply_ok(kubectl, namespace, run_manifest("demo"))

    # Children exist, each owned by the run.
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    uid = run_object(api_client, namespace, "demo")["metadata"]["uid"]

    def children() -> list[Any] | None:
        try:
            found = [
                core.read_namespaced_secret(names.gateway_key_secret_name("demo"), namespace),
                core.read_namespaced_config_map(names.config_map_name("demo"), namespace),
                core.read_namespaced_service(names.gateway_service_name("demo"), namespace),
                batch.read_namespaced_job(names.trainer_job_name("demo"), namespace),
            ]
        except client.exceptions.ApiException:
            return None
        return found

    for child in wait_for(children, timeout=60, what="the run's children"):
        assert [(ref.kind, ref.uid, ref.controller) for ref in child.metadata.owner_references] == [
            ("AsyncTrainingRun", uid, True)
        ]

    # The stand-in trainer runs 2 steps of 2 groups x 2 rollouts; each rollout is one agent Job whose agent
    # calls the model through the gateway and reports a reward.
    status = wait_for_phase(
        api_client, namespace, "demo", "Succeeded", timeout=180, what="the run to succeed"
    )
    assert status["step"] == 1
    assert status["completedRollouts"] == 4
    assert status["carryOverAgeMaxSteps"] == 1
    assert status["rollouts"]["succeeded"] == 8
    assert status["rollouts"]["failed"] == 0
    assert status["jobs"]["created"] == 8
    assert status["observedGeneration"] == 1
    jobs = agent_jobs(api_client, namespace)
    assert len(jobs) == 8
    assert {job.spec.backoff_limit for job in jobs} == {0}
    assert {job.spec.active_deadline_seconds for job in jobs} == {1800}
    assert {job.spec.ttl_seconds_after_finished for job in jobs} == {600}

    table = subprocess.run(
        [*kubectl, "get", "atr", "-n", namespace], capture_output=True, text=True, check=True
    )
    header, row = table.stdout.splitlines()[:2]
    assert header.split() == [
        "NAME", "PHASE", "STEPS", "REWARD", "ACTIVE", "CARRY-OVER", "MAX-AGE", "DRAIN", "AGE"
    ]  # fmt: skip
    # A finished 2-step run shows 2 of 2 steps; the stand-in trainer reports the share that succeeded.
    assert row.split()[:8] == ["demo", "Succeeded", "2/2", "1", "1", "2", "1", "0.01"]
    assert status["progress"] == "2/2"
    assert status["reward"] == {"last": 1.0, "best": 1.0}
    wide = subprocess.run(
        [*kubectl, "get", "atr", "-n", namespace, "-o", "wide"], capture_output=True, text=True, check=True
    )
    wide_header, wide_row = wide.stdout.splitlines()[:2]
    wide_columns = dict(zip(wide_header.split(), wide_row.split(), strict=True))
    assert list(wide_columns)[4:5] + list(wide_columns)[-4:] == ["BEST", "SUCCEEDED", "FAILED", "JOBS", "AGE"]
    assert [wide_columns[name] for name in ("BEST", "SUCCEEDED", "FAILED", "JOBS")] == ["1", "8", "0", "0"]


def test_bad_manifests_are_rejected_by_the_api_server(
    api_client: Any, namespace: str, kubectl: list[str], start_operator: OperatorStarter
) -> None:
    cases = {
        "async-window": (
            {"async": {"enabled": True, "windowSize": 1}},
            ["windowSize", "trainBatchSize", "2"],
        ),
        "zero-n": ({"rollout": {"samplesPerPrompt": 0}}, ["rollout.samplesPerPrompt", "0"]),
        "no-template": ({"agents": {"template": {}}}, ["configMapRef", "inline"]),
    }
    for name, (spec, words) in cases.items():
        result = apply_run(kubectl, namespace, run_manifest(name, **spec))
        assert result.returncode != 0, name
        for word in words:
            assert word in result.stderr, (name, result.stderr)


def test_a_run_with_a_verl_key_the_run_owns_fails_with_the_reason_and_creates_nothing(
    api_client: Any, namespace: str, kubectl: list[str], start_operator: OperatorStarter
) -> None:
    """The API server admits any verlOverrides; the operator refuses the keys the run itself sets."""
    start_operator()
    manifest = run_manifest("owned-key")
    manifest["spec"]["trainer"]["verlOverrides"] = {"data.train_batch_size": 64}
    apply_ok(kubectl, namespace, manifest)
    status = wait_for_phase(api_client, namespace, "owned-key", "Failed", timeout=60, what="the run to fail")
    assert "spec.trainer.verlOverrides" in status["message"]
    assert "'data.train_batch_size' is set by spec.trainBatchSize" in status["message"]

    (event,) = wait_for(
        lambda: events(kubectl, namespace, reason="InvalidSpec"), timeout=30, what="the InvalidSpec event"
    )
    assert event["type"] == "Warning"
    assert "data.train_batch_size" in event["note"]
    from kubernetes import client

    jobs = client.BatchV1Api(api_client).list_namespaced_job(namespace).items
    assert jobs == []  # no trainer Job, no agent Job


def test_job_creation_is_rate_limited(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    start_operator()
    manifest = run_manifest("limited", totalSteps=1, rollout={"samplesPerPrompt": 3})
    manifest["spec"]["agents"]["maxJobsPerMinute"] = 4
    apply_ok(kubectl, namespace, manifest)
    wait_for(lambda: len(agent_jobs(api_client, namespace)) >= 4, timeout=90, what="the first 4 Jobs")
    # 6 rollouts are queued; with 4 per minute the 5th Job may not exist within the first minute.
    first = min(job.metadata.creation_timestamp for job in agent_jobs(api_client, namespace))
    time.sleep(10)
    jobs = agent_jobs(api_client, namespace)
    assert len(jobs) == 4
    created = sorted(job.metadata.creation_timestamp for job in jobs)
    assert (created[-1] - first).total_seconds() < 50


def test_an_operator_restart_mid_run_creates_no_duplicate_job_and_keeps_status(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    operator = start_operator()
    manifest = run_manifest("restart", totalSteps=3)
    apply_ok(kubectl, namespace, manifest)
    wait_for(
        lambda: run_status(api_client, namespace, "restart").get("step") == 0, timeout=120, what="step 0"
    )
    operator.stop(grace_seconds=0.1)  # SIGTERM then SIGKILL: no graceful hand-over
    before = run_status(api_client, namespace, "restart")
    time.sleep(2)
    restarted = start_operator()
    status = wait_for_phase(
        api_client,
        namespace,
        "restart",
        "Succeeded",
        timeout=180,
        what="the run to finish under the new operator",
    )
    assert before["step"] == 0  # nothing was lost while the operator was down
    assert status["step"] == 2
    jobs = agent_jobs(api_client, namespace)
    rollout_ids = [job.metadata.annotations[names.ANNOTATION_ROLLOUT_ID] for job in jobs]
    assert len(rollout_ids) == len(set(rollout_ids))  # no rollout got a second Job
    # A kill that lands between a rollout's launch and its Job's creation loses that rollout (at most once):
    # the restarted operator ends it failed, saying so, and never relaunches it. Every other rollout of the
    # 3 steps x 2 groups x 2 rollouts has its one Job.
    vanished = restarted.log().count(VANISHED_WITHOUT_REWARD)
    assert len(rollout_ids) + vanished == 12, (len(rollout_ids), vanished)


def test_deleting_a_run_leaves_no_job_or_pod(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    start_operator()
    apply_ok(kubectl, namespace, run_manifest("doomed", totalSteps=50))
    wait_for(
        lambda: run_status(api_client, namespace, "doomed").get("step") is not None,
        timeout=120,
        what="a step",
    )
    deleted = delete_run(kubectl, namespace, "doomed")
    assert deleted.returncode == 0, deleted.stderr
    wait_for_no_jobs_or_pods(
        api_client, namespace, timeout=90, what="every Job and pod of the run to be gone"
    )
    reasons = {item.get("reason") for item in events(kubectl, namespace)}
    assert "PhaseRunning" in reasons
