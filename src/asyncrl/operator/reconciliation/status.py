"""The run's state machine: its next status from what the operator observed (pure, so the rules are tested
directly). The one place the phases, their messages and the conditions are decided (summarised in
docs/troubleshooting.md).

Phase rules, first match wins:
- a fatal error (the trainer reported a configuration error or a run that cannot progress, the template or
  the spec cannot work) → Failed with that reason;
- the trainer ended: Failed (with the Job's or KubeRay's reason, whether or not the gateway ever answered)
  or Succeeded;
- `spec.suspend` → Suspended;
- before the run first ran, Pending while it waits for a prerequisite the user can still create (the
  template's ConfigMap, the gateway key's Secret, a multi-node run's checkpoint claim), a child the API server
  refused for now (a quota), naming it;
- no trainer yet → Pending, waiting for the trainer Job to be created;
- the trainer suspended by someone else (Kueue, until it admits the trainer): Pending before the run first
  ran, naming the queue; Suspended after (Kueue preempted it), until it is admitted again;
- the gateway answers → Running;
- the run was Running before (its startTime is set) → Running still, the message saying the gateway does not
  answer (the trainer pod restarts, or its Job is being recreated): a phase never goes back to Starting;
- otherwise → Starting (the trainer pod scheduling, images pulling, the gateway starting).
A terminal phase (Succeeded, Failed) never changes again.

Conditions, all written here:
- `Ready`: True while Running;
- `GatewayReachable`: whether the operator reached the gateway last time; removed once the run ended (the
  gateway is gone with the trainer, and that is no fault);
- `AgentTemplateValid`: whether the agent template renders;
- `AgentPodsStarting`: False (reason: the kubelet's, e.g. ImagePullBackOff) while agent pods cannot start or
  keep crashing, naming a pod and its image; kept as it was once the run ended;
- `Complete` / `Failed`: True on Succeeded / Failed, so that `kubectl wait --for=condition=...` works; while
  False their reason says why (`NotFinished`, or the other end state).
- `PodTemplateApplied`: from what the trainer's creation reported (`pod_template_report`): False with a
  Warning event for each problem (template fields the operator kept its own value of, the API server's
  warnings), True (`Applied`) otherwise; written when the trainer is created, and kept.
An unchanged observation gives an equal status, so the caller writes nothing.
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
from asyncrl.workloads.trainer_state import TrainerEnd, TrainerObservation

PENDING_TRAINER = "waiting for the trainer to be created"
STARTING = "waiting for the trainer pod and its gateway"
GATEWAY_CONDITION = "GatewayReachable"
AGENT_PODS_CONDITION = "AgentPodsStarting"


@dataclass(frozen=True)
class RunObservation:
    generation: int
    suspended: bool
    trainer: TrainerObservation | None  # None: the trainer Job (or RayCluster) does not exist
    gateway_reachable: bool
    summary: WindowSummary | None
    rollout_counts: Mapping[RolloutState, int] | None
    jobs_active: int
    jobs_created: int
    jobs_failed: int
    template_error: str | None
    fatal_error: str | None = None  # the run cannot succeed: phase Failed with this message
    # Agent pods that cannot start or keep crashing: (the kubelet's reason, a line naming a pod and image).
    agents_stuck: tuple[str, str] | None = None
    trainer_error: str | None = None  # the trainer's last reported (restartable) error
    waiting: str | None = None  # a prerequisite missing, or a child refused for now: Pending says it


@dataclass(frozen=True)
class TrainerCreation:
    """What the trainer's creation reported: the template fields refused, the API server's warnings."""

    refused: str | None
    warnings: list[str]


POD_TEMPLATE_CONDITION = "PodTemplateApplied"


def pod_template_report(
    current: list[Condition], creation: TrainerCreation, *, now: datetime, generation: int
) -> tuple[list[Condition], list[tuple[str, str]]]:
    """The `PodTemplateApplied` condition, and a Warning event (reason, message) per problem."""
    problems: list[tuple[str, str]] = []
    if creation.refused is not None:
        problems.append(("FieldsRefused", creation.refused))
    if creation.warnings:
        warned = " | ".join(creation.warnings)
        problems.append(
            (
                "ApiServerWarning",
                f"the API server warned about the trainer Job: {warned} (a pod the namespace's Pod Security "
                "forbids is never created: see `kubectl describe job` for FailedCreate)",
            )
        )
    condition = _condition(
        POD_TEMPLATE_CONDITION,
        not problems,
        problems[0][0] if problems else "Applied",
        "; ".join(message for _, message in problems),
        now,
        generation,
    )
    return with_condition(current, condition), [(f"PodTemplate{reason}", m) for reason, m in problems]


def phase_of(observation: RunObservation, *, was_running: bool = False) -> tuple[Phase, str]:
    """The phase the observation shows (before the terminal-stays-terminal rule of `next_status`)."""
    trainer = observation.trainer
    last_error = f"the trainer's last error: {observation.trainer_error}" if observation.trainer_error else ""
    match observation:
        case RunObservation(fatal_error=str(fatal)):
            return Phase.FAILED, fatal
        case RunObservation(trainer=TrainerObservation(ended=TrainerEnd.FAILED)):
            assert trainer is not None
            message = f"the trainer Job failed ({trainer.reason}): {trainer.message}".strip()
            if not observation.gateway_reachable and not was_running:
                message = f"{message}; its gateway never answered"
            return Phase.FAILED, f"{message}; {last_error}" if last_error else message
        case RunObservation(trainer=TrainerObservation(ended=TrainerEnd.SUCCEEDED)):
            return Phase.SUCCEEDED, "the trainer finished"
        case RunObservation(suspended=True):
            return Phase.SUSPENDED, "suspended: no new agent Jobs; the trainer is suspended"
        case RunObservation(waiting=str(waiting)) if not was_running:
            return Phase.PENDING, waiting
        case RunObservation(trainer=None) if not was_running:
            return Phase.PENDING, PENDING_TRAINER
        case RunObservation(trainer=TrainerObservation(suspended=True, suspended_by_run=False)):
            assert trainer is not None
            if was_running:
                return Phase.SUSPENDED, f"the trainer was suspended by {_holder(trainer)} (preempted?)"
            return Phase.PENDING, f"waiting for {_holder(trainer)} to admit the trainer"
        case RunObservation(gateway_reachable=True, agents_stuck=(_, str(stuck))):
            return Phase.RUNNING, f"training, but {stuck}"
        case RunObservation(gateway_reachable=True):
            return Phase.RUNNING, f"training ({last_error}; it was restarted)" if last_error else "training"
        case _ if was_running:
            missing = " (its trainer is being recreated)" if trainer is None else ""
            return Phase.RUNNING, f"training; the gateway does not answer{missing}"
        case _:
            return Phase.STARTING, STARTING


def _holder(trainer: TrainerObservation) -> str:
    """Who suspended a trainer the run did not: its Kueue queue, when it names one."""
    return f"Kueue (queue {trainer.queue})" if trainer.queue else "someone else (not this run)"


def _condition(kind: str, ok: bool, reason: str, message: str, now: datetime, generation: int) -> Condition:
    return Condition(
        type=kind,
        status=ConditionStatus.TRUE if ok else ConditionStatus.FALSE,
        reason=reason,
        message=message,
        last_transition_time=now,
        observed_generation=generation,
    )


def _end_condition_reason(kind: str, phase: Phase) -> str:
    """Why `Complete` / `Failed` is what it is: the end state reached, or NotFinished."""
    if phase.is_terminal:
        return str(phase)
    return "NotFinished"


def conditions_of(
    current: list[Condition],
    *,
    phase: Phase,
    message: str,
    observation: RunObservation,
    now: datetime,
) -> list[Condition]:
    """Every condition the operator writes but PodTemplateApplied (see the module docstring)."""
    generation = observation.generation
    conditions = list(current)
    if phase.is_terminal:
        conditions = [c for c in conditions if c.type != GATEWAY_CONDITION]
    else:
        reachable = observation.gateway_reachable
        conditions = with_condition(
            conditions,
            _condition(
                GATEWAY_CONDITION,
                reachable,
                "Reachable" if reachable else "Unreachable",
                "" if reachable else "the operator cannot reach the run's gateway (yet)",
                now,
                generation,
            ),
        )
    template_ok = observation.template_error is None
    conditions = with_condition(
        conditions,
        _condition(
            "AgentTemplateValid",
            template_ok,
            "Rendered" if template_ok else "TemplateError",
            observation.template_error or "",
            now,
            generation,
        ),
    )
    if not phase.is_terminal:
        stuck = observation.agents_stuck
        conditions = with_condition(
            conditions,
            _condition(
                AGENT_PODS_CONDITION,
                stuck is None,
                "Starting" if stuck is None else stuck[0],
                "" if stuck is None else stuck[1],
                now,
                generation,
            ),
        )
    conditions = with_condition(
        conditions, _condition("Ready", phase is Phase.RUNNING, str(phase), message, now, generation)
    )
    for kind, reached in (("Complete", Phase.SUCCEEDED), ("Failed", Phase.FAILED)):
        ok = phase is reached
        conditions = with_condition(
            conditions,
            _condition(kind, ok, _end_condition_reason(kind, phase), message if ok else "", now, generation),
        )
    return conditions


def next_status(
    current: AsyncTrainingRunStatus, observation: RunObservation, *, now: datetime
) -> AsyncTrainingRunStatus:
    if current.phase is not None and current.phase.is_terminal:
        phase, message = current.phase, current.message or str(current.phase)  # a finished run stays so
    else:
        phase, message = phase_of(observation, was_running=current.start_time is not None)
    status = current
    if observation.summary is not None:
        status = status.with_window_summary(observation.summary, now=now)
    update: dict[str, Any] = {
        "phase": phase,
        "message": message,
        "observed_generation": observation.generation,
        "conditions": conditions_of(
            list(status.conditions), phase=phase, message=message, observation=observation, now=now
        ),
        "jobs": JobCounts(
            active=observation.jobs_active, created=observation.jobs_created, failed=observation.jobs_failed
        ),
    }
    if observation.rollout_counts is not None:
        counts = {RolloutState(state): count for state, count in observation.rollout_counts.items()}
        update["rollouts"] = RolloutCounts.from_states(counts)
    if observation.trainer is not None and observation.trainer.cluster_state is not None:
        update["ray_cluster"] = observation.trainer.cluster_state
    if status.start_time is None and phase is Phase.RUNNING:
        update["start_time"] = now
    return status.model_copy(update=update)
