"""The rollout store's routes: create, list, claim (long-poll), launch, transition, delete, and events.

The trainer creates rollouts, the operator (or local mode) claims and launches them and reports their
states, agents post their events with their own token, and the trainer reads the captured events back.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from fastapi import APIRouter, Body, Request
from fastapi.responses import Response

from asyncrl.gateway.capture import events_document
from asyncrl.gateway.models import (
    AgentEvent,
    ClaimRequest,
    DeleteRequest,
    EventsBatchRequest,
    LaunchReceipt,
    LaunchRequest,
    RolloutCreate,
    RolloutView,
    Transition,
)
from asyncrl.gateway.routes.common import ApiError, GatewayParts, management, rollout_access
from asyncrl.gateway.store import (
    EventRejected,
    RolloutConflict,
    RolloutFinished,
    RolloutNotFound,
    UnknownAttempt,
)
from asyncrl.rollouts import RolloutState


def rollouts_router(parts: GatewayParts) -> APIRouter:
    router = APIRouter()
    store, metrics = parts.store, parts.metrics
    Management = management(parts)
    OwnRollout = rollout_access(parts)

    @router.post("/api/rollouts", status_code=201, dependencies=[Management])
    async def create_rollouts(requests: list[RolloutCreate]) -> dict[str, list[RolloutView]]:
        try:
            created = store.create(requests)
        except RolloutConflict as error:
            raise ApiError(409, str(error)) from error
        return {"rollouts": [rollout.view() for rollout in created]}

    @router.get("/api/rollouts", dependencies=[Management])
    async def list_rollouts(state: RolloutState | None = None, group_id: str | None = None) -> dict[str, Any]:
        rollouts = store.select(state=state, group_id=group_id)
        return {"rollouts": [rollout.view() for rollout in rollouts], "cursor": store.feed_cursor}

    @router.post("/api/rollouts/claim", dependencies=[Management])
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

    @router.post("/api/rollouts/delete", dependencies=[Management])
    async def delete_rollouts(request: DeleteRequest) -> dict[str, int]:
        return {"deleted": store.delete(request.rollout_ids)}

    @router.post("/api/rollouts/events", dependencies=[Management])
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

    @router.get("/api/rollouts/{rollout_id}", dependencies=[OwnRollout])
    async def get_rollout(rollout_id: str) -> RolloutView:
        return parts.rollout(rollout_id).view()

    @router.post("/api/rollouts/{rollout_id}/transition", dependencies=[Management])
    async def transition(rollout_id: str, request: Transition) -> RolloutView:
        parts.rollout(rollout_id)
        try:
            rollout = store.transition(
                rollout_id, request.state, message=request.message, attempt_id=request.attempt_id
            )
        except RolloutConflict as error:
            raise ApiError(409, str(error)) from error
        return rollout.view()

    @router.post("/api/rollouts/{rollout_id}/launch", dependencies=[Management])
    async def launch(rollout_id: str, request: LaunchRequest) -> LaunchReceipt:
        """Mark the rollout launched (the operator calls this before creating its agent Job); 409 if another
        launch won or the rollout is no longer queued."""
        parts.rollout(rollout_id)
        try:
            rollout = store.launch(rollout_id, launch_id=request.launch_id)
        except RolloutConflict as error:
            raise ApiError(409, str(error), rollout_id=rollout_id) from error
        return LaunchReceipt(
            rollout=rollout.view(), instance_id=store.instance_id, totals=store.launch_totals
        )

    @router.get("/api/rollouts/{rollout_id}/events", dependencies=[Management])
    async def rollout_events(rollout_id: str) -> Response:
        return Response(events_document(parts.rollout(rollout_id)), media_type="application/json")

    @router.post(
        "/api/rollouts/{rollout_id}/attempt/{attempt_id}/events", status_code=201, dependencies=[OwnRollout]
    )
    async def post_event(rollout_id: str, attempt_id: str, event: AgentEvent) -> dict[str, Any]:
        parts.rollout(rollout_id)
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

    return router
