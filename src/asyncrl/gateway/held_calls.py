"""Held model calls: calls parked while the gateway is paused (or has no upstream), released in arrival order.

In `Hold` mode a model call that cannot be forwarded now waits here instead of getting 429, so an agent with
default retry settings (the OpenAI SDK retries twice) survives an update of any length: it sees one slow
answer. Parking is bounded twice: each call waits at most `timeout_seconds`, and at most `capacity` calls
wait at once; past either bound the call gets the 429 it would have had in `Reject` mode.

Single event loop: every method runs on the gateway's loop, so no lock is needed. Release order is arrival
order: futures are resolved in insertion order, and asyncio wakes their waiters in the order they were
resolved.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from enum import StrEnum


class HoldRefusal(StrEnum):
    """Why a call could not be held (the label of the refusal metric)."""

    FULL = "hold_full"  # `capacity` calls were already parked
    TIMEOUT = "hold_timeout"  # parked for `timeout_seconds` without a resume
    SHUTDOWN = "shutdown"  # the gateway is stopping: the agent retries against its successor


class HoldRefused(Exception):
    def __init__(self, reason: HoldRefusal, waited_seconds: float) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.waited_seconds = waited_seconds


class HeldCalls:
    """The parked calls, in arrival order."""

    def __init__(self, *, capacity: int, timeout_seconds: float) -> None:
        self.capacity = capacity
        self.timeout_seconds = timeout_seconds
        self._waiting: dict[int, tuple[asyncio.Future[None], float]] = {}  # insertion order = arrival
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._waiting)

    def oldest_wait_seconds(self) -> float:
        """How long the longest-parked call has waited (0 when none is parked)."""
        for _future, arrived in self._waiting.values():
            return time.monotonic() - arrived
        return 0.0

    async def wait(self) -> float:
        """Park until `release_all()`; return the seconds waited. Raises HoldRefused past a bound or at
        `refuse_all()`.

        Cancelling the caller (the client went away) removes the call from the queue.
        """
        arrived = time.monotonic()
        if len(self._waiting) >= self.capacity:
            raise HoldRefused(HoldRefusal.FULL, 0.0)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = next(self._ids)
        self._waiting[key] = (future, arrived)
        try:
            await asyncio.wait_for(future, timeout=self.timeout_seconds)
        except HoldRefused as refused:
            refused.waited_seconds = time.monotonic() - arrived
            raise
        except TimeoutError as error:
            raise HoldRefused(HoldRefusal.TIMEOUT, time.monotonic() - arrived) from error
        finally:
            self._waiting.pop(key, None)
        return time.monotonic() - arrived

    def release_all(self) -> int:
        """Wake every parked call, oldest first; return how many were woken."""
        waiting, self._waiting = self._waiting, {}
        for future, _arrived in waiting.values():
            if not future.done():
                future.set_result(None)
        return len(waiting)

    def refuse_all(self, reason: HoldRefusal = HoldRefusal.SHUTDOWN) -> int:
        """Answer every parked call with its refusal now (the gateway is stopping); return how many.

        Without this a stopping gateway keeps its port closed but its process alive until the last held
        call times out (uvicorn waits for open connections), which looks like a hang from outside.
        """
        waiting, self._waiting = self._waiting, {}
        for future, _arrived in waiting.values():
            if not future.done():
                future.set_exception(HoldRefused(reason, 0.0))
        return len(waiting)
