"""Liveness, readiness and Prometheus metrics: the routes the kubelet and Prometheus call, without a key."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from asyncrl.gateway.routes.common import GatewayParts
from asyncrl.gateway_api import paths


def health_router(parts: GatewayParts) -> APIRouter:
    router = APIRouter()

    @router.get(paths.HEALTHZ)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @router.get(paths.READYZ)
    async def readyz() -> JSONResponse:
        ready = parts.proxy.session is not None and not parts.proxy.session.closed
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @router.get(paths.METRICS)
    async def prometheus() -> Response:
        return Response(generate_latest(parts.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
