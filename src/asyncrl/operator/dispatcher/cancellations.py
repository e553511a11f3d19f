"""The gateway's completion feed becomes Job deletions: the Jobs of rollouts it ended without them.

A rollout the gateway cancelled (a stale group) or timed out has no use for its Job: the cancellation loop
follows the feed (long-polled from a cursor) and deletes those Jobs. A cursor that fell behind the retained
feed (410) resyncs, and the run's unfinished Jobs whose rollout the gateway no longer wants are deleted
(`delete_orphaned_jobs`), as at the start.

Gateway restarts: every agent Job carries the gateway instance it was launched through. When the link sees a
new `instance_id`, the dispatcher resets its completion cursor and report bookkeeping, deletes the old
instance's unfinished Jobs (their rollouts are gone with it) and ignores the old Jobs' outcomes
(`reports.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Coroutine
from typing import Any, TypeVar

from asyncrl.gateway_api.client import GatewayError
from asyncrl.gateway_api.models import CompletionEntry
from asyncrl.operator.dispatcher.job_state import rollout_state_of_job
from asyncrl.operator.dispatcher.shared import (
    ANNOTATION_GATEWAY_INSTANCE,
    DispatchIO,
    DispatchState,
    job_annotations,
)
from asyncrl.operator.kube import JSON
from asyncrl.rollouts import RolloutState
from asyncrl.workloads import names

T = TypeVar("T")

ENDED_WITHOUT_JOB = (RolloutState.CANCELLED, RolloutState.TIMED_OUT)


class Canceller:
    def __init__(self, io: DispatchIO, state: DispatchState) -> None:
        self.io = io
        self.state = state

    async def cancellation_loop(self) -> None:
        """Delete the Jobs of rollouts the gateway ended without them (stale groups, gateway timeouts)."""
        link = self.io.link
        cursor = (await link.read_stats()).cursor
        link.restarted.clear()
        await self.delete_orphaned_jobs()
        while True:
            if link.restarted.is_set():
                link.restarted.clear()
                cursor = (await link.read_stats()).cursor
                await self.delete_orphaned_jobs()
            cursor = await self._follow(cursor)

    async def _follow(self, cursor: int) -> int:
        """Act on the feed's next page after `cursor`: the cursor to follow next."""
        io = self.io
        completions = functools.partial(io.gateway.completions, after=cursor, wait_seconds=30)
        try:
            page = await self._until_gateway_restart(io.link.call(completions))
        except GatewayError as error:
            if error.status != 410:
                raise
            await self.delete_orphaned_jobs()
            return int(error.body.get("cursor", 0))  # fell behind the retained feed: resync
        if page is None:
            return cursor  # the gateway restarted while we waited: start over on the new one
        if not page.entries:
            await io.link.read_stats()  # a quiet half-minute: make sure it is the same gateway
        for entry in page.entries:
            await self._delete_if_ended(entry)
        return page.cursor

    async def _delete_if_ended(self, entry: CompletionEntry) -> None:
        if entry.state not in ENDED_WITHOUT_JOB:
            return
        job_name = names.agent_job_name(self.io.context.name, entry.rollout_id)
        if job_name in self.state.active or entry.state is RolloutState.CANCELLED:
            await self.io.kube.delete_job(self.io.context.namespace, job_name)

    async def _until_gateway_restart(self, call: Coroutine[Any, Any, T]) -> T | None:
        """`await call`, or None (the call cancelled) as soon as a gateway restart is noticed."""
        restarted_event = self.io.link.restarted
        work = asyncio.ensure_future(call)
        restarted = asyncio.ensure_future(restarted_event.wait())
        try:
            await asyncio.wait({work, restarted}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: the call must not outlive us (nor the gateway client)
            work.cancel()
            raise
        finally:
            restarted.cancel()
        if restarted_event.is_set():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
            return None
        return work.result()

    async def delete_orphaned_jobs(self) -> None:
        """Unfinished Jobs of rollouts the gateway no longer wants (after a restart of either side)."""
        context = self.io.context
        for job in await self.io.kube.list_agent_jobs(context.namespace, context.name):
            if rollout_state_of_job(job.get("status")) is not None and job["status"].get("active", 0) == 0:
                continue
            if await self._orphaned(job):
                await self.io.kube.delete_job(context.namespace, job["metadata"]["name"])

    async def _orphaned(self, job: JSON) -> bool:
        """Launched through an earlier gateway instance, or its rollout gone, cancelled or timed out."""
        io, annotations = self.io, job_annotations(job)
        rollout_id = annotations.get(names.ANNOTATION_ROLLOUT_ID)
        if rollout_id is None:
            return False
        instance = annotations.get(ANNOTATION_GATEWAY_INSTANCE)
        if instance is not None and instance != io.link.instance:
            return True
        try:
            rollout = await io.link.call(functools.partial(io.gateway.get_rollout, rollout_id))
        except GatewayError as error:
            if error.status != 404:
                raise
            return True
        return rollout is None or rollout.state in ENDED_WITHOUT_JOB
