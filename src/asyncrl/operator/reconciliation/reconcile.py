"""The run's reconcile, level-triggered and pure: from what is observed now, what the operator does.

`reconcile(observed, now=...)` is called on every event of the run, of its trainer Job or RayCluster, of its
agent Jobs, on each gateway summary, and on a periodic requeue (`reconciler.py` does the I/O). It gives:
- the children to create: the desired ones found missing (deleted mid-run), never after the run ended;
- the trainer's suspension: suspended while `spec.suspend`, and once the run ended while the trainer would
  still hold its pods (a failed run's Job, a finished driver's RayCluster); resumed only when the run
  suspended it (a cluster suspended by someone else, e.g. Kueue, is left alone);
- whether the agents stop: once, when the run failed;
- the next status (`status.next_status`, the one state machine) and the events, a `Warning` for every failure.
Stopping is decided here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from asyncrl.api import AsyncTrainingRunStatus, Phase
from asyncrl.operator.reconciliation.status import RunObservation, next_status


class Child(StrEnum):
    """A run's children, in the order they are (re)created: what the trainer mounts comes before it."""

    KEY_SECRET = "Secret"
    CONFIG_MAP = "ConfigMap"
    SERVICE = "Service"
    TRAINER = "Trainer"  # the trainer Job, or a multi-node run's RayCluster


CREATION_ORDER = tuple(Child)


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool


@dataclass(frozen=True)
class Observed:
    status: AsyncTrainingRunStatus  # as stored (or last written)
    run: RunObservation
    missing: frozenset[Child]  # desired children found absent
    agents_stopped: bool  # the dispatcher launches nothing more and its Jobs were deleted
    # Missing children whose recreation was already said (an earlier try failed): tried again, not said again.
    announced: frozenset[Child] = frozenset()


@dataclass(frozen=True)
class Actions:
    status: AsyncTrainingRunStatus
    create: tuple[Child, ...]
    trainer_suspend: bool | None  # set the trainer's spec.suspend to this; None: leave it
    stop_agents: bool
    events: tuple[Event, ...]


def reconcile(observed: Observed, *, now: datetime) -> Actions:
    status = next_status(observed.status, observed.run, now=now)
    assert status.phase is not None
    ended = status.phase.is_terminal
    create = () if ended else tuple(child for child in CREATION_ORDER if child in observed.missing)
    events = [
        Event(
            "ChildRecreated", f"the run's {child.value} was missing (deleted?): recreating it", warning=True
        )
        for child in create
        if child not in observed.announced
    ]
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
