"""The rollout store's routes: create, list, claim (long-poll), launch, transition, delete.

The trainer creates rollouts; the operator (or local mode) claims and launches them and reports their states.
The rollouts' events are `events.py`'s.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Request, Response

from asyncrl.gateway.routes.common import ApiError, GatewayParts, unless_disconnected
from asyncrl.gateway.store import (
    RolloutConflict,
)
from asyncrl.gateway_api import paths
from asyncrl.gateway_api.models import (
    DEFAULT_LISTING_PAGE,
    MAX_LISTING_PAGE,
    ClaimRequest,
    DeleteRequest,
    LaunchReceipt,
    LaunchRequest,
    RolloutCreate,
    RolloutPage,
    RolloutView,
    Transition,
)
from asyncrl.rollouts import RolloutState

PAGE_PATTERN = r"^[0-9]{1,18}$"  # a listing position, as `next_page` gave it


def rollouts_router(parts: GatewayParts) -> APIRouter:
    router = APIRouter()
    store = parts.store

    @router.post(paths.ROLLOUTS, status_code=201)
    async def create_rollouts(requests: list[RolloutCreate]) -> dict[str, list[RolloutView]]:
        try:
            created = store.create(requests)
        except RolloutConflict as error:
            raise ApiError(409, str(error)) from error
        return {"rollouts": [rollout.view() for rollout in created]}

    @router.get(paths.ROLLOUTS)
    async def list_rollouts(
        state: RolloutState | None = None,
        group_id: str | None = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LISTING_PAGE)] = DEFAULT_LISTING_PAGE,
        page: Annotated[str | None, Query(pattern=PAGE_PATTERN)] = None,
    ) -> Response:
        """One bounded page (`RolloutPage`): the whole listing in one answer held the loop for seconds."""
        found = store.list_page(state=state, group_id=group_id, after=int(page or 0), limit=limit)
        answer = RolloutPage(
            rollouts=[rollout.view() for rollout in found.items],
            cursor=store.feed_cursor,
            next_page=None if found.last_position is None else str(found.last_position),
        )
        return Response(answer.model_dump_json(), media_type="application/json")

    @router.post(paths.ROLLOUTS_CLAIM)
    async def claim(
        http_request: Request, request: Annotated[ClaimRequest | None, Body()] = None
    ) -> dict[str, list[RolloutView]]:
        request = request or ClaimRequest()
        # A claimer that gives up never leaves rollouts leased to nobody; one whose answer is lost after it
        # was sent asks again with the same claim key and gets the same rollouts.
        claimed = await unless_disconnected(
            http_request,
            store.claim(
                limit=request.limit,
                wait_seconds=request.wait_seconds,
                lease_seconds=request.lease_seconds,
                takeover=request.takeover,
                claim_key=request.claim_key,
            ),
            undo=store.release,
        )
        if claimed is None:
            return {"rollouts": []}
        return {"rollouts": [rollout.view() for rollout in claimed]}

    @router.post(paths.ROLLOUTS_DELETE)
    async def delete_rollouts(request: DeleteRequest) -> dict[str, int]:
        return {"deleted": store.delete(request.rollout_ids)}

    @router.get(paths.ROLLOUT)
    async def get_rollout(rollout_id: str) -> RolloutView:
        return parts.rollout(rollout_id).view()

    @router.post(paths.ROLLOUT_TRANSITION)
    async def transition(rollout_id: str, request: Transition) -> RolloutView:
        parts.rollout(rollout_id)
        if request.instance_id is not None and request.instance_id != store.instance_id:
            raise ApiError(
                409,
                f"rollout {rollout_id!r} was launched through gateway instance {request.instance_id}; this "
                f"is instance {store.instance_id} (the gateway restarted): the outcome is not applied",
                instance_id=store.instance_id,
            )
        try:
            rollout = store.transition(
                rollout_id, request.state, message=request.message, attempt_id=request.attempt_id
            )
        except RolloutConflict as error:
            raise ApiError(409, str(error)) from error
        return rollout.view()

    @router.post(paths.ROLLOUT_LAUNCH)
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

    return router
