"""The status of an AsyncTrainingRun: the one summary of a run's progress, written only by the operator.

`kubectl get atr` reads it through the printer columns, so it carries the six per-step window metrics under
the names the CRD shows. The helpers here are pure (no clock, no I/O) so that the operator can compute the
next status, compare it with the stored one, and write only when something changed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from pydantic import AwareDatetime, Field

from asyncrl.api.types.meta import ApiModel
from asyncrl.rollouts import RolloutState
from asyncrl.window_summary import WindowSummary


class Phase(StrEnum):
    """Where a run is in its life."""

    PENDING = "Pending"  # accepted; child objects not created yet
    STARTING = "Starting"  # trainer pod and gateway starting, model loading
    RUNNING = "Running"  # rollouts and updates under way
    SUCCEEDED = "Succeeded"  # reached totalSteps or the end of the data
    FAILED = "Failed"  # stopped by an error the operator cannot recover from
    SUSPENDED = "Suspended"  # spec.suspend is true

    @property
    def is_terminal(self) -> bool:
        """A terminal run never changes phase again; its children are only cleaned up."""
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(ApiModel):
    """One aspect of the run's state, as in metav1.Condition."""

    type: str = Field(
        min_length=1,
        description=(
            "What the condition is about, in CamelCase: `Ready`, `Complete`, `Failed`, `GatewayReachable`, "
            "`AgentTemplateValid`, `AgentPodsStarting` or `PodTemplateApplied`."
        ),
    )
    status: ConditionStatus = Field(description="`True`, `False` or `Unknown`.")
    reason: str = Field(min_length=1, description="Why the condition has this status, in CamelCase.")
    message: str = Field(default="", description="Details for people.")
    last_transition_time: AwareDatetime = Field(description="When the status last changed.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec the condition was computed from."
    )


def with_condition(conditions: Sequence[Condition], condition: Condition) -> list[Condition]:
    """`conditions` with `condition` set in place of the one of its type.

    The stored lastTransitionTime is kept while the status does not change, so that re-asserting a condition
    leaves the status as it was (and the operator writes nothing).
    """
    updated: list[Condition] = []
    found = False
    for current in conditions:
        if current.type != condition.type:
            updated.append(current)
            continue
        found = True
        if current.status == condition.status:
            condition = condition.model_copy(update={"last_transition_time": current.last_transition_time})
        updated.append(condition)
    if not found:
        updated.append(condition)
    return updated


class RolloutCounts(ApiModel):
    """Rollouts of the run by state, as the gateway's store counts them."""

    queued: int = Field(default=0, ge=0, description="Created, agent Job not running yet.")
    running: int = Field(default=0, ge=0, description="Agent Job running.")
    succeeded: int = Field(default=0, ge=0, description="Finished with a reward.")
    failed: int = Field(default=0, ge=0, description="Agent failed.")
    timed_out: int = Field(default=0, ge=0, description="Not finished within rolloutTimeoutSeconds.")
    cancelled: int = Field(default=0, ge=0, description="Cancelled (stale group, suspended or deleted run).")

    @classmethod
    def from_states(cls, counts: Mapping[RolloutState, int]) -> RolloutCounts:
        """Counts keyed by rollout state (e.g. a Counter of states) as status counts."""
        return cls(**{state.name.lower(): counts.get(state, 0) for state in RolloutState})


class JobCounts(ApiModel):
    """Agent Jobs of the run."""

    active: int = Field(default=0, ge=0, description="Agent Jobs that have not finished.")
    created: int = Field(default=0, ge=0, description="Agent Jobs created since the run started.")
    failed: int = Field(default=0, ge=0, description="Agent Jobs that failed.")


class RewardSummary(ApiModel):
    """The reward the updates trained on: is the policy learning?"""

    last: float = Field(description="Mean reward of the rows the last update trained on.")
    best: float = Field(description="The highest `last` of the run so far.")


# What `kubectl get atr` shows of the floats (it prints a number column as stored: 0.005208333333333333).
REWARD_DIGITS = 4
DRAIN_DIGITS = 3  # milliseconds


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def progress_of(step: int, total_steps: int | None) -> str:
    """Updates done, 1-based, of the total when there is one: step 2 (0-based) of 16 is `3/16`."""
    done = step + 1
    return f"{done}/{total_steps}" if total_steps is not None else str(done)


class AsyncTrainingRunStatus(ApiModel):
    """Progress of the run; the operator is its only writer."""

    phase: Phase | None = Field(
        default=None, description="Pending, Starting, Running, Succeeded, Failed or Suspended."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec this status reflects."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Detailed state, one condition per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    step: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Last completed update's step number, counted from 0 as in the trainer's log and metrics: 15 "
            "once the 16th update is done (`progress`, STEPS, counts from 1: `16/16`)."
        ),
    )
    progress: str | None = Field(
        default=None,
        description=(
            "Updates done of spec.totalSteps, counted from 1: `3/16`, and `16/16` once a 16-step run is "
            "done; just the count (`3`) for an open-ended run. `kubectl get atr` shows it as STEPS."
        ),
    )
    reward: RewardSummary | None = Field(
        default=None, description="The last update's mean reward and the best so far (REWARD, BEST)."
    )
    prev_carry_over_rollouts: int | None = Field(
        default=None, ge=0, description="Rollouts in the window when the last step began."
    )
    completed_rollouts: int | None = Field(
        default=None, ge=0, description="Rollouts in the groups the last update trained on."
    )
    new_carry_over_rollouts: int | None = Field(
        default=None, ge=0, description="Rollouts in the groups the last update carried over."
    )
    carry_over_age_max_steps: int | None = Field(
        default=None, ge=0, description="Age, in updates, of the oldest group the last update carried over."
    )
    proxy_inflight_at_pause: int | None = Field(
        default=None, ge=0, description="Model calls in flight when the gateway paused for the last update."
    )
    proxy_drain_seconds: float | None = Field(
        default=None, ge=0, description="Seconds the gateway took to drain them."
    )
    proxy_aborted_calls: int | None = Field(
        default=None,
        ge=0,
        description="Of those, calls cancelled at the pause (drain policy Abort); Hold re-issues them.",
    )
    carry_over_age_histogram: dict[str, int] | None = Field(
        default=None, description="Carried-over groups by age in updates, after the last update."
    )
    active_groups: int | None = Field(default=None, ge=0, description="Prompt groups in the window now.")
    rollouts: RolloutCounts | None = Field(default=None, description="Rollouts by state.")
    jobs: JobCounts | None = Field(default=None, description="Agent Jobs.")
    start_time: AwareDatetime | None = Field(default=None, description="When the trainer started.")
    last_step_time: AwareDatetime | None = Field(default=None, description="When the last update finished.")
    ray_cluster: str | None = Field(
        default=None,
        description=(
            "KubeRay's state of the trainer's RayCluster (trainer.nodes > 1), e.g. "
            "`ready (1/1 workers ready)`."
        ),
    )
    message: str | None = Field(default=None, description="What the run is doing or why it stopped.")

    def with_window_summary(self, summary: WindowSummary, *, now: AwareDatetime) -> AsyncTrainingRunStatus:
        """This status with the trainer's window summary (the gateway's /api/window/summary) applied.

        Fields the summary does not report (None) keep their value. lastStepTime becomes `now` only when the
        step advanced, so an unchanged summary changes nothing.
        """
        update: dict[str, Any] = {}
        if summary.step != self.step:
            update["step"] = summary.step
            update["last_step_time"] = now
        reported = {
            "prev_carry_over_rollouts": summary.prev_carry_over_rollouts,
            "completed_rollouts": summary.completed_rollouts,
            "new_carry_over_rollouts": summary.new_carry_over_rollouts,
            "carry_over_age_max_steps": summary.carry_over_age_max_steps,
            "proxy_inflight_at_pause": summary.proxy_inflight_at_pause,
            "proxy_drain_seconds": _rounded(summary.proxy_drain_seconds, DRAIN_DIGITS),
            "proxy_aborted_calls": summary.proxy_aborted_calls,
        }
        update.update({name: value for name, value in reported.items() if value is not None})
        update["progress"] = progress_of(summary.step, summary.total_steps)
        if summary.reward_mean is not None and math.isfinite(summary.reward_mean):
            last = round(summary.reward_mean, REWARD_DIGITS)
            best = last if self.reward is None else max(self.reward.best, last)
            update["reward"] = RewardSummary(last=last, best=best)
        update["carry_over_age_histogram"] = dict(summary.carry_over_age_histogram)
        update["active_groups"] = summary.active_groups
        return self.model_copy(update=update)
