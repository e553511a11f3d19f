"""The run's reconcile, level-triggered and pure: from what is observed now, what the operator does.

`reconcile(observed, now=...)` is called on every event of the run, of its trainer Job or RayCluster, of its
agent Jobs, on each gateway summary, and on a periodic requeue (`reconciler.py` does the I/O). It gives:
- the children to create: the desired ones found missing (at the start, or deleted mid-run), never after the
  run ended; what the last attempt to create one reported (`Refusal`) is said once in a Warning event, and one
  policy holds at the start and mid-run alike: a child refused for good (the object is invalid, the spec must
  change) fails the run with the API server's reason, any other refusal (a quota, a missing permission, the
  API server away) leaves the run Pending saying so, and is tried again at every requeue;
- the `PodTemplateApplied` condition and its Warning events, from what the trainer's creation reported;
- the trainer's suspension: suspended while `spec.suspend`, and once the run ended while the trainer would
  still hold its pods (a failed run's Job, a finished driver's RayCluster); resumed only when the run
  suspended it (a cluster suspended by someone else, e.g. Kueue, is left alone);
- whether the agents stop: once, when the run failed;
- the next status (`status.next_status`, the one state machine) and the events, a `Warning` for every failure.
Stopping is decided here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import StrEnum

from asyncrl.api import AsyncTrainingRunStatus, Phase
from asyncrl.operator.reconciliation.status import (
    RunObservation,
    TrainerCreation,
    next_status,
    pod_template_report,
)


class Child(StrEnum):
    """A run's children, in the order they are (re)created: what the trainer mounts comes before it, and an
    agents.mode Pool run's pool (which reads the gateway key) after it."""

    KEY_SECRET = "Secret"
    CONFIG_MAP = "ConfigMap"
    SERVICE = "Service"
    TRAINER = "Trainer"  # the trainer Job, or a multi-node run's RayCluster
    POOL_SECRET = "agent pool's Secret"
    AGENT_POOL = "agent pool"  # its Deployment


def child_text(child: Child, *, multi_node: bool) -> str:
    """How a message names a child: "the run's trainer Job" (a multi-node run's: "the run's RayCluster"),
    "the run's Service". The enum's values are keys and stay as they are."""
    if child is Child.TRAINER:
        return "the run's RayCluster" if multi_node else "the run's trainer Job"
    return f"the run's {child.value}"


CREATION_ORDER = tuple(Child)


class Prerequisite(StrEnum):
    """What the run's children are built from and the user may create after the run: read, not created."""

    TEMPLATE = "agent template"  # spec.agents.template.configMapRef
    GATEWAY_KEY = "gateway key"  # the key Secret (spec.gateway.keySecretRef, or the run's own)


Problem = Child | Prerequisite


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool


@dataclass(frozen=True)
class Refusal:
    """What the last attempt to create a child reported, when it was not created."""

    reason: str  # the Warning event's reason, e.g. TrainerJobRejected, ChildRecreateFailed, WaitingForClaim
    message: str  # one line, with the API server's own reason
    permanent: bool  # the child can never be created as the spec stands: the run fails


@dataclass(frozen=True)
class Observed:
    status: AsyncTrainingRunStatus  # as stored (or last written)
    run: RunObservation
    missing: frozenset[Child]  # desired children found absent
    agents_stopped: bool  # the dispatcher launches nothing more and its Jobs were deleted
    # Missing children whose (re)creation was already said (an earlier try failed), and refusals already said:
    # tried again, not said again.
    announced: frozenset[Problem] = frozenset()
    # Missing children this operator process never saw: created at the run's (or the operator's) start, which
    # is no recreation and is not warned about.
    first_creation: frozenset[Child] = frozenset()
    # The last answer for each child not created and each prerequisite not read; said once (`announced`).
    refused: Mapping[Problem, Refusal] = field(default_factory=dict)
    trainer_created: TrainerCreation | None = None  # the trainer was just created: what it reported
    multi_node: bool = False  # spec.trainer.nodes > 1: the trainer is a RayCluster (named so in messages)


@dataclass(frozen=True)
class Actions:
    status: AsyncTrainingRunStatus
    create: tuple[Child, ...]
    trainer_suspend: bool | None  # set the trainer's spec.suspend to this; None: leave it
    stop_agents: bool
    events: tuple[Event, ...]


def reconcile(observed: Observed, *, now: datetime) -> Actions:
    status = next_status(observed.status, _with_refusals(observed), now=now)
    assert status.phase is not None
    ended = status.phase.is_terminal
    create = () if ended else tuple(child for child in CREATION_ORDER if child in observed.missing)
    said = observed.announced
    events = [
        Event(refusal.reason, refusal.message, warning=True)
        for problem, refusal in observed.refused.items()
        if problem not in said
    ]
    events += [
        Event(
            "ChildRecreated",
            f"{child_text(child, multi_node=observed.multi_node)} was missing (deleted?): recreating it",
            warning=True,
        )
        for child in create
        if child not in said and child not in observed.refused and child not in observed.first_creation
    ]
    if observed.trainer_created is not None:
        conditions, problems = pod_template_report(
            status.conditions, observed.trainer_created, now=now, generation=observed.run.generation
        )
        status = status.model_copy(update={"conditions": conditions})
        events += [Event(reason, message, warning=True) for reason, message in problems]
    if status.phase != observed.status.phase:
        failed = status.phase is Phase.FAILED
        events.append(Event(f"Phase{status.phase}", status.message or str(status.phase), warning=failed))
    return Actions(
        status=status,
        create=create,
        trainer_suspend=_trainer_suspend(observed, ended=ended),
        stop_agents=status.phase is Phase.FAILED and not observed.agents_stopped,
        events=tuple(events),
    )


def invalid_spec(
    current: AsyncTrainingRunStatus, message: str
) -> tuple[AsyncTrainingRunStatus, tuple[Event, ...]] | None:
    """A spec only this operator refuses: Failed with the reason and one Warning event; None for a run that
    failed already (said then; an operator restart reads it again)."""
    if current.phase is Phase.FAILED:
        return None
    failed = current.model_copy(update={"phase": Phase.FAILED, "message": f"invalid spec: {message}"})
    return failed, (Event("InvalidSpec", message, warning=True),)


def _with_refusals(observed: Observed) -> RunObservation:
    """The observation with what the children's creation reported: the first refusal for good fails the run,
    another one is what the run waits for while it has no trainer."""
    run = observed.run
    order: tuple[Problem, ...] = (*Prerequisite, *CREATION_ORDER)
    refusals = [observed.refused[problem] for problem in order if problem in observed.refused]
    permanent = next((r.message for r in refusals if r.permanent), None)
    passing = next((r.message for r in refusals if not r.permanent), None)
    return replace(run, fatal_error=run.fatal_error or permanent, waiting=run.waiting or passing)


def _trainer_suspend(observed: Observed, *, ended: bool) -> bool | None:
    trainer = observed.run.trainer
    if trainer is None:
        return None
    # An ended Job holds no pods; an ended driver's RayCluster keeps every node (and GPUs) until suspended.
    holds_pods = trainer.ended is None or trainer.cluster_state is not None
    want = observed.run.suspended or (ended and holds_pods)
    if want == trainer.suspended:
        return None
    if not want and not trainer.suspended_by_run:
        return None
    return want
