"""uvicorn's server for the gateway: it says (at warning level) why it stops, and does not wait on held calls.

A stopping uvicorn closes its port at once but lives on until every open connection is done. Held calls
(pause mode Hold) would keep it alive, port closed, until their hold timeout: from outside, a gateway that
"stopped answering" while its process lived, with nothing in a warning-level log. So the signal is logged,
and held calls get their 429 + Retry-After at once (the agent retries, against the restarted sidecar).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from types import FrameType

import uvicorn

from asyncrl.gateway.held_calls import HeldCalls

logger = logging.getLogger(__name__)


class StoppingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, held: HeldCalls) -> None:
        super().__init__(config)
        self._held = held

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.should_exit:
            logger.warning(
                "gateway: %s received; stopping (port closed, %d held calls answered 429, "
                "%d connections left to finish)",
                signal.Signals(sig).name,
                len(self._held),
                len(self.server_state.connections),
            )
            # Signal handlers run between the loop's bytecodes: resolve the futures from the loop itself.
            with contextlib.suppress(RuntimeError):  # no loop yet (a signal during start-up): none held
                asyncio.get_running_loop().call_soon_threadsafe(self._held.refuse_all)
        super().handle_exit(sig, frame)
