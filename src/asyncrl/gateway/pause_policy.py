"""What a model call that cannot be forwarded now gets: one policy per pause mode, chosen once at start-up.

The gateway cannot forward a call while it is paused for a weight update, or before the trainer registered an
upstream. `Hold` parks the call (`held_calls.py`) and the proxy tries again when it is released; `Reject`
answers at once with the refusal (429 + Retry-After + X-Agl-Paused, Agent Lightning's contract; 503 without an
upstream). A call that a pause with abort cancelled upstream meets the same policy: the proxy loops back to
it, so Hold re-issues the call after the resume and Reject refuses it like a call that arrived during the
pause. The proxy and the pause routes ask the policy, never the mode.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from asyncrl.gateway.admission import ClientGone, Receive, Refused
from asyncrl.gateway.held_calls import HeldCalls, HoldRefused
from asyncrl.gateway.metrics import GatewayMetrics
from asyncrl.pause_modes import PauseMode


class PausePolicy(Protocol):
    mode: PauseMode

    async def wait_until_open(self, receive: Receive, refusal: Callable[[], Refused]) -> None:
        """Return when the call may be tried again (the caller checks that the gateway is open), or raise
        `refusal()`; ClientGone when the client left meanwhile."""
        ...

    def state_fields(self) -> dict[str, Any]:
        """What this mode adds to the pause state (`/proxy/state`, `/api/stats`)."""
        ...


class RejectWhilePaused:
    """Agent Lightning's contract: the refusal at once; the agent retries after Retry-After."""

    mode = PauseMode.REJECT

    async def wait_until_open(self, receive: Receive, refusal: Callable[[], Refused]) -> None:
        raise refusal()

    def state_fields(self) -> dict[str, Any]:
        return {}  # Reject mode's state stays Agent Lightning's, byte for byte


class HoldWhilePaused:
    """The call waits in the gateway (within `held`'s timeout and capacity) until the proxy releases it."""

    mode = PauseMode.HOLD

    def __init__(self, held: HeldCalls, metrics: GatewayMetrics) -> None:
        self.held = held
        self.metrics = metrics

    async def wait_until_open(self, receive: Receive, refusal: Callable[[], Refused]) -> None:
        """A client that disconnects while held leaves the queue: its call is never forwarded nor captured."""
        self.metrics.held_total.inc()
        held = asyncio.ensure_future(self.held.wait())
        disconnect = asyncio.ensure_future(receive())  # the body is read: the next message is the disconnect
        try:
            await asyncio.wait({held, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            disconnect.cancel()
            client_left = not held.done()
            if client_left:
                held.cancel()
        if client_left or held.cancelled():
            # The wait leaves the queue once its cancellation is delivered; wait for that (asyncio.wait never
            # raises it here), then answer no one. Reading held.result() now raised InvalidStateError (a 500).
            await asyncio.wait({held})
            raise ClientGone()
        try:
            self.metrics.hold_wait.observe(held.result())
        except HoldRefused as refused:
            self.metrics.hold_wait.observe(refused.waited_seconds)
            self.metrics.hold_refusals.labels(refused.reason.value).inc()
            raise refusal() from refused

    def state_fields(self) -> dict[str, Any]:
        return {
            "pause_mode": self.mode,
            "held": len(self.held),
            "held_oldest_seconds": round(self.held.oldest_wait_seconds(), 3),
        }


def pause_policy(mode: PauseMode, *, held: HeldCalls, metrics: GatewayMetrics) -> PausePolicy:
    """The policy of `mode` (the run's `spec.gateway.pauseMode`)."""
    match mode:
        case PauseMode.HOLD:
            return HoldWhilePaused(held, metrics)
        case PauseMode.REJECT:
            return RejectWhilePaused()
