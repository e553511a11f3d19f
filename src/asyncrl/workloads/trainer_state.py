"""What the operator sees of a run's trainer, one type for the one-node trainer Job and the multi-node
RayCluster, so that the run's state machine and its reconcile (`asyncrl.operator.reconciliation`) read both
alike.

Only facts are kept: whether the trainer ended (and how, with the Job's or KubeRay's reason), whether it is
suspended (and whether that suspension is the run's doing), and KubeRay's one-line state of a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from asyncrl.workloads.names import ANNOTATION_SUSPENDED_BY_RUN, queue_of


class TrainerEnd(StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


@dataclass(frozen=True)
class TrainerObservation:
    ended: TrainerEnd | None = None
    reason: str = ""  # why it ended: the Job's condition reason (BackoffLimitExceeded, ...) or KubeRay's
    message: str = ""
    suspended: bool = False  # the trainer object's spec.suspend
    suspended_by_run: bool = True  # a RayCluster suspended by someone else is left alone
    cluster_state: str | None = None  # KubeRay's state of a multi-node run's cluster, for the status
    queue: str | None = None  # the Kueue queue named on the trainer object (kueue.x-k8s.io/queue-name)


def trainer_of_job(job: Mapping[str, Any]) -> TrainerObservation:
    """The trainer Job's `Complete` / `Failed` condition (the Job controller's verdict) and its suspension."""
    suspended = bool((job.get("spec") or {}).get("suspend"))
    ours = ((job.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_SUSPENDED_BY_RUN) == "true"
    by_run = ours or not suspended
    queue = queue_of((job.get("metadata") or {}).get("labels"))
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return TrainerObservation(
                ended=TrainerEnd.SUCCEEDED,
                reason="Complete",
                suspended=suspended,
                suspended_by_run=by_run,
                queue=queue,
            )
        if condition.get("type") == "Failed":
            return TrainerObservation(
                ended=TrainerEnd.FAILED,
                reason=str(condition.get("reason") or "Failed"),
                message=str(condition.get("message") or ""),
                suspended=suspended,
                suspended_by_run=by_run,
                queue=queue,
            )
    return TrainerObservation(suspended=suspended, suspended_by_run=by_run, queue=queue)


def suspend_patch(*, suspend: bool) -> dict[str, Any]:
    """The merge patch that suspends the trainer (marking it the run's doing) or resumes it."""
    if suspend:
        return {"metadata": {"annotations": {ANNOTATION_SUSPENDED_BY_RUN: "true"}}, "spec": {"suspend": True}}
    return {"metadata": {"annotations": {ANNOTATION_SUSPENDED_BY_RUN: None}}, "spec": {"suspend": False}}
