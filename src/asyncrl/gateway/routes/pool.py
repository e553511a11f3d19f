"""The agent pool's routes: long-lived agent pods take rollouts one after another (`spec.agents.mode: Pool`).

At most once per rollout, as with Jobs: a claim launches the rollout in the same step (the store's launch
record, `pool:<worker>:<id>`), so no other worker and no operator can launch it again. A worker runs one
rollout at a time and reports `running` before it starts the agent; so when a worker claims again, a rollout
it launched earlier is either still `queued` (the worker never saw the answer, or stopped before starting
the agent: handed to it again, it was never run) or `running` (the worker restarted mid-rollout: failed now,
never rerun). Rollouts of workers that no longer exist (a deleted pod) are failed by the operator through
`/api/pool/release`.

The pool token (`auth.pool_token`) opens `claim` and `transition` and nothing else; `release` is the
operator's, with the gateway key (a pool pod must not fail other pods' rollouts); agents get their rollout's
own token. As for every route, `access.py`'s table says so.
"""

from __future__ import annotations

import contextlib
import time
import uuid

from fastapi import APIRouter, Request

from asyncrl.gateway.routes.common import ApiError, GatewayParts, unless_disconnected
from asyncrl.gateway.store import Rollout, RolloutConflict
from asyncrl.gateway_api import paths
from asyncrl.gateway_api.pool import PoolAssignment, PoolClaim, PoolOutcome, PoolRelease, PoolReleased
from asyncrl.gateway_api.tokens import agent_token
from asyncrl.rollouts import RolloutState

LAUNCH_PREFIX = "pool:"
CLAIM_LEASE_SECONDS = 30.0
NOT_RERUN = "not rerun (a rollout runs at most once)"
INTERRUPTED = "the agent pool pod {worker} restarted while running this rollout; " + NOT_RERUN
WORKER_GONE = "the agent pool pod {worker} that ran this rollout no longer exists; " + NOT_RERUN


def launch_id_of(worker: str) -> str:
    return f"{LAUNCH_PREFIX}{worker}:{uuid.uuid4().hex}"


def worker_of(rollout: Rollout) -> str | None:
    """The pool worker that launched this rollout, or None (a Job launch, or not launched)."""
    launch_id = rollout.launch_id or ""
    if not launch_id.startswith(LAUNCH_PREFIX):
        return None
    return launch_id[len(LAUNCH_PREFIX) :].rpartition(":")[0] or None


def pool_router(parts: GatewayParts) -> APIRouter:
    router = APIRouter()
    store, key = parts.store, parts.key

    def fail(rollout: Rollout, message: str) -> None:
        with contextlib.suppress(RolloutConflict):  # ended meanwhile (cancelled, timed out)
            store.transition(rollout.rollout_id, RolloutState.FAILED, message=message, attempt_id=None)

    @router.post(paths.POOL_CLAIM)
    async def claim(http_request: Request, request: PoolClaim) -> PoolAssignment:
        interrupted: list[str] = []
        for rollout in store.select():
            if worker_of(rollout) != request.worker or rollout.state.is_terminal:
                continue
            if rollout.state is RolloutState.QUEUED:  # launched for this worker, never started: hand it over
                return _assignment(rollout, key, interrupted)
            fail(rollout, INTERRUPTED.format(worker=request.worker))
            interrupted.append(rollout.rollout_id)
        # A worker that gave up waiting must not be handed a rollout it will never read.
        claimed = await unless_disconnected(
            http_request,
            store.claim(limit=1, wait_seconds=request.wait_seconds, lease_seconds=CLAIM_LEASE_SECONDS),
            undo=store.release,
        )
        if claimed is None:
            return PoolAssignment(interrupted=interrupted)
        for rollout in claimed:
            try:
                store.launch(rollout.rollout_id, launch_id=launch_id_of(request.worker))
            except RolloutConflict:  # launched by someone else between the claim and now
                continue
            return _assignment(rollout, key, interrupted)
        return PoolAssignment(interrupted=interrupted)

    @router.post(paths.POOL_TRANSITION)
    async def transition(rollout_id: str, request: PoolOutcome) -> dict[str, str]:
        rollout = parts.rollout(rollout_id)
        if worker_of(rollout) != request.worker:
            raise ApiError(409, f"rollout {rollout_id} was not launched by pool worker {request.worker}")
        try:
            rollout = store.transition(
                rollout_id, request.state, message=request.message, attempt_id=request.attempt_id
            )
        except RolloutConflict as error:
            raise ApiError(409, str(error)) from error
        return {"rollout_id": rollout_id, "state": str(rollout.state)}

    @router.post(paths.POOL_RELEASE)
    async def release(request: PoolRelease) -> PoolReleased:
        live = set(request.live_workers)
        failed: list[str] = []
        for rollout in store.select():
            worker = worker_of(rollout)
            if worker is None or worker in live or rollout.state.is_terminal:
                continue
            if (rollout.launched_at or 0.0) > time.time() - request.min_age_seconds:
                continue
            fail(rollout, WORKER_GONE.format(worker=worker))
            failed.append(rollout.rollout_id)
        return PoolReleased(failed=failed)

    return router


def _assignment(rollout: Rollout, key: str, interrupted: list[str]) -> PoolAssignment:
    return PoolAssignment(
        rollout=rollout.view(),
        launch_id=rollout.launch_id,
        agent_key=agent_token(key, rollout.rollout_id),
        interrupted=interrupted,
    )
