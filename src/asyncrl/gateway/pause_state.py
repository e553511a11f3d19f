"""Pause and drain: stop forwarding new model calls and learn, without polling, when the last one ended.

Before a weight update the trainer pauses the gateway; new calls are held (`Hold`) or get 429 with
Retry-After (`Reject`). Calls already in flight either finish (drain policy `Wait`) or are cancelled upstream
at once (`Abort`, `abort_inflight()`). `wait_drained()` returns the moment the in-flight count reaches zero
(an asyncio.Event set by the request that finishes last), with the count at the pause and the drain time.

A pause may carry a lease: the trainer renews it while it holds the pause, and a gateway whose lease ran out
(the trainer died, or cannot reach it) resumes by itself instead of holding every agent's call until the hold
timeout. Without a lease a pause lasts until the resume, as in Agent Lightning.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any


def header_seconds(seconds: float) -> str:
    """A Retry-After value: whole seconds as before (`5`), a fraction only when given one (`0.25`)."""
    if float(seconds).is_integer():
        return str(int(seconds))
    return f"{seconds:.3f}".rstrip("0")


def json_seconds(seconds: float) -> int | float:
    """Whole seconds as a JSON integer (the state's bytes stay Agent Lightning's), fractions as a float."""
    return int(seconds) if float(seconds).is_integer() else seconds


@dataclass(frozen=True)
class PauseSnapshot:
    paused: bool
    retry_after_seconds: float
    reason: str | None
    inflight: int
    lease_seconds_left: float | None = None  # only while a pause with a lease is in effect

    def as_json(self) -> dict[str, object]:
        """The state's fields; `lease_seconds_left` only when a lease is held, so a pause without one keeps
        Agent Lightning's bytes."""
        fields: dict[str, object] = {
            "paused": self.paused,
            "retry_after_seconds": json_seconds(self.retry_after_seconds),
            "reason": self.reason,
            "inflight": self.inflight,
        }
        if self.lease_seconds_left is not None:
            fields["lease_seconds_left"] = round(self.lease_seconds_left, 3)
        return fields


@dataclass(frozen=True)
class DrainResult:
    drained: bool
    inflight_at_pause: int
    drain_seconds: float
    inflight: int
    aborted: int = 0  # calls in flight at the pause that `abort_inflight()` cancelled


class PauseState:
    """Single-event-loop state; every method runs on the gateway's loop, so no lock is needed."""

    def __init__(self, default_retry_after_seconds: float) -> None:
        self.paused = False
        self.reason: str | None = None
        self.default_retry_after_seconds = default_retry_after_seconds
        self.retry_after_seconds = default_retry_after_seconds
        self.inflight = 0
        self.inflight_at_pause = 0
        self.paused_at: float | None = None
        self.drained_after: float | None = None
        self.model_version: int | None = None
        self.aborted_at_pause = 0
        self.lease_deadline: float | None = None  # monotonic; None: no lease (paused until resumed)
        self.forwards: set[asyncio.Future[Any]] = set()  # upstream calls in flight, for abort
        self._idle = asyncio.Event()
        self._idle.set()

    def snapshot(self) -> PauseSnapshot:
        return PauseSnapshot(
            self.paused, self.retry_after_seconds, self.reason, self.inflight, self.lease_seconds_left()
        )

    def pause(
        self, *, reason: str | None, retry_after_seconds: float | None, lease_seconds: float | None = None
    ) -> PauseSnapshot:
        """Pause, or update the pause in effect. The last pause decides the lease: with `lease_seconds` the
        gateway resumes by itself that long from now unless renewed; without, it stays paused until resumed.
        """
        self.lease_deadline = None if lease_seconds is None else time.monotonic() + lease_seconds
        if not self.paused:
            self.paused = True
            self.paused_at = time.monotonic()
            self.inflight_at_pause = self.inflight
            self.aborted_at_pause = 0
            self.drained_after = 0.0 if self.inflight == 0 else None
        self.reason = reason
        self.retry_after_seconds = retry_after_seconds or self.default_retry_after_seconds
        return self.snapshot()

    def resume(self, *, model_version: int | None = None) -> PauseSnapshot:
        """Idempotent: resuming a running gateway changes nothing but the model version, if given."""
        self.paused = False
        self.reason = None
        self.retry_after_seconds = self.default_retry_after_seconds
        self.paused_at = None
        self.lease_deadline = None
        if model_version is not None:
            self.model_version = model_version
        return self.snapshot()

    def renew(self, *, lease_seconds: float) -> PauseSnapshot:
        """Extend the pause in effect to `lease_seconds` from now. A gateway that is not paused (resumed, or
        its lease ran out) stays open: a renewal never pauses, so one that arrives after the resume is
        harmless."""
        if self.paused:
            self.lease_deadline = time.monotonic() + lease_seconds
        return self.snapshot()

    def lease_seconds_left(self) -> float | None:
        """Seconds until the lease runs out (0 when it has); None when no lease is held."""
        if not self.paused or self.lease_deadline is None:
            return None
        return max(0.0, self.lease_deadline - time.monotonic())

    def abort_inflight(self) -> int:
        """Cancel the upstream calls in flight (only while paused); return how many were cancelled.

        Their handlers see the cancellation and hold the call for a re-issue (Hold) or answer 429 (Reject);
        they leave the in-flight count at once, so the drain ends on the next turn of the event loop.
        """
        if not self.paused:
            return 0
        aborted = 0
        for forward in list(self.forwards):
            if not forward.done():
                forward.cancel()
                aborted += 1
        self.aborted_at_pause += aborted
        return aborted

    def enter(self) -> None:
        self.inflight += 1
        self._idle.clear()

    def leave(self) -> None:
        self.inflight -= 1
        if self.inflight == 0:
            if self.paused and self.paused_at is not None and self.drained_after is None:
                self.drained_after = time.monotonic() - self.paused_at
            self._idle.set()

    async def wait_drained(self, timeout_seconds: float) -> DrainResult:
        """Wait (server-side) until no call is in flight, up to `timeout_seconds`.

        Awaited directly, not through `wait_for` (a task of its own): the pause answers one loop turn after
        the last call left, where each turn of a busy gateway is a round of proxy work."""
        if self.inflight:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_seconds):
                    await self._idle.wait()
        drained = self.inflight == 0
        if self.paused_at is not None:
            waited = (
                self.drained_after
                if drained and self.drained_after is not None
                else time.monotonic() - self.paused_at
            )
        else:
            waited = 0.0
        return DrainResult(
            drained=drained,
            inflight_at_pause=self.inflight_at_pause,
            drain_seconds=waited,
            inflight=self.inflight,
            aborted=self.aborted_at_pause,
        )
