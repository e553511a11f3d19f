"""Kueue's queue label on a run (pure): the trainer Job or RayCluster is labelled and created suspended for
Kueue to admit; the run says it waits for admission; the reconcile never resumes what Kueue suspended."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from asyncrl.api import AsyncTrainingRunStatus, Phase, load_run
from asyncrl.operator.reconciliation.reconcile import Observed, reconcile
from asyncrl.operator.reconciliation.status import RunObservation, next_status
from asyncrl.workloads import children, names
from asyncrl.workloads.ray_cluster import ray_cluster
from asyncrl.workloads.trainer_state import trainer_of_job
from tests.support.kube import multi_node_manifest, run_manifest

NOW = datetime(2026, 12, 4, tzinfo=UTC)
QUEUED = {"podTemplate": {"metadata": {"labels": {names.KUEUE_QUEUE_LABEL: "gpu-queue", "team": "a"}}}}


def _run(manifest: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    manifest["metadata"].update(namespace="team", uid="uid-1")
    return manifest, load_run(manifest).spec


def _queued_manifest(**spec: Any) -> dict[str, Any]:
    manifest = run_manifest("demo", **spec)
    manifest["spec"]["trainer"].update(QUEUED)
    return manifest


def test_a_queued_trainer_job_is_labelled_and_created_suspended_for_kueue() -> None:
    run, spec = _run(_queued_manifest())
    job = children.trainer_job(run, spec)
    assert job["metadata"]["labels"][names.KUEUE_QUEUE_LABEL] == "gpu-queue"
    assert job["metadata"]["labels"]["team"] == "a"  # the pod template's labels, as on a RayCluster
    assert job["metadata"]["labels"][names.LABEL_RUN] == "demo"  # the operator's own labels stay
    assert job["spec"]["suspend"] is True
    # Not marked as the run's suspension: Kueue resumes it, the run does not.
    assert names.ANNOTATION_SUSPENDED_BY_RUN not in (job["metadata"].get("annotations") or {})
    plain_run, plain_spec = _run(run_manifest("demo"))
    assert children.trainer_job(plain_run, plain_spec)["spec"]["suspend"] is False


def test_a_queued_multi_node_run_creates_its_ray_cluster_suspended() -> None:
    manifest = multi_node_manifest("demo")
    manifest["spec"]["trainer"].update(QUEUED)
    run, spec = _run(manifest)
    cluster, _ = ray_cluster(run, spec)
    assert cluster["spec"]["suspend"] is True
    assert cluster["metadata"]["labels"][names.KUEUE_QUEUE_LABEL] == "gpu-queue"
    assert names.ANNOTATION_SUSPENDED_BY_RUN not in (cluster["metadata"].get("annotations") or {})


def _observed(job: dict[str, Any], *, phase: Phase | None = None, start: bool = False) -> Observed:
    status = AsyncTrainingRunStatus(phase=phase, start_time=NOW if start else None)
    run = RunObservation(
        generation=1,
        suspended=False,
        trainer=trainer_of_job(job),
        gateway_reachable=False,
        summary=None,
        rollout_counts=None,
        jobs_active=0,
        jobs_created=0,
        jobs_failed=0,
        template_error=None,
    )
    return Observed(status=status, run=run, missing=frozenset(), agents_stopped=False)


def test_a_run_waiting_for_admission_says_so_and_is_never_resumed_by_the_operator() -> None:
    run, spec = _run(_queued_manifest())
    job = children.trainer_job(run, spec)
    actions = reconcile(_observed(job, phase=Phase.PENDING), now=NOW)
    assert actions.status.phase is Phase.PENDING
    assert actions.status.message == "waiting for Kueue (queue gpu-queue) to admit the trainer"
    assert actions.trainer_suspend is None  # left for Kueue

    admitted = {**job, "spec": {**job["spec"], "suspend": False}, "status": {"active": 1}}
    assert reconcile(_observed(admitted, phase=Phase.PENDING), now=NOW).status.phase is Phase.STARTING


def test_a_run_preempted_by_kueue_is_suspended_until_admitted_again() -> None:
    run, spec = _run(_queued_manifest())
    job = children.trainer_job(run, spec)  # suspended again, by Kueue, after the run ran
    observed = _observed(job, phase=Phase.RUNNING, start=True)
    actions = reconcile(observed, now=NOW)
    assert actions.status.phase is Phase.SUSPENDED
    assert "Kueue (queue gpu-queue)" in (actions.status.message or "")
    assert actions.trainer_suspend is None
    resumed = replace(
        observed.run, trainer=trainer_of_job({**job, "spec": {"suspend": False}}), gateway_reachable=True
    )
    assert next_status(actions.status, resumed, now=NOW).phase is Phase.RUNNING
