"""The rollouts' events: agents post theirs (a reward) with their own token; the trainer reads each rollout's
events document (captured model calls and events) back, one at a time or many in one bounded answer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from asyncrl.gateway.capture import events_document
from asyncrl.gateway.models import AgentEvent, EventsBatchRequest
from asyncrl.gateway.routes.common import ApiError, GatewayParts, management, rollout_access
from asyncrl.gateway.store import EventRejected, RolloutFinished, RolloutNotFound, UnknownAttempt


def events_router(parts: GatewayParts) -> APIRouter:
    router = APIRouter()
    store, metrics = parts.store, parts.metrics
    Management = management(parts)
    OwnRollout = rollout_access(parts)

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
