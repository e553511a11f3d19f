"""The next status of a run from what the operator observed (pure, so the rules are tested directly).

Phase rules, first match wins:
- a fatal error (the trainer reported a configuration error or a run that cannot progress, the template or
  the spec cannot work) → Failed with that reason;
- `spec.suspend` → Suspended;
- no trainer Job seen yet → Pending;
- the trainer Job is Complete → Succeeded, Failed → Failed (with the Job's reason);
- the gateway answers → Running;
- otherwise → Starting (trainer pod scheduling, images pulling, model loading).
Conditions: `GatewayReachable`, `AgentTemplateValid`, `Ready` (= Running), and `Complete` / `Failed` (so that
`kubectl wait --for=condition=Complete` works). The trainer's last reported error is kept in the message. An
unchanged observation gives an equal status, so the caller writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from asyncrl.api import AsyncTrainingRunStatus, Phase
from asyncrl.api.types.status import Condition, ConditionStatus, JobCounts, RolloutCounts, with_condition
from asyncrl.rollouts import RolloutState
from asyncrl.window_summary import WindowSummary


@dataclass(frozen=True)
class RunObservation:
    generation: int
    suspended: bool
    trainer_job: Mapping[str, Any] | None
    gateway_reachable: bool
    summary: WindowSummary | None
    rollout_counts: Mapping[RolloutState, int] | None
    jobs_active: int
    jobs_created: int
    jobs_failed: int
    template_error: str | None
    fatal_error: str | None = None  # the run cannot succeed: phase Failed with this message
    trainer_error: str | None = None  # the trainer's last reported (restartable) error
    ray_cluster: str | None = None  # KubeRay's state of a multi-node trainer's RayCluster


def _trainer_outcome(job: Mapping[str, Any]) -> tuple[Phase, str] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return Phase.SUCCEEDED, "the trainer finished"
        if condition.get("type") == "Failed":
            reason = condition.get("reason") or "Failed"
            return (
                Phase.FAILED,
                f"the trainer Job failed ({reason}): {condition.get('message') or ''}".strip(),
            )
    return None


def phase_of(observation: RunObservation) -> tuple[Phase, str]:
    if observation.fatal_error is not None:
        return Phase.FAILED, observation.fatal_error
    if observation.suspended:
        return Phase.SUSPENDED, "suspended: no new agent Jobs; the trainer Job is suspended"
    if observation.trainer_job is None:
        return Phase.PENDING, "creating the trainer Job"
    outcome = _trainer_outcome(observation.trainer_job)
    last_error = f"the trainer's last error: {observation.trainer_error}" if observation.trainer_error else ""
    if outcome is not None:
        phase, message = outcome
        if phase is Phase.FAILED and last_error:
            message = f"{message}; {last_error}"
        return phase, message
    if observation.gateway_reachable:
        return Phase.RUNNING, f"training ({last_error}; it was restarted)" if last_error else "training"
    return Phase.STARTING, "waiting for the trainer pod and its gateway"


def _condition(kind: str, ok: bool, reason: str, message: str, now: datetime, generation: int) -> Condition:
    return Condition(
        type=kind,
        status=ConditionStatus.TRUE if ok else ConditionStatus.FALSE,
        reason=reason,
        message=message,
        last_transition_time=now,
        observed_generation=generation,
    )


def next_status(
    current: AsyncTrainingRunStatus, observation: RunObservation, *, now: datetime
) -> AsyncTrainingRunStatus:
    phase, message = phase_of(observation)
    if current.phase is not None and current.phase.is_terminal:
        phase, message = current.phase, current.message or message  # a finished run stays finished
    status = current
    if observation.summary is not None:
        status = status.with_window_summary(observation.summary, now=now)
    conditions = list(status.conditions)
    generation = observation.generation
    conditions = with_condition(
        conditions,
        _condition(
            "GatewayReachable",
            observation.gateway_reachable,
            "Reachable" if observation.gateway_reachable else "Unreachable",
            "" if observation.gateway_reachable else "the operator cannot reach the run's gateway yet",
            now,
            generation,
        ),
    )
    conditions = with_condition(
        conditions,
        _condition(
            "AgentTemplateValid",
            observation.template_error is None,
            "Rendered" if observation.template_error is None else "TemplateError",
            observation.template_error or "",
            now,
            generation,
        ),
    )
    conditions = with_condition(
        conditions, _condition("Ready", phase is Phase.RUNNING, str(phase), message, now, generation)
    )
    for kind, reached in (("Complete", Phase.SUCCEEDED), ("Failed", Phase.FAILED)):
        conditions = with_condition(
            conditions,
            _condition(
                kind, phase is reached, str(phase), message if phase is reached else "", now, generation
            ),
        )
    update: dict[str, Any] = {
        "phase": phase,
        "message": message,
        "observed_generation": generation,
        "conditions": conditions,
        "jobs": JobCounts(
            active=observation.jobs_active, created=observation.jobs_created, failed=observation.jobs_failed
        ),
    }
    if observation.rollout_counts is not None:
        counts = {RolloutState(state): count for state, count in observation.rollout_counts.items()}
        update["rollouts"] = RolloutCounts.from_states(counts)
    if observation.ray_cluster is not None:
        update["ray_cluster"] = observation.ray_cluster
    if status.start_time is None and phase is Phase.RUNNING:
        update["start_time"] = now
    return status.model_copy(update=update)
