"""Wire models of the gateway's store API (requests and responses), shared with the typed client."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from asyncrl.gateway_api.upstreams import check_upstream_urls
from asyncrl.pause_modes import PauseMode
from asyncrl.rollouts import RolloutState

# The window summary is shared vocabulary (the API types apply it to the status); a wire model here too.
from asyncrl.window_summary import WindowSummary as WindowSummary

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$"
Mode = Literal["train", "val"]


class RolloutCreate(BaseModel):
    """One rollout to enqueue. `rollout_id` is the caller's, so creating it twice is harmless."""

    model_config = ConfigDict(extra="forbid")

    rollout_id: str = Field(pattern=ID_PATTERN)
    group_id: str = Field(pattern=ID_PATTERN)
    step: int = Field(ge=0, description="Training step the rollout's group was enqueued in.")
    input: Any = Field(default=None, description="The dataset row the agent works on.")
    timeout_seconds: float | None = Field(default=None, gt=0, description="Running longer → timed_out.")
    mode: Mode = "train"


class RolloutView(BaseModel):
    rollout_id: str
    group_id: str
    step: int
    input: Any
    mode: Mode
    state: RolloutState
    attempt_id: str | None
    timeout_seconds: float | None
    created_at: float
    started_at: float | None
    finished_at: float | None
    reward: float | None
    message: str | None
    n_model_calls: int
    launched_at: float | None = None  # when the operator launched its agent (None: not launched yet)


class Transition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: RolloutState
    message: str | None = Field(default=None, max_length=4096)
    attempt_id: str | None = Field(default=None, pattern=ID_PATTERN)
    instance_id: str | None = Field(
        default=None,
        pattern=ID_PATTERN,
        description="The gateway instance the rollout was launched through; another instance answers 409 "
        "(it restarted: this is a new rollout of the same id, not the one the outcome is about).",
    )


class ClaimRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: int = Field(default=50, ge=1, le=1000)
    wait_seconds: float = Field(default=30.0, ge=0, le=300)
    lease_seconds: float = Field(default=120.0, gt=0, le=3600)
    takeover: bool = Field(
        default=False, description="Also take rollouts leased by an earlier claimer (a restarted operator)."
    )
    claim_key: str | None = Field(
        default=None,
        pattern=ID_PATTERN,
        description=(
            "The claimer's name for this claim: a request with a key that still holds rollouts gets those "
            "same rollouts back at once (an answer lost to a reset or a timeout is asked for again, and "
            "nothing stays leased to nobody). Use a fresh key for each claim whose answer was read."
        ),
    )


class LaunchRequest(BaseModel):
    """`POST /api/rollouts/{rollout_id}/launch`: mark a queued rollout launched before its Job exists."""

    model_config = ConfigDict(extra="forbid")

    launch_id: str = Field(
        pattern=ID_PATTERN,
        description="The launcher's id for this launch; repeating it is a no-op, any other id gets 409.",
    )


class LaunchTotals(BaseModel):
    """Launches this gateway instance recorded (they survive the trainer deleting consumed rollouts)."""

    launched: int = Field(ge=0, description="Rollouts marked launched (an agent Job was submitted).")
    failed: int = Field(ge=0, description="Launched rollouts that ended failed or timed_out.")


class LaunchReceipt(BaseModel):
    """The answer to a launch: the rollout, and the gateway instance and totals it was counted in."""

    rollout: RolloutView
    instance_id: str
    totals: LaunchTotals


class CompletionEntry(BaseModel):
    """A rollout that reached a terminal state; the feed delivers each once per cursor."""

    seq: int
    rollout_id: str
    group_id: str
    step: int
    state: RolloutState
    reward: float | None
    queue_wait_seconds: float | None
    run_seconds: float | None
    message: str | None


DEFAULT_LISTING_PAGE = 1000  # rows of a `GET /api/rollouts` page without `limit`
MAX_LISTING_PAGE = 10_000


class RolloutPage(BaseModel):
    """`GET /api/rollouts`: one page of the rollouts (filtered), in creation order. Follow `next_page` until
    it is None; a walk through the pages sees each rollout at most once, and rollouts created meanwhile."""

    rollouts: list[RolloutView]
    cursor: int = Field(description="The completion feed's cursor when this page was read.")
    next_page: str | None = Field(
        default=None, description="Pass as `page` for the next page; None: this was the last page."
    )


class CompletionPage(BaseModel):
    entries: list[CompletionEntry]
    cursor: int


class DeleteRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rollout_ids: list[str] = Field(max_length=100_000)


MAX_EVENTS_BATCH_ROLLOUTS = 1024
DEFAULT_EVENTS_BATCH_BYTES = 32 * 1024 * 1024
MAX_EVENTS_BATCH_BYTES = 256 * 1024 * 1024


class EventsBatchRequest(BaseModel):
    """`POST /api/rollouts/events`: many rollouts' events documents in one answer, bounded in count and bytes.

    The answer is `{"instance_id": ..., "documents": [...], "missing": [...], "omitted": [...]}`: one document
    per rollout found (the shape of `GET /api/rollouts/{rollout_id}/events`), the ids the gateway does not
    hold, and the ids left out because the answer reached `max_bytes` (ask for them again). The first document
    is always sent, however large, so every rollout can be read.
    """

    model_config = ConfigDict(extra="forbid")

    rollout_ids: list[str] = Field(min_length=1, max_length=MAX_EVENTS_BATCH_ROLLOUTS)
    max_bytes: int = Field(
        default=DEFAULT_EVENTS_BATCH_BYTES,
        ge=1,
        le=MAX_EVENTS_BATCH_BYTES,
        description="Stop adding documents once the answer holds this many bytes.",
    )


class AgentEvent(BaseModel):
    """What agents post to /api/rollouts/{rollout_id}/attempt/{attempt_id}/events."""

    event_type: str = Field(min_length=1, max_length=64)
    data: dict[str, Any] = Field(default_factory=dict)


class PauseRequest(BaseModel):
    reason: str | None = Field(default=None, max_length=1024)
    retry_after_seconds: float = Field(
        default=5, ge=0.001, le=3600, description="Retry-After while paused (Reject mode); fractions allowed."
    )
    abort: bool = Field(
        default=False,
        description="Cancel the model calls in flight upstream at once (drain policy Abort); in Hold mode "
        "they are re-issued after the resume, in Reject mode they get 429.",
    )
    lease_seconds: float | None = Field(
        default=None,
        ge=1,
        le=86400,
        description="Resume by itself this long after the pause unless `POST /proxy/pause/renew` extends it "
        "(the trainer renews while it holds the pause); unset: paused until resumed, as in Agent Lightning.",
    )


class LeaseRenewal(BaseModel):
    """`POST /proxy/pause/renew`: extend the pause in effect; a gateway that is not paused stays open."""

    model_config = ConfigDict(extra="forbid")

    lease_seconds: float = Field(ge=1, le=86400, description="The pause now ends this long from now.")


class ResumeRequest(BaseModel):
    model_version: int | None = Field(default=None, ge=0, description="Training step of the served weights.")


class UpstreamsUpdate(BaseModel):
    """`PUT /api/upstreams`: the inference servers replacing the current set, optionally the model name."""

    model_config = ConfigDict(extra="forbid")

    upstreams: list[str] = Field(max_length=1024, description="Base URLs (http(s)://); at least one.")
    model: str | None = Field(
        default=None, min_length=1, max_length=512, description="Model name forwarded upstream; unset: kept."
    )

    @field_validator("upstreams")
    @classmethod
    def _valid_upstreams(cls, value: list[str]) -> list[str]:
        if not value:
            raise PydanticCustomError("upstreams_empty", "give at least one upstream URL")
        return list(check_upstream_urls(value))


class UpstreamsView(BaseModel):
    """The upstreams model calls go to now (empty until registered) and the model name forwarded to them."""

    upstreams: list[str]
    model: str


class TrainerOutcome(StrEnum):
    """How the trainer process ended, as it reported to the gateway before exiting."""

    FAILED = "failed"  # an error a restart may cure (the container is restarted)
    CONFIG_ERROR = "config_error"  # the run's settings are wrong; a restart cannot help
    RUN_FAILED = (
        "run_failed"  # the run cannot make progress (e.g. maxFailedSteps steps with nothing to train)
    )

    @property
    def is_permanent(self) -> bool:
        return self is not TrainerOutcome.FAILED


class TrainerReport(BaseModel):
    """The trainer's last word before it exits with an error; the operator puts it in the run's status."""

    outcome: TrainerOutcome
    message: str = Field(max_length=4096)


class PauseView(BaseModel):
    """What `/proxy/pause`, `/proxy/resume` and `/proxy/state` answer: the pause state (and drain, if waited).

    Only the fields that apply are sent (`wire()`): Hold mode adds the held calls, a call that waited for the
    drain adds the drain fields, so Reject mode's state stays Agent Lightning's byte for byte.
    """

    model_config = ConfigDict(extra="allow")

    paused: bool
    retry_after_seconds: int | float  # whole seconds as an integer, as Agent Lightning sends them
    reason: str | None
    inflight: int = Field(ge=0, description="Model calls in flight now.")
    lease_seconds_left: float | None = Field(
        default=None,
        ge=0,
        description="A pause with a lease: seconds until it resumes by itself unless renewed.",
    )
    model_version: int | None
    pause_mode: PauseMode | None = None  # Hold mode only
    held: int | None = Field(default=None, ge=0, description="Calls parked until the resume (Hold).")
    held_oldest_seconds: float | None = Field(default=None, ge=0)
    drained: bool | None = None  # with ?wait: whether the calls in flight at the pause finished in time
    inflight_at_pause: int | None = Field(default=None, ge=0)
    drain_seconds: float | None = Field(default=None, ge=0)
    aborted: int | None = Field(default=None, ge=0, description="Calls cancelled by a pause with abort.")

    def wire(self) -> dict[str, Any]:
        """The JSON body: the fields that were set, nothing more."""
        return self.model_dump(mode="json", exclude_unset=True)


class GatewayStats(PauseView):
    """`/api/stats`: rollouts by state now and finished ever, launches, the feed cursor, the trainer's report,
    and the pause state. `instance_id` changes when the gateway restarted and lost its state."""

    instance_id: str
    rollouts: dict[RolloutState, int] = Field(description="Rollouts in the store now, by state.")
    finished_totals: dict[RolloutState, int] = Field(
        description="Rollouts that ever reached each terminal state (the trainer deletes consumed ones)."
    )
    launches: LaunchTotals
    cursor: int = Field(ge=0, description="The completion feed's cursor.")
    trainer_report: TrainerReport | None = None
