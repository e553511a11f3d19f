"""Each agent's share of the gateway: requests in flight and body bytes per second, per rollout token.

The gateway serves every agent of a run on one event loop, so an agent that sends many large bodies at once
takes the loop from all the others (16 parallel 5.7 MB bodies pushed another rollout's model call to 60 s).
Each agent token (one per rollout, so the budget is kept by rollout id) gets:

- at most `max_requests` requests in flight (held calls included); one more is refused with 429;
- a bucket of `burst_bytes`, refilled at `bytes_per_second`, that pays for each body's bytes (before it is
  read when its length is declared) and for its JSON values, `VALUE_COST_BYTES` each (before it is
  parsed): parsing costs per value far more than per byte (5.7 MB of `{}` took 0.2 s, 5.7 MB of text
  milliseconds), so a body of millions of tiny values is paid for as what it costs. A body the bucket cannot
  pay for now is refused with 429; one it could never pay for (more than `burst_bytes`) with 413.

The 429s carry Retry-After. The gateway key (trainer, operator) and the pool token have no budget.
Pure logic on an injected clock; admission (`app.py`) and the proxy charge it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

CONCURRENCY_RETRY_AFTER_SECONDS = 1.0  # when one of its requests ends is unknown; one second is a fair wait
MIN_RETRY_AFTER_SECONDS = 0.001
# What one JSON value (counted by its commas and brackets) costs of the bucket, in bytes: about what msgspec
# parses of a string in the time it builds one value, rounded down.
VALUE_COST_BYTES = 64
_SWEEP_AT = 4096  # shares kept before the idle ones are swept (a full bucket refills in seconds)


class AgentBudget(BaseModel):
    """What one agent token may use of the gateway (flags `--agent-*`)."""

    model_config = ConfigDict(frozen=True)

    max_requests: int = Field(
        default=32, ge=1, description="Requests one agent token may have in flight; one more gets 429."
    )
    bytes_per_second: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Body bytes per second one agent token may send, on average; more gets 429.",
    )
    burst_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1024,
        description="Body bytes one agent token may send at once (the bucket's size); at least the largest "
        "body it may send, or that body is always refused.",
    )


class OverBudget(Exception):
    """An agent token is past one of its budgets; `retry_after_seconds` is when it may try again."""

    def __init__(self, budget: str, retry_after_seconds: float) -> None:
        super().__init__(budget)
        self.budget = budget  # "requests", "bytes", or "burst" (more than the bucket holds: never payable)
        self.retry_after_seconds = retry_after_seconds


@dataclass
class _Share:
    in_flight: int
    bytes_left: float
    updated: float


class AgentBudgets:
    """The budgets of every agent token with a request in flight or a bucket not yet full again."""

    def __init__(self, budget: AgentBudget, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self._clock = clock
        self._shares: dict[str, _Share] = {}
        self._sweep_at = _SWEEP_AT

    def enter(self, rollout_id: str) -> None:
        """Count a request of this agent in flight; OverBudget when it already has `max_requests`."""
        share = self._share(rollout_id)
        if share.in_flight >= self.budget.max_requests:
            raise OverBudget("requests", CONCURRENCY_RETRY_AFTER_SECONDS)
        share.in_flight += 1

    def leave(self, rollout_id: str) -> None:
        share = self._shares.get(rollout_id)
        if share is None:
            return
        share.in_flight -= 1
        self._forget_if_idle(rollout_id, share)

    def charge(self, rollout_id: str, size: int) -> None:
        """Take `size` body bytes from this agent's bucket; OverBudget (nothing taken) when it holds fewer."""
        share = self._share(rollout_id)
        now = self._clock()
        rate = self.budget.bytes_per_second
        share.bytes_left = min(self.budget.burst_bytes, share.bytes_left + (now - share.updated) * rate)
        share.updated = now
        if size > self.budget.burst_bytes:
            raise OverBudget("burst", math.inf)
        if size > share.bytes_left:
            missing = size - share.bytes_left
            raise OverBudget("bytes", max(MIN_RETRY_AFTER_SECONDS, math.ceil(missing / rate * 1000) / 1000))
        share.bytes_left -= size

    def refund(self, rollout_id: str, size: int) -> None:
        """Give back `size` bytes taken by `charge` for a request that was refused after all: a refused
        request costs nothing (the bucket never holds more than `burst_bytes`)."""
        share = self._shares.get(rollout_id)
        if share is not None:
            share.bytes_left = min(float(self.budget.burst_bytes), share.bytes_left + size)

    def charge_all(self, rollout_id: str, charged: int, size: int) -> None:
        """Take `size` more bytes for a request that already paid `charged` (its declared length); when the
        bucket cannot pay, refund `charged` and raise OverBudget whose Retry-After is when the whole request
        (`charged + size`) will be paid for: retried then, the same request is admitted."""
        try:
            self.charge(rollout_id, size)
            return
        except OverBudget as error:
            if not charged:
                raise
            self.refund(rollout_id, charged)
            if error.budget != "bytes":
                raise
        # The whole request at once: admitted if the bucket holds it by now, else the wait for all of it (or
        # 413 when the whole is more than the bucket ever holds, which the two parts alone did not show).
        self.charge(rollout_id, charged + size)

    def tracked(self) -> int:
        """How many agent tokens have state kept (in flight, or a bucket still refilling)."""
        return len(self._shares)

    def _share(self, rollout_id: str) -> _Share:
        share = self._shares.get(rollout_id)
        if share is None:
            if len(self._shares) >= self._sweep_at:
                for known, other in list(self._shares.items()):
                    self._forget_if_idle(known, other)
                self._sweep_at = max(_SWEEP_AT, 2 * len(self._shares))
            share = self._shares[rollout_id] = _Share(0, float(self.budget.burst_bytes), self._clock())
        return share

    def _forget_if_idle(self, rollout_id: str, share: _Share) -> None:
        """Drop a share with nothing in flight whose bucket is full by now: it holds nothing to remember."""
        if share.in_flight > 0:
            return
        refilled = share.bytes_left + (self._clock() - share.updated) * self.budget.bytes_per_second
        if refilled >= self.budget.burst_bytes:
            del self._shares[rollout_id]


def json_values(raw: bytes) -> int:
    """About how many JSON values `raw` holds, from its commas and brackets (C-speed counts; commas and
    brackets inside strings count too, so text rich in them costs a little more)."""
    return raw.count(b",") + raw.count(b"{") + raw.count(b"[") + 1
