"""The gateway client through which the trainer holds the gateway paused: it reports the hold to the metrics
and keeps the pause's lease alive while it holds it.

The gateway exports whether it is paused; only the trainer knows whether that pause is its own work (an
update, a checkpoint load or save) or left behind (the trainer died or gave up resuming). Every pause the
trainer sends carries a lease, renewed every `renew_every_seconds` while the trainer holds the pause, so a
gateway left paused by a trainer that died or was cut off resumes by itself once the lease runs out, instead
of holding every agent's model call until its hold timeout. Wrapping the client at the one place every pause
and resume passes keeps the step loop free of both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import httpx

from asyncrl.gateway_api.client import GatewayClient, GatewayError, PauseResult
from asyncrl.gateway_api.models import PauseView

logger = logging.getLogger(__name__)

# The pause's lease, and how often the trainer renews it: a trainer gone for a minute lets the gateway resume;
# five renewals in a row must be lost before a live trainer's update is exposed to agents' calls.
PAUSE_LEASE_SECONDS = 60.0
LEASE_RENEW_SECONDS = 10.0


class PauseHoldingClient(GatewayClient):
    """`GatewayClient` that holds its pauses: `report(True)` and lease renewals from before each pause is sent
    (a pause whose answer is lost still paused the gateway), `report(False)` and no more renewals from before
    each resume is sent (once the trainer lets go, a gateway still paused, a resume that failed and was given
    up, is no longer its work: the alert on a gateway paused without an update must see it, and its lease
    must run out)."""

    def __init__(
        self,
        base_url: str,
        key: str,
        *,
        report: Callable[[bool], None],
        timeout_seconds: float = 30.0,
        lease_seconds: float = PAUSE_LEASE_SECONDS,
        renew_every_seconds: float = LEASE_RENEW_SECONDS,
    ) -> None:
        if not 0 < renew_every_seconds < lease_seconds:
            raise ValueError(
                f"renew_every_seconds ({renew_every_seconds}) must be above 0 and below lease_seconds "
                f"({lease_seconds}), or the lease runs out between renewals"
            )
        super().__init__(base_url, key, timeout_seconds=timeout_seconds)
        self._report = report
        self.lease_seconds = lease_seconds
        self.renew_every_seconds = renew_every_seconds
        self._renewing: asyncio.Task[None] | None = None

    async def pause(
        self,
        *,
        reason: str | None,
        retry_after_seconds: float = 5,
        wait_seconds: float = 300.0,
        abort: bool = False,
        lease_seconds: float | None = None,
    ) -> PauseResult:
        self._report(True)
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.create_task(self._renew(), name="pause lease renewal")
        return await super().pause(
            reason=reason,
            retry_after_seconds=retry_after_seconds,
            wait_seconds=wait_seconds,
            abort=abort,
            lease_seconds=lease_seconds or self.lease_seconds,
        )

    async def resume(self, *, model_version: int | None = None) -> PauseView:
        self._report(False)
        await self._stop_renewing()
        return await super().resume(model_version=model_version)

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stop_renewing()
        await super().__aexit__(*exc_info)

    async def _stop_renewing(self) -> None:
        """A renewal cut off mid-request is harmless: a renewal never pauses an open gateway."""
        task, self._renewing = self._renewing, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _renew(self) -> None:
        """Renew until cancelled (by the resume). An open gateway is warned of once per hold, not at every
        renewal: it stays open until the trainer's next pause, and the warning says all there is to say."""
        warned_open = False
        while True:
            await asyncio.sleep(self.renew_every_seconds)
            try:
                view = await self.renew_pause(lease_seconds=self.lease_seconds)
            except (httpx.HTTPError, GatewayError, ValueError) as error:  # ValueError: an unreadable answer
                logger.warning(
                    "renewing the gateway's pause lease failed (%s); it resumes by itself %.0fs after the "
                    "last renewal that reached it",
                    error,
                    self.lease_seconds,
                )
                continue
            if not view.paused and not warned_open:
                warned_open = True
                logger.warning(
                    "the gateway is open while the trainer holds its pause: no renewal reached it for %.0fs "
                    "and its lease ran out (or another client resumed it); agents' calls meet the update",
                    self.lease_seconds,
                )
