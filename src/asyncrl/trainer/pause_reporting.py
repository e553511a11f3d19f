"""The gateway client that tells the metrics whether the trainer holds the gateway paused.

The gateway exports whether it is paused; only the trainer knows whether that pause is its own work (an
update, a checkpoint load or save) or left behind (the trainer died or gave up resuming). Wrapping the client
at the one place every pause and resume passes keeps the step loop free of metrics calls.
"""

from __future__ import annotations

from collections.abc import Callable

from asyncrl.gateway.client import GatewayClient, PauseResult
from asyncrl.gateway.models import PauseView


class PauseReportingClient(GatewayClient):
    """`GatewayClient` calling `report(True)` before each pause and `report(False)` before each resume.

    Held from before the pause is sent (a pause whose answer is lost still paused the gateway) until the
    trainer lets go: once it resumes, a gateway still paused (a resume that failed and was given up) is no
    longer the trainer's work, which is what the alert on a gateway paused without an update must see.
    """

    def __init__(
        self, base_url: str, key: str, *, report: Callable[[bool], None], timeout_seconds: float = 30.0
    ) -> None:
        super().__init__(base_url, key, timeout_seconds=timeout_seconds)
        self._report = report

    async def pause(
        self,
        *,
        reason: str | None,
        retry_after_seconds: float = 5,
        wait_seconds: float = 300.0,
        abort: bool = False,
    ) -> PauseResult:
        self._report(True)
        return await super().pause(
            reason=reason, retry_after_seconds=retry_after_seconds, wait_seconds=wait_seconds, abort=abort
        )

    async def resume(self, *, model_version: int | None = None) -> PauseView:
        self._report(False)
        return await super().resume(model_version=model_version)
