"""Pause / resume / state (Agent Lightning's contract, plus a server-side drain wait) and the upstreams.

The trainer pauses the gateway around a weight update and waits for the drain here; the upstreams (the
inference servers) are registered at run time once they are up. A pause with a lease that is not renewed in
time ends as a resume does (`PauseLeaseTimer`), keeping the model version the last resume set.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query

from asyncrl.gateway.pause_state import PauseState
from asyncrl.gateway.routes.common import GatewayParts
from asyncrl.gateway_api import paths
from asyncrl.gateway_api.models import (
    LeaseRenewal,
    PauseRequest,
    PauseView,
    ResumeRequest,
    UpstreamsUpdate,
    UpstreamsView,
)

logger = logging.getLogger(__name__)

DrainWait = Annotated[float | None, Query(ge=0, le=3600, description="Wait this long for the drain.")]


class PauseLeaseTimer:
    """Ends a pause whose lease ran out: one timer on the event loop, set again at every pause, renewal and
    resume, so that it fires only for the lease in effect."""

    def __init__(self, pause: PauseState, on_expiry: Callable[[], None]) -> None:
        self._pause = pause
        self._on_expiry = on_expiry
        self._timer: asyncio.TimerHandle | None = None

    def reset(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        left = self._pause.lease_seconds_left()
        if left is not None:
            self._timer = asyncio.get_running_loop().call_later(left, self._fire)

    def _fire(self) -> None:
        self._timer = None
        left = self._pause.lease_seconds_left()
        if left is None:
            return
        if left > 0:  # renewed since the timer was set (the renewal set a new timer; this one is stale)
            self.reset()
            return
        self._on_expiry()


def pause_router(parts: GatewayParts) -> APIRouter:
    router = APIRouter()
    pause, proxy, metrics = parts.pause, parts.proxy, parts.metrics

    def reopen(model_version: int | None) -> None:
        pause.resume(model_version=model_version)
        metrics.paused.set(0)
        proxy.release_held()  # in arrival order; each is forwarded when its handler runs next

    def lease_ran_out() -> None:
        logger.warning(
            "the pause (%s) ran out of its lease without a renewal: resuming at model version %s. The "
            "trainer that paused the gateway died or cannot reach it; agents' calls are forwarded again",
            pause.reason,
            pause.model_version,
        )
        metrics.pause_lease_expirations.inc()
        reopen(model_version=None)

    lease = PauseLeaseTimer(pause, lease_ran_out)

    async def view(wait: float | None = None) -> dict[str, Any]:
        drain = await drain_fields(wait)  # first: the state is the one after the drain wait
        return PauseView(**parts.pause_fields(), **drain).wire()

    async def drain_fields(wait: float | None) -> dict[str, Any]:
        if wait is None:
            return {}
        result = await pause.wait_drained(wait)
        if result.drained and pause.paused:
            metrics.drain_seconds.set(result.drain_seconds)
        return {
            "drained": result.drained,
            "inflight_at_pause": result.inflight_at_pause,
            "drain_seconds": result.drain_seconds,
            "aborted": result.aborted,
        }

    @router.post(paths.PAUSE)
    async def pause_route(
        request: Annotated[PauseRequest | None, Body()] = None, wait: DrainWait = None
    ) -> dict[str, Any]:
        request = request or PauseRequest()
        pause.pause(
            reason=request.reason,
            retry_after_seconds=request.retry_after_seconds,
            lease_seconds=request.lease_seconds,
        )
        lease.reset()
        if request.abort:
            pause.abort_inflight()
        metrics.paused.set(1)
        return await view(wait)

    @router.post(paths.PAUSE_RENEW)
    async def renew_route(request: LeaseRenewal) -> dict[str, Any]:
        """Extend the pause in effect; `paused: false` in the answer means there was none to extend."""
        pause.renew(lease_seconds=request.lease_seconds)
        lease.reset()
        return await view()

    @router.post(paths.RESUME)
    async def resume_route(request: Annotated[ResumeRequest | None, Body()] = None) -> dict[str, Any]:
        reopen(model_version=(request or ResumeRequest()).model_version)
        lease.reset()
        return await view()

    @router.get(paths.PAUSE_STATE)
    async def state_route(wait: DrainWait = None) -> dict[str, Any]:
        return await view(wait)

    def upstreams_view() -> UpstreamsView:
        return UpstreamsView(upstreams=list(proxy.upstreams.urls), model=proxy.model)

    @router.get(paths.UPSTREAMS)
    async def get_upstreams() -> UpstreamsView:
        return upstreams_view()

    @router.put(paths.UPSTREAMS)
    async def put_upstreams(request: UpstreamsUpdate) -> UpstreamsView:
        """Replace the upstream set; calls in flight finish on the server they started on."""
        proxy.set_upstreams(tuple(request.upstreams), model=request.model)
        metrics.upstream_registrations.inc()
        return upstreams_view()

    return router
