"""What the trainer and the operator read and report: the completion feed, the window summary, the stats and
the trainer's last report.

The trainer long-polls the completion feed (no per-rollout polling) and posts each step's window summary; the
operator long-polls the summary and reads the stats once per cycle to write the run's status.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from asyncrl.gateway.routes.common import ApiError, GatewayParts
from asyncrl.gateway.store import FeedGap
from asyncrl.gateway_api import paths
from asyncrl.gateway_api.models import CompletionPage, GatewayStats, TrainerReport, WindowSummary
from asyncrl.rollouts import RolloutState

TERMINAL_ORDER = tuple(state for state in RolloutState if state.is_terminal)


def feeds_router(parts: GatewayParts) -> APIRouter:
    router = APIRouter()
    store = parts.store

    @router.get(paths.STATS)
    async def stats() -> dict[str, Any]:
        """Rollouts by state now and finished ever (consumed ones get deleted), feed cursor, pause state."""
        return GatewayStats(
            instance_id=store.instance_id,
            rollouts=store.counts_by_state(),
            finished_totals={state: store.finished_totals.get(state, 0) for state in TERMINAL_ORDER},
            launches=store.launch_totals,
            cursor=store.feed_cursor,
            trainer_report=store.trainer_report,
            **parts.pause_fields(),
        ).wire()

    @router.put(paths.TRAINER_REPORT)
    async def put_trainer_report(report: TrainerReport) -> TrainerReport:
        """The trainer's last word before it exits with an error (kept for the operator's status)."""
        store.set_trainer_report(report)
        return report

    @router.get(paths.COMPLETIONS)
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

    @router.put(paths.WINDOW_SUMMARY)
    async def put_summary(summary: WindowSummary) -> WindowSummary:
        return store.set_summary(summary)

    @router.get(paths.WINDOW_SUMMARY)
    async def get_summary(
        after_step: Annotated[int | None, Query(ge=-1)] = None,
        after_posted: Annotated[int | None, Query(ge=0)] = None,
        wait: Annotated[float, Query(ge=0, le=300)] = 0.0,
    ) -> Response:
        summary = await store.summary_after(
            after_step=after_step, after_posted=after_posted, wait_seconds=wait
        )
        if summary is None:
            return Response(status_code=204)
        return Response(json.dumps(summary.model_dump(mode="json")), media_type="application/json")

    return router
