"""The gateway's management and store API (FastAPI): the app, its error shape and request counting, and the
routers by concern (`asyncrl.gateway.routes`: pause and upstreams, rollouts and claims, events, feeds and
summary, health and metrics, the agent pool), each behind the one access check (`access.py`'s table).

Off the hot path, so clarity wins here: typed request models and one error shape (`{"error": ..., ...}`).
Model calls do not come through here: the ASGI front (`app.py`) sends them to the proxy directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.door import Refused
from asyncrl.gateway.metrics import GatewayMetrics
from asyncrl.gateway.pause import PauseState
from asyncrl.gateway.proxy import ProxyHandler
from asyncrl.gateway.routes.common import ApiError, GatewayParts, access_check
from asyncrl.gateway.routes.events import events_router
from asyncrl.gateway.routes.feeds import feeds_router
from asyncrl.gateway.routes.health import health_router
from asyncrl.gateway.routes.pause import pause_router
from asyncrl.gateway.routes.pool import pool_router
from asyncrl.gateway.routes.rollouts import rollouts_router
from asyncrl.gateway.store import RolloutStore

__all__ = ["ApiError", "build_api"]


def build_api(
    *,
    config: GatewayConfig,
    pause: PauseState,
    store: RolloutStore,
    metrics: GatewayMetrics,
    proxy: ProxyHandler,
) -> FastAPI:
    parts = GatewayParts(config=config, pause=pause, store=store, metrics=metrics, proxy=proxy)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await proxy.start()
        try:
            yield
        finally:
            await proxy.close()

    app = FastAPI(
        title="asyncrl gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        dependencies=[access_check(parts)],
    )
    metrics.watch_rollouts(store.counts_by_state)
    _add_error_handlers(app)

    @app.middleware("http")
    async def _count(request: Request, call_next: Callable[[Request], Any]) -> Response:
        response: Response = await call_next(request)
        route = request.scope.get("route")
        metrics.requests.labels(getattr(route, "path", "unmatched"), str(response.status_code)).inc()
        return response

    for router in (pause_router, rollouts_router, events_router, feeds_router, health_router, pool_router):
        app.include_router(router(parts))
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """One error shape for every refusal: `{"error": ..., ...}` (422 lists the fields and their problems)."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body, status_code=error.status)

    @app.exception_handler(Refused)  # the access check's refusal, answered as the door answers it
    async def _refused(_request: Request, refused: Refused) -> JSONResponse:
        return JSONResponse(refused.body, status_code=refused.status, headers=refused.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(error.detail).lower()}, status_code=error.status_code)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, error: RequestValidationError) -> JSONResponse:
        problems = error.errors()
        if any(problem.get("type") == "json_invalid" for problem in problems):
            return JSONResponse({"error": "request body is not valid JSON"}, status_code=400)
        fields = [
            {"field": ".".join(str(part) for part in problem["loc"][1:]), "problem": problem["msg"]}
            for problem in problems
        ]
        return JSONResponse({"error": "invalid request", "fields": fields}, status_code=422)
