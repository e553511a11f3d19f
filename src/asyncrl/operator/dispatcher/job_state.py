"""What an agent Job's status means for its rollout (as the Job watch maps it), and what was reported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncrl.rollouts import RolloutState


def rollout_state_of_job(job_status: Mapping[str, Any] | None) -> tuple[RolloutState, str | None] | None:
    """(state, message) for a Job's status, or None while it has nothing to report (not yet running).

    Complete → succeeded; Failed with DeadlineExceeded → timed_out; other Failed → failed; a ready pod →
    running. The terminal conditions win over the interim ones (FailureTarget, SuccessCriteriaMet).
    """
    status = job_status or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") == "Complete":
            return RolloutState.SUCCEEDED, None
        if condition.get("type") == "Failed":
            reason = condition.get("reason") or "Failed"
            message = f"{reason}: {condition.get('message') or 'the agent Job failed'}"
            if reason == "DeadlineExceeded":
                return RolloutState.TIMED_OUT, message
            return RolloutState.FAILED, message
    if (status.get("ready") or 0) > 0 or (status.get("succeeded") or 0) > 0:
        return RolloutState.RUNNING, None
    return None


@dataclass
class ReportBook:
    """The rollout state last reported to the gateway for each agent Job, by the Job's uid.

    By uid, not name: a rollout id launched again (the same id from a restarted trainer, on a new gateway)
    gets a Job of the same name. Keyed by name, what was reported for the old Job (running) made the new
    one's success be sent alone, which the gateway refuses for a queued rollout: the rollout stayed queued
    and the trainer waited for it for good."""

    reported: dict[str, RolloutState] = field(default_factory=dict)

    def to_report(self, job_uid: str, state: RolloutState) -> list[RolloutState]:
        """The transitions to send for `state` (none when it was sent already). Running comes before a
        success never reported running: fast agents finish before their pod was seen ready."""
        last = self.reported.get(job_uid)
        if last == state:
            return []
        if state is RolloutState.SUCCEEDED and last is not RolloutState.RUNNING:
            return [RolloutState.RUNNING, state]
        return [state]

    def record(self, job_uid: str, state: RolloutState) -> None:
        self.reported[job_uid] = state

    def forget(self, job_uid: str) -> None:
        self.reported.pop(job_uid, None)

    def clear(self) -> None:
        self.reported.clear()
