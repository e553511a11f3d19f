"""The window summary: what the trainer reports after each step, on the wire as explicit typed fields.

The trainer puts it to the gateway (`PUT /api/window/summary`); the operator long-polls it and writes the
run's status from it (`AsyncTrainingRunStatus.with_window_summary`), and local mode prints it. It is part of
the shared vocabulary (a leaf: no imports from the rest of the package) because the API types apply it.
Field names are those of the run's status, so no side maps metric names (`training/async/...`, which stay
the names of the W&B and Prometheus metrics) back to fields, and counts stay integers end to end.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class WindowSummary(BaseModel):
    """The trainer's summary of its last step; the operator turns it into the run's status.

    A field left None was not reported (an older trainer, a stand-in); the status keeps its value then.
    """

    model_config = ConfigDict(extra="allow")

    step: int = Field(ge=0, description="The step just completed (0-based optimizer step).")
    active_groups: int = Field(default=0, ge=0, description="Prompt groups in the window after the step.")
    carry_over_age_histogram: dict[str, int] = Field(
        default_factory=dict, description="Carried-over groups by age in updates (age as a string key)."
    )
    prev_carry_over_rollouts: int | None = Field(
        default=None, ge=0, description="Rollouts in the window when the step began."
    )
    completed_rollouts: int | None = Field(
        default=None, ge=0, description="Rollouts in the groups the update trained on."
    )
    new_carry_over_rollouts: int | None = Field(
        default=None, ge=0, description="Rollouts in the groups the update carried over."
    )
    carry_over_age_max_steps: int | None = Field(
        default=None, ge=0, description="Age, in updates, of the oldest group carried over."
    )
    proxy_inflight_at_pause: int | None = Field(
        default=None, ge=0, description="Model calls in flight when the gateway paused for the update."
    )
    proxy_drain_seconds: float | None = Field(default=None, ge=0, description="Seconds the drain took.")
    proxy_aborted_calls: int | None = Field(
        default=None, ge=0, description="Calls in flight at the pause cancelled (drain policy Abort)."
    )
    reward_mean: float | None = Field(default=None, description="Mean reward of the rows the update used.")
    step_seconds: float | None = Field(default=None, ge=0, description="Wall time of the whole step.")
    total_steps: int | None = Field(
        default=None, ge=1, description="Updates the run makes (spec.totalSteps); None: open-ended."
    )
    steps_in_process: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Updates the trainer process made so far, this one included: 1 on the first after it started or "
            "restarted, whose `step_seconds` leaves out the time the restart took."
        ),
    )
    posted: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Set by the gateway, not the trainer: this summary's number among those the gateway received "
            "(1, 2, ...). Each is one update: a step redone after a trainer restart comes again, renumbered."
        ),
    )
