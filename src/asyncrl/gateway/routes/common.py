"""What every router shares: the gateway's parts, the one error shape, and the access check.

Off the hot path, so clarity wins here: typed request models and one error shape (`{"error": ..., ...}`).
Which caller may call which route is `access.py`'s table. Requests reach these routes only through admission
(`admission.py`: token before body, byte and JSON limits), because FastAPI reads a body before it runs
dependencies; `access_check`, which every route runs, reads the same table as a second line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from fastapi.params import Depends as DependsParam

from asyncrl.gateway.access import route_access
from asyncrl.gateway.admission import authorize
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.metrics import GatewayMetrics
from asyncrl.gateway.pause_state import PauseState
from asyncrl.gateway.proxy import ProxyHandler
from asyncrl.gateway.store import Rollout, RolloutNotFound, RolloutStore

T = TypeVar("T")


async def unless_disconnected(
    http_request: Request, work: Coroutine[Any, Any, T], *, undo: Callable[[T], object] | None = None
) -> T | None:
    """`await work`, or cancel it and return None when the client disconnects first (a long-poll whose caller
    gave up must not hand it anything). The next ASGI message of a request whose body was read is its
    disconnect, so the work is raced against it.

    Work and disconnect can end in the same loop turn (the wake-up that ends a long-poll may be read in the
    same turn as the closed connection): the disconnect then wins too, and `undo` gets the work's result (a
    claim gives its leases back), so a caller that is gone never holds anything."""
    task = asyncio.ensure_future(work)
    disconnect = asyncio.ensure_future(http_request.receive())
    try:
        await asyncio.wait({task, disconnect}, return_when=asyncio.FIRST_COMPLETED)
        if task.done() and not disconnect.done():
            await asyncio.sleep(0)  # a disconnect already delivered to this turn's callbacks lands now
    finally:
        if not disconnect.done():
            disconnect.cancel()
    gone = (
        disconnect.done()
        and not disconnect.cancelled()
        and disconnect.exception() is None
        and _is_disconnect(disconnect.result())
    )
    if not task.done():
        gone = True
        task.cancel()
        # A work woken in the turn of its cancel may still end with its result (asyncio.wait_for keeps a
        # result that lands with the cancel): wait for it, so that `undo` sees what it took.
        await asyncio.wait({task})
    if not gone:
        return task.result()
    if undo is not None and not task.cancelled() and task.exception() is None:
        undo(task.result())
    return None


def _is_disconnect(message: Any) -> bool:
    return isinstance(message, dict) and message.get("type") == "http.disconnect"


class ApiError(Exception):
    def __init__(self, status: int, error: str, **extra: Any) -> None:
        super().__init__(error)
        self.status = status
        self.body = {"error": error, **extra}


@dataclass(frozen=True)
class GatewayParts:
    """The state the routes act on (one of each per gateway process)."""

    config: GatewayConfig
    pause: PauseState
    store: RolloutStore
    metrics: GatewayMetrics
    proxy: ProxyHandler

    @property
    def key(self) -> str:
        return self.config.key.get_secret_value()

    def pause_fields(self) -> dict[str, Any]:
        """The pause state's fields (of `PauseView`) as the pause routes and /api/stats answer them."""
        pause = self.pause
        return {
            **pause.snapshot().as_json(),
            "model_version": pause.model_version,
            **self.proxy.pause_policy.state_fields(),
        }

    def rollout(self, rollout_id: str) -> Rollout:
        """The stored rollout, or 404 naming it."""
        try:
            return self.store.get(rollout_id)
        except RolloutNotFound as error:
            raise ApiError(404, str(error), rollout_id=rollout_id) from error


def access_check(parts: GatewayParts) -> DependsParam:
    """The dependency every route runs: the caller `access.py`'s table admits on this method and path, or
    admission's refusal (`admission.Refused`, answered as admission answers it). A coroutine: FastAPI runs a
    plain function dependency in its thread pool, which cost every request a thread hop and extra loop
    turns."""

    async def check(request: Request) -> None:
        access = route_access(request.method, request.scope["path"])
        authorize(parts.key, request.headers.get("authorization"), access)

    return DependsParam(check)
