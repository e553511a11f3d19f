"""Pause and drain: stop forwarding new model calls and learn, without polling, when the last one ended.

Before a weight update the trainer pauses the gateway; calls already in flight finish, new ones get 429 with
Retry-After. `wait_drained()` returns the moment the in-flight count reaches zero (an asyncio.Event set by the
request that finishes last), with the count at the pause and the drain time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class PauseSnapshot:
    paused: bool
    retry_after_seconds: int
    reason: str | None
    inflight: int

    def as_json(self) -> dict[str, object]:
        return {
            "paused": self.paused,
            "retry_after_seconds": self.retry_after_seconds,
            "reason": self.reason,
            "inflight": self.inflight,
        }


@dataclass(frozen=True)
class DrainResult:
    drained: bool
    inflight_at_pause: int
    drain_seconds: float
    inflight: int


class PauseState:
    """Single-event-loop state; every method runs on the gateway's loop, so no lock is needed."""

    def __init__(self, default_retry_after_seconds: int) -> None:
        self.paused = False
        self.reason: str | None = None
        self.default_retry_after_seconds = default_retry_after_seconds
        self.retry_after_seconds = default_retry_after_seconds
        self.inflight = 0
        self.inflight_at_pause = 0
        self.paused_at: float | None = None
        self.drained_after: float | None = None
        self.model_version: int | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def snapshot(self) -> PauseSnapshot:
        return PauseSnapshot(self.paused, self.retry_after_seconds, self.reason, self.inflight)

    def pause(self, *, reason: str | None, retry_after_seconds: int | None) -> PauseSnapshot:
        if not self.paused:
            self.paused = True
            self.paused_at = time.monotonic()
            self.inflight_at_pause = self.inflight
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
        if model_version is not None:
            self.model_version = model_version
        return self.snapshot()

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
        """Wait (server-side) until no call is in flight, up to `timeout_seconds`."""
        if self.inflight:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), timeout=timeout_seconds)
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
        )
