"""The operator's link to one run's gateway: calls that wait out its absence, which instance answers, and the
Job counters derived from its launch totals.

The gateway lives in the trainer pod, so it is absent while that pod starts or restarts: calls are retried
with backoff (`retry.py`) and the link says whether the gateway was reachable last time. Every answer that
carries the gateway's `instance_id` goes through `observe`: a new instance means the gateway restarted and
lost its rollouts, which the link announces (`restarted`, the `on_restart` callback, a warning Event on the
run) so that the dispatcher resets what it knew of them.

Counters: `jobs.created` and `jobs.failed` are the gateway's launch totals plus an offset for earlier gateway
instances (`job_counters.py`, kept in an annotation of the run), and never below what a written status
showed; so neither a restart nor TTL deletion of Jobs makes them shrink.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from asyncrl.gateway_api.client import GatewayClient
from asyncrl.gateway_api.models import GatewayStats, LaunchTotals
from asyncrl.operator.kube import Kube
from asyncrl.operator.retry import (
    Backoff,
    gateway_error_is_transient,
    kube_call,
    one_line_reason,
    retry_transient,
)
from asyncrl.operator.run_link.job_counters import (
    ANNOTATION_JOB_COUNTER_OFFSET,
    JobCounterOffset,
    JobCountsSeen,
)

if TYPE_CHECKING:
    from asyncrl.operator.run_link.run_context import RunContext

logger = logging.getLogger(__name__)

T = TypeVar("T")

GATEWAY_BACKOFF = Backoff(first_seconds=0.5, max_seconds=5.0)  # the gateway may be starting: wait it out


class GatewayLink:
    def __init__(
        self,
        context: RunContext,
        *,
        kube: Kube,
        client: GatewayClient,
        shown: JobCountsSeen,
        on_change: Callable[[], None],
        on_restart: Callable[[], None],
    ) -> None:
        """`shown`: the counts the stored status shows; `on_change`: something the status shows changed;
        `on_restart`: a new gateway instance answered (called before `restarted` is set)."""
        self.context = context
        self.kube = kube
        self.client = client
        self.reachable = False
        self.instance: str | None = None  # the gateway instance that answered last
        self.known = asyncio.Event()  # set once an instance has answered
        self.restarted = asyncio.Event()  # set on each new instance after the first; cleared by its reader
        self._on_change = on_change
        self._on_restart = on_restart
        self._shown = shown
        annotations = context.run["metadata"].get("annotations") or {}
        self._offset = JobCounterOffset.from_annotation(annotations.get(ANNOTATION_JOB_COUNTER_OFFSET))
        self._launch_totals: LaunchTotals | None = None
        self._lock = asyncio.Lock()

    async def call(self, call: Callable[[], Awaitable[T]]) -> T:
        """Call the gateway, waiting out its absence (the trainer pod is starting or restarting) and its
        transient errors with backoff; a 4xx raises `GatewayError`."""

        def unreachable(error: BaseException) -> None:
            if self.reachable:
                logger.info("run %s: gateway unreachable: %s", self.context.name, one_line_reason(error))
                self.reachable = False
                self._on_change()

        result = await retry_transient(
            call,
            is_transient=gateway_error_is_transient,
            what=f"run {self.context.name}: gateway call",
            backoff=GATEWAY_BACKOFF,
            on_retry=unreachable,
        )
        if not self.reachable:
            self.reachable = True
            self._on_change()  # the writer reads the stats next, which notices a restarted gateway
        return result

    async def read_stats(self) -> GatewayStats:
        stats = await self.call(self.client.stats)
        await self.observe(stats.instance_id, stats.launches)
        return stats

    def job_counts(self) -> JobCountsSeen:
        if self._launch_totals is None:
            return self._shown
        return self._offset.counts(self._launch_totals, at_least=self._shown)

    def counts_shown(self, counts: JobCountsSeen) -> None:
        """The counts a status just written shows: the counters never go below them."""
        self._shown = counts

    async def observe(self, instance_id: str, totals: LaunchTotals) -> None:
        """Take the gateway's launch totals; a new gateway instance rebases the counters and is announced."""
        async with self._lock:
            if instance_id == self.instance:
                if self._launch_totals is None or totals.launched >= self._launch_totals.launched:
                    self._launch_totals = totals  # answers may arrive out of order: keep the newest
                return
            previous = self.instance
            shown = self.job_counts()  # with the old instance's totals, before switching
            offset = self._offset.for_instance(instance_id, totals, shown=shown)
            self._shown = shown
            self.instance = instance_id
            self._launch_totals = totals
            if offset != self._offset:
                self._offset = offset
                await asyncio.shield(self._persist_offset())
            if previous is not None:
                logger.warning(
                    "run %s: the gateway restarted (instance %s → %s): its rollouts are gone; resetting",
                    self.context.name,
                    previous,
                    instance_id,
                )
                self._on_restart()
                self.restarted.set()
                await self.kube.post_event(
                    self.context.run,
                    reason="GatewayRestarted",
                    message="the gateway restarted and lost its rollouts; the unfinished agent Jobs "
                    "launched through it are deleted and its new rollouts are launched",
                    warning=True,
                )
            self.known.set()
            self._on_change()

    async def _persist_offset(self) -> None:
        patch = {ANNOTATION_JOB_COUNTER_OFFSET: self._offset.to_annotation()}
        try:
            await kube_call(
                lambda: self.kube.patch_run_annotations(self.context.namespace, self.context.name, patch),
                what=f"run {self.context.name}: saving the Job counter offset",
            )
        except Exception as error:  # the stored status still keeps the counts from going down
            logger.warning(
                "run %s: could not save the Job counter offset: %s", self.context.name, one_line_reason(error)
            )
