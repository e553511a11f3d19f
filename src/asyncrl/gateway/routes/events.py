"""The rollouts' events: agents post theirs (a reward) with their own token; the trainer reads each rollout's
events document (captured model calls and events) back, one at a time or many in one bounded answer.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from asyncrl.gateway.admission import PARSED_BODY_SCOPE_KEY
from asyncrl.gateway.capture import events_document
from asyncrl.gateway.routes.common import ApiError, GatewayParts
from asyncrl.gateway.store import EventRejected, RolloutFinished, RolloutNotFound, UnknownAttempt
from asyncrl.gateway_api import paths
from asyncrl.gateway_api.models import AgentEvent, EventsBatchRequest

_ENCODER = msgspec.json.Encoder()
_EVENT_SCHEMA = AgentEvent.model_json_schema()


def events_router(parts: GatewayParts) -> APIRouter:
    router = APIRouter()
    store, metrics = parts.store, parts.metrics

    @router.post(paths.ROLLOUTS_EVENTS)
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

    @router.get(paths.ROLLOUT_EVENTS)
    async def rollout_events(rollout_id: str) -> Response:
        return Response(events_document(parts.rollout(rollout_id)), media_type="application/json")

    @router.post(
        paths.ATTEMPT_EVENTS,
        status_code=201,
        openapi_extra={"requestBody": {"content": {"application/json": {"schema": _EVENT_SCHEMA}}}},
    )
    async def post_event(request: Request, rollout_id: str, attempt_id: str) -> dict[str, Any]:
        # Admission parsed the body once (msgspec) and left it in the scope: it is validated here, not parsed
        # again by FastAPI (a 5.7 MB body was parsed three times and sized by json.dumps before its 413).
        try:
            event = AgentEvent.model_validate(request.scope.get(PARSED_BODY_SCOPE_KEY))
        except ValidationError as error:
            problems = [
                {**problem, "loc": ("body", *problem["loc"])} for problem in error.errors(include_url=False)
            ]
            raise RequestValidationError(problems) from None
        parts.rollout(rollout_id)
        size = len(_ENCODER.encode(event.data))  # its JSON size; the body passed admission's limits
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
