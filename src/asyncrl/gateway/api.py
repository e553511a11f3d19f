"""The gateway's management and store API (FastAPI): the app, its error shape and request counting, and the
routers by concern (`asyncrl.gateway.routes`: pause and upstreams, rollouts and claims, events, feeds and
summary, health and metrics, the agent pool), each behind the one access check (`access.py`'s table).

Off the hot path, so clarity wins here: typed request models and one error shape (`{"error": ..., ...}`).
Model calls do not come through here: the ASGI front (`app.py`) sends them to the proxy directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from asyncrl.gateway.admission import Refused
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.metrics import GatewayMetrics
from asyncrl.gateway.pause_state import PauseState
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

    app.add_middleware(RequestCounting, metrics=metrics)
    for router in (pause_router, rollouts_router, events_router, feeds_router, health_router, pool_router):
        app.include_router(router(parts))
    return app


class RequestCounting:
    """Counts each answered request by route and status, as plain ASGI: Starlette's `@app.middleware("http")`
    runs the route in a task of its own and streams the answer back through a queue, several event-loop turns
    per request, and on a busy gateway each turn waits for a round of proxy work (the pause waited so)."""

    def __init__(self, app: ASGIApp, *, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, counting_send)
        if status is not None:  # none when an exception no handler took escapes: Starlette answers it 500
            route = scope.get("route")
            self.metrics.requests.labels(getattr(route, "path", "unmatched"), str(status)).inc()


def _add_error_handlers(app: FastAPI) -> None:
    """One error shape for every refusal: `{"error": ..., ...}` (422 lists the fields and their problems)."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body, status_code=error.status)

    @app.exception_handler(Refused)  # the access check's refusal, answered as admission answers it
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
