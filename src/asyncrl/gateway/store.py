"""The rollout store: rollouts, their state machine, captured events, and the feeds that replace polling.

Three consumers wait on it instead of polling: the operator long-polls `claim()` for queued rollouts, the
trainer long-polls `completions()` for terminal ones (each delivered once per cursor), and the operator
long-polls `summary_after()` for the trainer's step summary. All methods run on the gateway's event loop.
Memory is bounded: the trainer deletes consumed rollouts, a rollout keeps at most `max_events_per_rollout`
model calls and as many agent events, those events hold at most `max_event_bytes` of data, and the
completion feed keeps the last `max_feed_entries` entries, and captured model calls hold at most
`max_capture_bytes_per_rollout` per rollout and `max_capture_bytes` in all (a call past either is refused
before it is forwarded, see `check_capture_room`). Agent events are accepted only while their rollout
is queued or running, and only from its attempt, so a finished result never changes.

A rollout is also its own launch record: `launch()` marks it launched (an agent Job is being created for it)
exactly once, before the operator creates the Job, and a launched rollout is never claimed again. That is
what makes agent launches at-most-once across operator restarts, whatever the Jobs' TTL: the operator's own
memory and the Jobs themselves may vanish, this record does not while the gateway lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
import uuid
from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncrl.capturing import DEFAULT_MAX_CAPTURE_BYTES, DEFAULT_MAX_CAPTURE_BYTES_PER_ROLLOUT
from asyncrl.gateway.listing import ListingOrder, Page
from asyncrl.gateway_api.models import (
    CompletionEntry,
    LaunchTotals,
    Mode,
    RolloutCreate,
    RolloutView,
    TrainerReport,
    WindowSummary,
)
from asyncrl.rollouts import RolloutState, can_transition


class RolloutNotFound(KeyError):
    def __init__(self, rollout_id: str) -> None:
        super().__init__(rollout_id)
        self.rollout_id = rollout_id

    def __str__(self) -> str:
        return f"rollout {self.rollout_id!r} not found"


class RolloutConflict(ValueError):
    """A create that disagrees with the stored rollout, or an invalid state transition (HTTP 409)."""


class AlreadyLaunched(RolloutConflict):
    """A launch of a rollout launched before under another launch id, or no longer queued (HTTP 409)."""


class RolloutFinished(RolloutConflict):
    """An event for a rollout that already reached a terminal state (HTTP 409): its result is final."""


class UnknownAttempt(LookupError):
    """An event from an attempt the rollout never had (HTTP 404)."""


class EventRejected(ValueError):
    """An event the store refuses (a reward that is no finite number: 422; over a limit: 413)."""

    def __init__(self, message: str, *, status: int, field: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.reason = reason


class CaptureFull(Exception):
    """A model call refused because its rollout (HTTP 413) or the whole store (HTTP 507) holds as many
    captured bytes as its limit allows; `limit` is `rollout` or `store` (the metric's label)."""

    def __init__(self, message: str, *, status: int, limit: str) -> None:
        super().__init__(message)
        self.status = status
        self.limit = limit


class FeedGap(LookupError):
    """The cursor is older than the retained feed; the caller must resync from the rollout listing (410)."""


# How many rollouts one listing page may look at (at least): a filtered page stops there, short, so no page
# costs the loop more than a few milliseconds.
LISTING_MIN_SCANNED = 20_000

# What a stored call costs besides its arrays and bodies: the object, its strings, its dict (measured
# roughly with sys.getsizeof; it keeps the byte limits honest for calls without tokens).
CALL_OVERHEAD_BYTES = 512


@dataclass(slots=True)
class CapturedCall:
    """One proxied model call as the store keeps it (see `capture.capture_call`): token ids and log-probs
    packed in arrays; the request and response JSON only in `Full` capture."""

    attempt_id: str
    path: str
    status: int
    latency_seconds: float
    model_version: int | None
    started_at: float
    choice_index: int = 0  # which of the answer's choices (n > 1, several prompts): one record each
    prompt_token_ids: Sequence[int] | None = None
    response_token_ids: Sequence[int] | None = None
    response_logprobs: Sequence[float] | None = None
    agent_sampling: dict[str, Any] | None = None  # the agent's own settings, when the run's replaced them
    aborted: bool = False  # abandoned by the agent, or aborted by vLLM: kept for inspection, never trained on
    request_body: bytes | None = None  # Full capture only
    response_body: bytes | None = None  # Full capture only
    unreadable: str | None = None  # why part of the call is missing (not captured, or not readable)

    @property
    def size_bytes(self) -> int:
        """What the call holds in memory, roughly: what the capture limits count."""
        size = CALL_OVERHEAD_BYTES + len(self.request_body or b"") + len(self.response_body or b"")
        for values in (self.prompt_token_ids, self.response_token_ids, self.response_logprobs):
            if isinstance(values, array):
                size += values.itemsize * len(values)
            elif values is not None:
                size += 36 * len(values)  # a tuple of Python ints (ids past 2**63)
        return size

    def without_tokens(self, reason: str) -> CapturedCall:
        """The call's metadata only, saying why its tokens are not kept."""
        return CapturedCall(
            attempt_id=self.attempt_id,
            path=self.path,
            status=self.status,
            latency_seconds=self.latency_seconds,
            model_version=self.model_version,
            started_at=self.started_at,
            choice_index=self.choice_index,
            agent_sampling=self.agent_sampling,
            aborted=self.aborted,
            unreadable=reason,
        )


@dataclass
class Rollout:
    rollout_id: str
    group_id: str
    step: int
    input: Any
    mode: Mode
    timeout_seconds: float | None
    created_at: float
    state: RolloutState = RolloutState.QUEUED
    attempt_id: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    posted_reward: float | None = None
    posted_reward_attempt_id: str | None = None
    message: str | None = None
    claimed_until: float = 0.0
    claim_key: str | None = None  # the claim that holds (or last held) the lease, when it named itself
    listing_position: int = 0  # where the rollout stands in the listing's order (`listing.py`)
    launched_at: float | None = None
    launch_id: str | None = None
    calls: deque[CapturedCall] = field(default_factory=deque)
    events: list[dict[str, Any]] = field(default_factory=list)
    event_bytes: int = 0
    capture_bytes: int = 0  # what `calls` hold (`CapturedCall.size_bytes` summed)
    capture_full: bool = False  # a call passed the per-rollout capture limit: later calls are refused
    timeout_handle: asyncio.TimerHandle | None = None

    @property
    def reward(self) -> float | None:
        """The last reward posted by the rollout's attempt; one from another attempt never counts.

        An agent may post before the operator reports its rollout running (a fast agent), so the attempt
        is not always known when the reward arrives; it is checked again here once it is.
        """
        if self.attempt_id is not None and self.posted_reward_attempt_id != self.attempt_id:
            return None
        return self.posted_reward

    def same_request(self, request: RolloutCreate) -> bool:
        return (self.group_id, self.step, self.input, self.mode, self.timeout_seconds) == (
            request.group_id,
            request.step,
            request.input,
            request.mode,
            request.timeout_seconds,
        )

    def view(self) -> RolloutView:
        return RolloutView(
            rollout_id=self.rollout_id,
            group_id=self.group_id,
            step=self.step,
            input=self.input,
            mode=self.mode,
            state=self.state,
            attempt_id=self.attempt_id,
            timeout_seconds=self.timeout_seconds,
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            reward=self.reward,
            message=self.message,
            n_model_calls=len(self.calls),
            launched_at=self.launched_at,
        )


class _Signal:
    """Wake every current waiter once; later waiters wait for the next change."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=timeout)


class RolloutStore:
    def __init__(
        self,
        *,
        max_events_per_rollout: int = 512,
        max_feed_entries: int = 100_000,
        max_event_bytes: int = 1024 * 1024,
        max_capture_bytes_per_rollout: int = DEFAULT_MAX_CAPTURE_BYTES_PER_ROLLOUT,
        max_capture_bytes: int = DEFAULT_MAX_CAPTURE_BYTES,
    ) -> None:
        self.max_events_per_rollout = max_events_per_rollout
        self.max_event_bytes = max_event_bytes
        self.max_capture_bytes_per_rollout = max_capture_bytes_per_rollout
        self.max_capture_bytes = max_capture_bytes
        self.capture_bytes = 0  # what every rollout's calls hold (`CapturedCall.size_bytes` summed)
        self._capture_full = False  # a call found the store full; cleared when the trainer frees space
        # Identifies this store's lifetime: a client that sees it change knows the gateway restarted and
        # everything it held (rollouts, feed cursor, upstreams) is gone.
        self.instance_id = uuid.uuid4().hex
        self._rollouts: dict[str, Rollout] = {}
        self._listing: ListingOrder[Rollout] = ListingOrder()
        self._feed: deque[CompletionEntry] = deque(maxlen=max_feed_entries)
        self._next_seq = 1
        self.finished_totals: dict[RolloutState, int] = {}  # terminal transitions ever, survives deletion
        self.launch_totals = LaunchTotals(launched=0, failed=0)  # launches ever, survives deletion
        self._queued_signal = _Signal()
        self._feed_signal = _Signal()
        self._summary_signal = _Signal()
        self._summary: WindowSummary | None = None
        self._summaries_posted = 0
        self.trainer_report: TrainerReport | None = None

    # -- rollouts -----------------------------------------------------------------------------------------

    def create(self, requests: Iterable[RolloutCreate]) -> list[Rollout]:
        """Create rollouts; re-creating one with the same content is a no-op. All or nothing."""
        requests = list(requests)
        seen: set[str] = set()
        for request in requests:
            if request.rollout_id in seen:
                raise RolloutConflict(f"rollout {request.rollout_id!r} appears twice in one request")
            seen.add(request.rollout_id)
            existing = self._rollouts.get(request.rollout_id)
            if existing is not None and not existing.same_request(request):
                raise RolloutConflict(
                    f"rollout {request.rollout_id!r} exists with different content; use a new rollout_id"
                )
        now = time.time()
        created = []
        for request in requests:
            rollout = self._rollouts.get(request.rollout_id)
            if rollout is None:
                rollout = Rollout(
                    rollout_id=request.rollout_id,
                    group_id=request.group_id,
                    step=request.step,
                    input=request.input,
                    mode=request.mode,
                    timeout_seconds=request.timeout_seconds,
                    created_at=now,
                )
                self._rollouts[request.rollout_id] = rollout
                rollout.listing_position = self._listing.add(rollout)
            created.append(rollout)
        if requests:
            self._queued_signal.fire()
        return created

    def find(self, rollout_id: str) -> Rollout | None:
        return self._rollouts.get(rollout_id)

    def get(self, rollout_id: str) -> Rollout:
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            raise RolloutNotFound(rollout_id)
        return rollout

    def select(self, *, state: RolloutState | None = None, group_id: str | None = None) -> list[Rollout]:
        return [
            rollout
            for rollout in self._rollouts.values()
            if (state is None or rollout.state == state)
            and (group_id is None or rollout.group_id == group_id)
        ]

    def list_page(
        self, *, state: RolloutState | None, group_id: str | None, after: int, limit: int
    ) -> Page[Rollout]:
        """One page of the listing (`GET /api/rollouts`): up to `limit` rollouts (filtered) created after
        listing position `after`, in creation order; its work is bounded whatever the store holds."""

        def keep(rollout: Rollout) -> bool:
            return (state is None or rollout.state == state) and (
                group_id is None or rollout.group_id == group_id
            )

        return self._listing.page(
            after=after, limit=limit, max_scanned=max(limit, LISTING_MIN_SCANNED), keep=keep
        )

    def counts_by_state(self) -> dict[RolloutState, int]:
        counts = dict.fromkeys(RolloutState, 0)
        for rollout in self._rollouts.values():
            counts[rollout.state] += 1
        return counts

    def delete(self, rollout_ids: Iterable[str]) -> int:
        deleted = 0
        for rollout_id in rollout_ids:
            rollout = self._rollouts.pop(rollout_id, None)
            if rollout is not None:
                self._listing.remove(rollout.listing_position)
                self._free_capture(rollout.capture_bytes)
                if rollout.timeout_handle is not None:
                    rollout.timeout_handle.cancel()
                deleted += 1
        return deleted

    async def claim(
        self,
        *,
        limit: int,
        wait_seconds: float,
        lease_seconds: float,
        takeover: bool = False,
        claim_key: str | None = None,
    ) -> list[Rollout]:
        """Queued, never launched rollouts nobody holds a lease on, waiting up to `wait_seconds` for one.

        A claim is a lease, not a state change: if the claimer dies before it launched the rollout, the
        rollout is offered again when the lease ends. A launched rollout is never offered again.

        A claim named by `claim_key` is idempotent: while rollouts it took are still queued, unlaunched and
        not taken by another claim since, a claim with the same key gets those rollouts back at once, their
        lease renewed, and takes no others. So a claimer whose answer was lost (a reset connection, a client
        timeout) asks again with the same key and loses nothing; at-most-once launches still rest on `launch`.
        """
        deadline = time.monotonic() + wait_seconds
        while True:
            # Checked on every wake-up: a request with the same key may have claimed while this one waited.
            now = time.time()
            held = self._held_by(claim_key) if claim_key is not None else []
            if held:
                for rollout in held:
                    rollout.claimed_until = now + lease_seconds
                return held
            claimed = []
            for rollout in self._rollouts.values():
                if (
                    rollout.state == RolloutState.QUEUED
                    and rollout.launched_at is None
                    and (takeover or rollout.claimed_until <= now)
                ):
                    rollout.claimed_until = now + lease_seconds
                    rollout.claim_key = claim_key
                    claimed.append(rollout)
                    if len(claimed) >= limit:
                        break
            remaining = deadline - time.monotonic()
            if claimed and claim_key is not None:
                self._queued_signal.fire()  # a request with the same key waiting now returns these
            if claimed or remaining <= 0:
                return claimed
            await self._queued_signal.wait(remaining)

    def release(self, claimed: Iterable[Rollout]) -> int:
        """Give back the leases of a claim whose answer will never be read (its claimer is gone): rollouts
        still queued and unlaunched are offered again at once instead of when the lease ends."""
        released = 0
        for rollout in claimed:
            if rollout.state == RolloutState.QUEUED and rollout.launched_at is None and rollout.claimed_until:
                rollout.claimed_until = 0.0
                rollout.claim_key = None
                released += 1
        if released:
            self._queued_signal.fire()
        return released

    def _held_by(self, claim_key: str) -> list[Rollout]:
        """The rollouts the claim `claim_key` took that it may still launch."""
        return [
            rollout
            for rollout in self._rollouts.values()
            if rollout.claim_key == claim_key
            and rollout.state == RolloutState.QUEUED
            and rollout.launched_at is None
        ]

    def launch(self, rollout_id: str, *, launch_id: str) -> Rollout:
        """Record that an agent is being launched for this queued rollout; at most one launch id ever wins.

        Repeating the call with the winning `launch_id` is a no-op (a retry whose answer was lost); any other
        launch id, or a rollout that is no longer queued, raises `AlreadyLaunched`.
        """
        rollout = self.get(rollout_id)
        if rollout.launched_at is not None:
            if rollout.launch_id == launch_id:
                return rollout
            raise AlreadyLaunched(
                f"rollout {rollout_id!r} was already launched (launch {rollout.launch_id}); "
                "a rollout is launched at most once"
            )
        if rollout.state is not RolloutState.QUEUED:
            raise AlreadyLaunched(f"rollout {rollout_id!r} is {rollout.state}, not queued; nothing to launch")
        rollout.launched_at = time.time()
        rollout.launch_id = launch_id
        self.launch_totals = self.launch_totals.model_copy(
            update={"launched": self.launch_totals.launched + 1}
        )
        return rollout

    def transition(
        self, rollout_id: str, target: RolloutState, *, message: str | None, attempt_id: str | None
    ) -> Rollout:
        rollout = self.get(rollout_id)
        if rollout.state == target:
            return rollout  # idempotent: the operator may report the same state again after a restart
        if not can_transition(rollout.state, target):
            raise RolloutConflict(f"rollout {rollout_id!r} cannot go from {rollout.state} to {target}")
        now = time.time()
        rollout.state = target
        if message is not None:
            rollout.message = message
        if attempt_id is not None:
            rollout.attempt_id = attempt_id
        if target == RolloutState.RUNNING:
            rollout.started_at = now
            if rollout.timeout_seconds is not None:
                loop = asyncio.get_running_loop()
                rollout.timeout_handle = loop.call_later(rollout.timeout_seconds, self._expire, rollout_id)
        elif target.is_terminal:
            rollout.finished_at = now
            if rollout.launched_at is not None and target in (RolloutState.FAILED, RolloutState.TIMED_OUT):
                self.launch_totals = self.launch_totals.model_copy(
                    update={"failed": self.launch_totals.failed + 1}
                )
            if rollout.timeout_handle is not None:
                rollout.timeout_handle.cancel()
                rollout.timeout_handle = None
            self._append_completion(rollout)
        return rollout

    def _expire(self, rollout_id: str) -> None:
        rollout = self._rollouts.get(rollout_id)
        if rollout is not None and rollout.state == RolloutState.RUNNING:
            self.transition(
                rollout_id,
                RolloutState.TIMED_OUT,
                message=f"no terminal state within timeout_seconds={rollout.timeout_seconds}",
                attempt_id=None,
            )

    # -- completion feed ----------------------------------------------------------------------------------

    def _append_completion(self, rollout: Rollout) -> None:
        self.finished_totals[rollout.state] = self.finished_totals.get(rollout.state, 0) + 1
        queue_wait = None if rollout.started_at is None else rollout.started_at - rollout.created_at
        run = None
        if rollout.started_at is not None and rollout.finished_at is not None:
            run = rollout.finished_at - rollout.started_at
        self._feed.append(
            CompletionEntry(
                seq=self._next_seq,
                rollout_id=rollout.rollout_id,
                group_id=rollout.group_id,
                step=rollout.step,
                state=rollout.state,
                reward=rollout.reward,
                queue_wait_seconds=queue_wait,
                run_seconds=run,
                message=rollout.message,
            )
        )
        self._next_seq += 1
        self._feed_signal.fire()

    @property
    def feed_cursor(self) -> int:
        """The sequence number of the newest completion (0 when none yet)."""
        return self._next_seq - 1

    async def completions(
        self, *, after: int, limit: int, wait_seconds: float
    ) -> tuple[list[CompletionEntry], int]:
        """Entries with seq > `after`, waiting up to `wait_seconds` for one; returns (entries, cursor)."""
        deadline = time.monotonic() + wait_seconds
        while True:
            if self._feed and after < self._feed[0].seq - 1:
                raise FeedGap(
                    f"cursor {after} is older than the oldest retained completion ({self._feed[0].seq}); "
                    "resync from GET /api/rollouts and continue from the current cursor"
                )
            entries = list(self._feed_from(after))[:limit]
            remaining = deadline - time.monotonic()
            if entries or remaining <= 0:
                cursor = entries[-1].seq if entries else max(after, 0)
                return entries, cursor
            await self._feed_signal.wait(remaining)

    def _feed_from(self, after: int) -> Iterable[CompletionEntry]:
        if not self._feed:
            return []
        start = max(0, after - self._feed[0].seq + 1)
        return (self._feed[i] for i in range(start, len(self._feed)))

    # -- events -------------------------------------------------------------------------------------------

    def check_capture_room(self, rollout_id: str) -> None:
        """Before a call is forwarded: `CaptureFull` when its rollout or the store is at its capture limit,
        so no upstream work is spent on a call whose tokens could not be kept."""
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            return
        if rollout.capture_full or rollout.capture_bytes >= self.max_capture_bytes_per_rollout:
            raise CaptureFull(self._rollout_full_message(rollout), status=413, limit="rollout")
        if self._capture_full or self.capture_bytes >= self.max_capture_bytes:
            raise CaptureFull(self._store_full_message(), status=507, limit="store")

    def record_call(self, rollout_id: str, call: CapturedCall) -> str | None:
        """Store a call; returns the limit (`rollout`, `store`) it would have passed, or None.

        A call that would pass a limit (it was admitted just below it, or several were in flight at once) is
        kept without its tokens, saying why: token data never passes the limits, only such calls' metadata
        (`CALL_OVERHEAD_BYTES` each) may. Its rollout, or the store until the trainer frees space, then
        refuses further calls (`check_capture_room`).
        """
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            return None  # deleted while the call was in flight
        size = call.size_bytes
        limit = None
        if rollout.capture_bytes + size > self.max_capture_bytes_per_rollout:
            limit, rollout.capture_full = "rollout", True
            call = call.without_tokens(f"not captured: {self._rollout_full_message(rollout)}")
        elif self.capture_bytes + size > self.max_capture_bytes:
            limit, self._capture_full = "store", True
            call = call.without_tokens(f"not captured: {self._store_full_message()}")
        size = call.size_bytes
        rollout.calls.append(call)
        rollout.capture_bytes += size
        self.capture_bytes += size
        while len(rollout.calls) > self.max_events_per_rollout:
            dropped = rollout.calls.popleft().size_bytes
            rollout.capture_bytes -= dropped
            self._free_capture(dropped)
        return limit

    def _free_capture(self, size: int) -> None:
        self.capture_bytes -= size
        if size > 0:
            self._capture_full = False

    def _rollout_full_message(self, rollout: Rollout) -> str:
        return (
            f"rollout {rollout.rollout_id!r} holds {rollout.capture_bytes} bytes of captured model calls; "
            f"its limit is {self.max_capture_bytes_per_rollout} (--max-capture-bytes-per-rollout, "
            "spec.gateway.maxCaptureBytesPerRollout): raise it, or make the rollout's calls fewer or shorter"
        )

    def _store_full_message(self) -> str:
        return (
            f"the gateway's store holds {self.capture_bytes} bytes of captured model calls; its limit is "
            f"{self.max_capture_bytes} (--max-capture-bytes, spec.gateway.maxCaptureBytes): raise it with "
            "the gateway's memory, or shrink the window (spec.async.windowSize); space is freed as the "
            "trainer consumes rollouts"
        )

    def record_event(
        self, rollout_id: str, attempt_id: str, event_type: str, data: dict[str, Any], *, size: int
    ) -> None:
        """Store one agent event of `size` JSON bytes; a reward also sets the rollout's reward.

        Events are accepted while the rollout is queued or running, from its attempt once that is known.
        """
        rollout = self.get(rollout_id)
        if rollout.state.is_terminal:
            raise RolloutFinished(
                f"rollout {rollout_id!r} already finished ({rollout.state}); its result is final and "
                "events are accepted only while it is queued or running"
            )
        check_attempt(rollout, attempt_id)
        reward = reward_value(data) if event_type == "reward" else None
        if len(rollout.events) >= self.max_events_per_rollout:
            raise EventRejected(
                f"rollout {rollout_id!r} already has {len(rollout.events)} events (the limit)",
                status=413,
                field="event_type",
                reason="too_many_events",
            )
        if rollout.event_bytes + size > self.max_event_bytes:
            raise EventRejected(
                f"rollout {rollout_id!r} would store more than {self.max_event_bytes} bytes of event data "
                f"(it has {rollout.event_bytes}, this event is {size}); the limit is --max-event-bytes",
                status=413,
                field="data",
                reason="event_bytes",
            )
        if reward is not None:
            rollout.posted_reward = reward
            rollout.posted_reward_attempt_id = attempt_id
        rollout.event_bytes += size
        rollout.events.append(
            {"attempt_id": attempt_id, "event_type": event_type, "data": data, "at": time.time()}
        )

    # -- window summary -----------------------------------------------------------------------------------

    def set_summary(self, summary: WindowSummary) -> WindowSummary:
        """Keep the trainer's summary of its latest update, numbered (`posted`); returns it so numbered."""
        self._summaries_posted += 1
        self._summary = summary.model_copy(update={"posted": self._summaries_posted})
        self._summary_signal.fire()
        return self._summary

    def set_trainer_report(self, report: TrainerReport) -> None:
        """The trainer's failure report; wakes the summary long-poll so the operator sees it at once."""
        self.trainer_report = report
        self._summary_signal.fire()

    async def summary_after(
        self, *, after_step: int | None, wait_seconds: float, after_posted: int | None = None
    ) -> WindowSummary | None:
        """The latest summary; with `after_step`, wait up to `wait_seconds` for one of a later step; with
        `after_posted`, for one posted after that one (`posted`), redone steps included.

        A trainer report also ends the wait (the caller reads it from the stats), and so does an
        `after_posted` this gateway never numbered: the caller's count is from an earlier gateway instance.
        """
        deadline = time.monotonic() + wait_seconds
        report = self.trainer_report
        while True:
            summary = self._summary
            if after_posted is not None:
                if self._summaries_posted != after_posted:
                    return summary
            elif after_step is None or (summary is not None and summary.step > after_step):
                return summary
            if self.trainer_report is not report:
                return summary
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return summary
            await self._summary_signal.wait(remaining)


def check_attempt(rollout: Rollout, attempt_id: str) -> None:
    """Refuse calls and events from an attempt other than the rollout's, once its attempt is known."""
    if rollout.attempt_id is not None and attempt_id != rollout.attempt_id:
        raise UnknownAttempt(
            f"rollout {rollout.rollout_id!r} has no attempt {attempt_id!r} "
            f"(its attempt is {rollout.attempt_id!r})"
        )


def reward_value(data: dict[str, Any]) -> float:
    """The reward of a reward event's data: `value`, a finite number (a bool, a string or 1e400 are not)."""
    value = data.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventRejected(
            'a reward event needs data.value as a number, e.g. {"value": 1.0}',
            status=422,
            field="data.value",
            reason="bad_reward",
        )
    try:
        reward = float(value)
    except OverflowError:
        reward = math.inf
    if not math.isfinite(reward):
        raise EventRejected(
            "data.value must be a finite number that fits a float (at most about 1.8e308); "
            f"got {_brief(value)}",
            status=422,
            field="data.value",
            reason="bad_reward",
        )
    return reward


def _brief(value: int | float) -> str:
    if isinstance(value, int):
        return f"an integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    return repr(value)
