"""The gateway's management and store routes (FastAPI): pause/resume/state, upstreams, rollouts, feeds,
events, summary.

Off the hot path, so clarity wins here: typed request models and one error shape (`{"error": ..., ...}`).
The gateway key may call everything; an agent token only its own rollout's routes. Requests reach these
routes only through the door (`door.py`: token before body, byte and JSON limits), because FastAPI reads a
body before it runs dependencies; the auth dependencies here repeat the door's rule as a second line.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from asyncrl.gateway.auth import Access, check_access
from asyncrl.gateway.capture import events_document
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.metrics import GatewayMetrics
from asyncrl.gateway.models import (
    AgentEvent,
    ClaimRequest,
    CompletionPage,
    DeleteRequest,
    EventsBatchRequest,
    LaunchReceipt,
    LaunchRequest,
    PauseRequest,
    ResumeRequest,
    RolloutCreate,
    RolloutView,
    TrainerReport,
    Transition,
    UpstreamsUpdate,
    UpstreamsView,
    WindowSummary,
)
from asyncrl.gateway.pause import PauseState
from asyncrl.gateway.pool_api import pool_router
from asyncrl.gateway.proxy import ProxyHandler
from asyncrl.gateway.store import (
    EventRejected,
    FeedGap,
    Rollout,
    RolloutConflict,
    RolloutFinished,
    RolloutNotFound,
    RolloutStore,
    UnknownAttempt,
)
from asyncrl.pausing import PauseMode
from asyncrl.rollouts import RolloutState


class ApiError(Exception):
    def __init__(self, status: int, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.status = status
        self.body = {"error": error, **extra}


def build_api(
    *,
    config: GatewayConfig,
    pause: PauseState,
    store: RolloutStore,
    metrics: GatewayMetrics,
    proxy: ProxyHandler,
) -> FastAPI:
    key = config.key.get_secret_value()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await proxy.start()
        try:
            yield
        finally:
            await proxy.close()

    app = FastAPI(title="asyncrl gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    metrics.watch_rollouts(store.counts_by_state)

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, error: ApiError) -> JSONResponse:
        return JSONResponse(error.body, status_code=error.status)

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

    @app.middleware("http")
    async def _count(request: Request, call_next: Callable[[Request], Any]) -> Response:
        response: Response = await call_next(request)
        route = request.scope.get("route")
        metrics.requests.labels(getattr(route, "path", "unmatched"), str(response.status_code)).inc()
        return response

    def management(authorization: Annotated[str | None, Header()] = None) -> None:
        access = check_access(key, authorization)
        if access is Access.MISSING:
            raise ApiError(401, "missing bearer token (the gateway key)")
        if access is not Access.MANAGEMENT:
            raise ApiError(403, "this route needs the gateway key")

    def rollout_access(rollout_id: str, authorization: Annotated[str | None, Header()] = None) -> None:
        access = check_access(key, authorization, rollout_id)
        if access is Access.MISSING:
            raise ApiError(401, "missing bearer token")
        if access is Access.DENIED:
            raise ApiError(403, "this token is not valid for this rollout")

    Management = Depends(management)

    def pause_json(**extra: Any) -> dict[str, Any]:
        state: dict[str, Any] = {**pause.snapshot().as_json(), "model_version": pause.model_version}
        if config.pause_mode is PauseMode.HOLD:  # Reject mode's state stays the seed's, byte for byte
            state["pause_mode"] = config.pause_mode.value
            state["held"] = len(proxy.held)
            state["held_oldest_seconds"] = round(proxy.held.oldest_wait_seconds(), 3)
        return {**state, **extra}

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

    # -- pause / resume / state (Agent Lightning's contract, plus a server-side drain wait) ---------------

    @app.post("/proxy/pause", dependencies=[Management])
    async def pause_route(
        request: Annotated[PauseRequest | None, Body()] = None,
        wait: Annotated[
            float | None, Query(ge=0, le=3600, description="Wait this long for the drain.")
        ] = None,
    ) -> dict[str, Any]:
        request = request or PauseRequest()
        pause.pause(reason=request.reason, retry_after_seconds=request.retry_after_seconds)
        if request.abort:
            pause.abort_inflight()
        metrics.paused.set(1)
        return pause_json(**await drain_fields(wait))

    @app.post("/proxy/resume", dependencies=[Management])
    async def resume_route(request: Annotated[ResumeRequest | None, Body()] = None) -> dict[str, Any]:
        pause.resume(model_version=(request or ResumeRequest()).model_version)
        metrics.paused.set(0)
        proxy.release_held()  # in arrival order; each is forwarded when its handler runs next
        return pause_json()

    @app.get("/proxy/state", dependencies=[Management])
    async def state_route(
        wait: Annotated[
            float | None, Query(ge=0, le=3600, description="Wait this long for the drain.")
        ] = None,
    ) -> dict[str, Any]:
        return pause_json(**await drain_fields(wait))

    # -- upstreams (registered at run time once the inference servers are up) ------------------------------

    def upstreams_view() -> UpstreamsView:
        return UpstreamsView(upstreams=list(proxy.upstreams.urls), model=proxy.model)

    @app.get("/api/upstreams", dependencies=[Management])
    async def get_upstreams() -> UpstreamsView:
        return upstreams_view()

    @app.put("/api/upstreams", dependencies=[Management])
    async def put_upstreams(request: UpstreamsUpdate) -> UpstreamsView:
        """Replace the upstream set; calls in flight finish on the server they started on."""
        proxy.set_upstreams(tuple(request.upstreams), model=request.model)
        return upstreams_view()

    # -- rollouts -----------------------------------------------------------------------------------------

    @app.post("/api/rollouts", status_code=201, dependencies=[Management])
    async def create_rollouts(requests: list[RolloutCreate]) -> dict[str, list[RolloutView]]:
        try:
            created = store.create(requests)
        except RolloutConflict as error:
            raise ApiError(409, str(error)) from error
        return {"rollouts": [rollout.view() for rollout in created]}

    @app.get("/api/rollouts", dependencies=[Management])
    async def list_rollouts(state: RolloutState | None = None, group_id: str | None = None) -> dict[str, Any]:
        rollouts = store.select(state=state, group_id=group_id)
        return {"rollouts": [rollout.view() for rollout in rollouts], "cursor": store.feed_cursor}

    @app.post("/api/rollouts/claim", dependencies=[Management])
    async def claim(
        http_request: Request, request: Annotated[ClaimRequest | None, Body()] = None
    ) -> dict[str, list[RolloutView]]:
        request = request or ClaimRequest()
        claiming = asyncio.ensure_future(
            store.claim(
                limit=request.limit,
                wait_seconds=request.wait_seconds,
                lease_seconds=request.lease_seconds,
                takeover=request.takeover,
            )
        )
        # The next ASGI message of a request whose body is read is its disconnect: race the long-poll against
        # it, so a claimer that gives up never leaves rollouts leased to nobody.
        disconnect = asyncio.ensure_future(http_request.receive())
        try:
            await asyncio.wait({claiming, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            disconnect.cancel()
        if not claiming.done():
            claiming.cancel()
            return {"rollouts": []}
        claimed = claiming.result()
        return {"rollouts": [rollout.view() for rollout in claimed]}

    @app.post("/api/rollouts/delete", dependencies=[Management])
    async def delete_rollouts(request: DeleteRequest) -> dict[str, int]:
        return {"deleted": store.delete(request.rollout_ids)}

    @app.post("/api/rollouts/events", dependencies=[Management])
    async def rollout_events_batch(request: EventsBatchRequest) -> Response:
        """Many rollouts' events documents in one answer (see `EventsBatchRequest` for the shape and bounds).

        Each document is built as the single-rollout route builds it, so one unreadable call or event never
        fails the batch; the loop yields between documents so model calls keep flowing meanwhile.
        """
        documents: list[bytes] = []
        missing: list[str] = []
        omitted: list[str] = []
        size = 0
        for rollout_id in dict.fromkeys(request.rollout_ids):
            if documents and size >= request.max_bytes:
                omitted.append(rollout_id)
                continue
            try:
                rollout = store.get(rollout_id)
            except RolloutNotFound:
                missing.append(rollout_id)
                continue
            document = events_document(rollout)
            if documents and size + len(document) > request.max_bytes:
                omitted.append(rollout_id)
                size = request.max_bytes  # full: the rest are omitted without building their documents
                continue
            documents.append(document)
            size += len(document)
            await asyncio.sleep(0)
        head = json.dumps({"instance_id": store.instance_id, "missing": missing, "omitted": omitted})
        body = b'%s,"documents":[%s]}' % (head[:-1].encode(), b",".join(documents))
        return Response(body, media_type="application/json")

    @app.get("/api/rollouts/{rollout_id}", dependencies=[Depends(rollout_access)])
    async def get_rollout(rollout_id: str) -> RolloutView:
        return _get(store, rollout_id).view()

    @app.post("/api/rollouts/{rollout_id}/transition", dependencies=[Management])
    async def transition(rollout_id: str, request: Transition) -> RolloutView:
        _get(store, rollout_id)
        try:
            rollout = store.transition(
                rollout_id, request.state, message=request.message, attempt_id=request.attempt_id
            )
        except RolloutConflict as error:
            raise ApiError(409, str(error)) from error
        return rollout.view()

    @app.post("/api/rollouts/{rollout_id}/launch", dependencies=[Management])
    async def launch(rollout_id: str, request: LaunchRequest) -> LaunchReceipt:
        """Mark the rollout launched (the operator calls this before creating its agent Job); 409 if another
        launch won or the rollout is no longer queued."""
        _get(store, rollout_id)
        try:
            rollout = store.launch(rollout_id, launch_id=request.launch_id)
        except RolloutConflict as error:
            raise ApiError(409, str(error), rollout_id=rollout_id) from error
        return LaunchReceipt(
            rollout=rollout.view(), instance_id=store.instance_id, totals=store.launch_totals
        )

    @app.get("/api/rollouts/{rollout_id}/events", dependencies=[Management])
    async def rollout_events(rollout_id: str) -> Response:
        return Response(events_document(_get(store, rollout_id)), media_type="application/json")

    @app.post(
        "/api/rollouts/{rollout_id}/attempt/{attempt_id}/events",
        status_code=201,
        dependencies=[Depends(rollout_access)],
    )
    async def post_event(rollout_id: str, attempt_id: str, event: AgentEvent) -> dict[str, Any]:
        _get(store, rollout_id)
        size = len(json.dumps(event.data))  # the body passed the door's limits, so this cannot fail
        try:
            store.record_event(rollout_id, attempt_id, event.event_type, event.data, size=size)
        except RolloutFinished as error:
            metrics.rejections.labels("rollout_finished").inc()
            raise ApiError(409, str(error), rollout_id=rollout_id) from error
        except UnknownAttempt as error:
            metrics.rejections.labels("unknown_attempt").inc()
            raise ApiError(404, str(error), rollout_id=rollout_id, attempt_id=attempt_id) from error
        except EventRejected as error:
            metrics.rejections.labels(error.reason).inc()
            raise ApiError(error.status, str(error), field=error.field) from error
        return {"rollout_id": rollout_id, "attempt_id": attempt_id, "event_type": event.event_type}

    @app.get("/api/stats", dependencies=[Management])
    async def stats() -> dict[str, Any]:
        """Rollouts by state now and finished ever (consumed ones get deleted), feed cursor, pause state."""
        counts = {state.value: count for state, count in store.counts_by_state().items()}
        totals = {
            state.value: store.finished_totals.get(state, 0) for state in RolloutState if state.is_terminal
        }
        return {
            "instance_id": store.instance_id,
            "rollouts": counts,
            "finished_totals": totals,
            "launches": store.launch_totals.model_dump(mode="json"),
            "cursor": store.feed_cursor,
            "trainer_report": (
                None if store.trainer_report is None else store.trainer_report.model_dump(mode="json")
            ),
            **pause_json(),
        }

    @app.put("/api/trainer/report", dependencies=[Management])
    async def put_trainer_report(report: TrainerReport) -> TrainerReport:
        """The trainer's last word before it exits with an error (kept for the operator's status)."""
        store.set_trainer_report(report)
        return report

    # -- feeds --------------------------------------------------------------------------------------------

    @app.get("/api/completions", dependencies=[Management])
    async def completions(
        after: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
        wait: Annotated[float, Query(ge=0, le=300)] = 30.0,
    ) -> CompletionPage:
        try:
            entries, cursor = await store.completions(after=after, limit=limit, wait_seconds=wait)
        except FeedGap as error:
            raise ApiError(410, str(error), cursor=store.feed_cursor) from error
        return CompletionPage(entries=entries, cursor=cursor)

    @app.put("/api/window/summary", dependencies=[Management])
    async def put_summary(summary: WindowSummary) -> WindowSummary:
        store.set_summary(summary)
        return summary

    @app.get("/api/window/summary", dependencies=[Management])
    async def get_summary(
        after_step: Annotated[int | None, Query(ge=-1)] = None,
        wait: Annotated[float, Query(ge=0, le=300)] = 0.0,
    ) -> Response:
        summary = await store.summary_after(after_step=after_step, wait_seconds=wait)
        if summary is None:
            return Response(status_code=204)
        return Response(json.dumps(summary.model_dump(mode="json")), media_type="application/json")

    # -- health and metrics -------------------------------------------------------------------------------

    app.include_router(pool_router(key=key, store=store))  # agents.mode: Pool (pool_api.py)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        ready = proxy.session is not None and not proxy.session.closed
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _get(store: RolloutStore, rollout_id: str) -> Rollout:
    try:
        return store.get(rollout_id)
    except RolloutNotFound as error:
        raise ApiError(404, str(error), rollout_id=rollout_id) from error
