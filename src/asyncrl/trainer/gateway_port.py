"""What the step loop needs from the gateway: the calls `StepLoop` and `RowPrefetcher` make, and nothing more.

The trainer owns this contract, so its loop can be driven by anything that keeps it: in production the HTTP
client (`asyncrl.gateway_api.client.GatewayClient`, which satisfies it structurally; mypy checks that below),
in unit tests an in-memory gateway. The types are the gateway's own wire models, so nothing is redefined here.

Failures keep the client's shape: a gateway that is gone raises `httpx.TransportError`, an error answer
raises `GatewayError` with its HTTP status (404 for an unknown rollout, 409 for a refused transition, 410 for
a cursor older than the feed keeps, 5xx while a gateway starts); the loop's recovery relies on exactly these.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from asyncrl.gateway_api.client import EventsBatch, GatewayClient, PauseResult
from asyncrl.gateway_api.models import (
    CompletionPage,
    GatewayStats,
    PauseView,
    RolloutCreate,
    RolloutView,
    UpstreamsView,
    WindowSummary,
)
from asyncrl.rollouts import RolloutState


class TrainerGateway(Protocol):
    """The gateway as the step loop uses it (arguments the loop always passes are required here)."""

    async def stats(self) -> GatewayStats:
        """The gateway's state; its `instance_id` changes when it restarted and lost what it held."""
        ...

    async def set_upstreams(self, urls: Iterable[str], *, model: str | None) -> UpstreamsView:
        """Register the model servers agents' calls go to (a restarted gateway has forgotten them)."""
        ...

    async def pause(
        self,
        *,
        reason: str | None,
        retry_after_seconds: float,
        wait_seconds: float,
        abort: bool = False,
    ) -> PauseResult:
        """Stop forwarding model calls and wait (bounded) for those in flight; `abort` cancels them."""
        ...

    async def resume(self, *, model_version: int | None) -> PauseView:
        """Forward model calls again, served by weights of `model_version`."""
        ...

    async def create_rollouts(self, rollouts: Iterable[RolloutCreate]) -> list[RolloutView]: ...

    async def list_rollouts(self) -> tuple[list[RolloutView], int]:
        """Every rollout the gateway holds (read in bounded pages), and the completion feed's cursor when the
        listing began: a rollout that ended meanwhile may show ended in the listing and in the feed too."""
        ...

    async def transition(self, rollout_id: str, state: RolloutState, *, message: str | None) -> RolloutView:
        """Move a rollout to `state` (the loop only cancels); 404 unknown, 409 already terminal."""
        ...

    async def completions(self, *, after: int, wait_seconds: float) -> CompletionPage:
        """Rollouts that ended after the cursor `after`, waiting up to `wait_seconds` for one (long-poll)."""
        ...

    async def delete_rollouts(self, rollout_ids: Iterable[str]) -> int: ...

    async def rollout_events_batch(self, rollout_ids: Iterable[str], *, max_bytes: int | None) -> EventsBatch:
        """Many rollouts' events documents in one answer, bounded by `max_bytes` (the prefetcher's path)."""
        ...

    async def put_summary(self, summary: WindowSummary) -> None:
        """Leave the step's window summary with the gateway, for the operator and local mode."""
        ...


if TYPE_CHECKING:

    def _the_http_client_keeps_the_contract(client: GatewayClient) -> TrainerGateway:
        return client  # mypy fails here if GatewayClient stops satisfying TrainerGateway
