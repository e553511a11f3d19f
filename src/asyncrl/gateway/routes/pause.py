"""Pause / resume / state (Agent Lightning's contract, plus a server-side drain wait) and the upstreams.

The trainer pauses the gateway around a weight update and waits for the drain here; the upstreams (the
inference servers) are registered at run time once they are up.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Query

from asyncrl.gateway.models import PauseRequest, PauseView, ResumeRequest, UpstreamsUpdate, UpstreamsView
from asyncrl.gateway.routes.common import GatewayParts

DrainWait = Annotated[float | None, Query(ge=0, le=3600, description="Wait this long for the drain.")]


def pause_router(parts: GatewayParts) -> APIRouter:
    router = APIRouter()
    pause, proxy, metrics = parts.pause, parts.proxy, parts.metrics

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

    @router.post("/proxy/pause")
    async def pause_route(
        request: Annotated[PauseRequest | None, Body()] = None, wait: DrainWait = None
    ) -> dict[str, Any]:
        request = request or PauseRequest()
        pause.pause(reason=request.reason, retry_after_seconds=request.retry_after_seconds)
        if request.abort:
            pause.abort_inflight()
        metrics.paused.set(1)
        return await view(wait)

    @router.post("/proxy/resume")
    async def resume_route(request: Annotated[ResumeRequest | None, Body()] = None) -> dict[str, Any]:
        pause.resume(model_version=(request or ResumeRequest()).model_version)
        metrics.paused.set(0)
        proxy.release_held()  # in arrival order; each is forwarded when its handler runs next
        return await view()

    @router.get("/proxy/state")
    async def state_route(wait: DrainWait = None) -> dict[str, Any]:
        return await view(wait)

    def upstreams_view() -> UpstreamsView:
        return UpstreamsView(upstreams=list(proxy.upstreams.urls), model=proxy.model)

    @router.get("/api/upstreams")
    async def get_upstreams() -> UpstreamsView:
        return upstreams_view()

    @router.put("/api/upstreams")
    async def put_upstreams(request: UpstreamsUpdate) -> UpstreamsView:
        """Replace the upstream set; calls in flight finish on the server they started on."""
        proxy.set_upstreams(tuple(request.upstreams), model=request.model)
        metrics.upstream_registrations.inc()
        return upstreams_view()

    return router
