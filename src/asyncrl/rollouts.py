"""Rollout states and their transitions: the one vocabulary shared by gateway, operator and trainer.

A rollout is one agent episode. It is created `queued`, becomes `running` when its agent Job's pod runs, and
ends in exactly one terminal state. Any non-terminal rollout may be `cancelled` (a stale group, a deleted
run). Terminal states never change again.
"""

from __future__ import annotations

from enum import StrEnum


class RolloutState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset(
    {RolloutState.SUCCEEDED, RolloutState.FAILED, RolloutState.TIMED_OUT, RolloutState.CANCELLED}
)

# Allowed transitions (from → to). Re-entering the same state is an idempotent no-op, handled by callers.
_TRANSITIONS: dict[RolloutState, frozenset[RolloutState]] = {
    RolloutState.QUEUED: frozenset(
        {RolloutState.RUNNING, RolloutState.FAILED, RolloutState.TIMED_OUT, RolloutState.CANCELLED}
    ),
    RolloutState.RUNNING: frozenset(
        {RolloutState.SUCCEEDED, RolloutState.FAILED, RolloutState.TIMED_OUT, RolloutState.CANCELLED}
    ),
}


def can_transition(current: RolloutState, target: RolloutState) -> bool:
    """Whether `current → target` is valid (queued → running → terminal; non-terminal → cancelled)."""
    return target in _TRANSITIONS.get(current, frozenset())
