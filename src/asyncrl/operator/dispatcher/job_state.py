"""What an agent Job's status means for its rollout: the mapping the Job watch applies."""

from __future__ import annotations

from collections.abc import Mapping
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
