"""The status half of a run's controller: what the run looks like, written only when it changed.

The rollout-Job supervisor (`controller.RunController`) launches agent Jobs and reports their outcomes; it
tells this writer when something it observed changed (`changed()`). The writer long-polls the trainer's
window summary, reads the gateway's stats once per cycle (counts, launch totals, the trainer's report), turns
all of it into the next status with the pure rules of `status.py`, and patches the run's status at most once
per `STATUS_MIN_INTERVAL_SECONDS`, only when the payload differs from what it last wrote.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import httpx

from asyncrl.api import AsyncTrainingRunStatus, Phase
from asyncrl.api.types import AgentsMode
from asyncrl.gateway.client import GatewayClient, GatewayError
from asyncrl.gateway.models import TrainerOutcome, TrainerReport
from asyncrl.operator.kube import JSON, Kube
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.status import RunObservation, next_status
from asyncrl.rollouts import RolloutState
from asyncrl.window_summary import WindowSummary

if TYPE_CHECKING:
    from asyncrl.operator.controller import RunContext
    from asyncrl.operator.gateway_link import GatewayLink

logger = logging.getLogger(__name__)

T = TypeVar("T")
STATUS_MIN_INTERVAL_SECONDS = 1.0
SUMMARY_WAIT_SECONDS = 30


class Supervisor(Protocol):
    """What the writer reads from the rollout-Job supervisor."""

    trainer_job: JSON | None
    ray_cluster: str | None  # KubeRay's state of a multi-node run's cluster
    template_error: str | None
    fatal_error: str | None

    @property
    def active_jobs(self) -> int: ...

    async def stop_failed_run(self) -> None: ...


class StatusWriter:
    def __init__(
        self,
        context: RunContext,
        *,
        supervisor: Supervisor,
        link: GatewayLink,
        kube: Kube,
        gateway: GatewayClient,
        metrics: OperatorMetrics,
    ) -> None:
        self.context = context
        self.supervisor = supervisor
        self.link = link
        self.kube = kube
        self.gateway = gateway
        self.metrics = metrics
        self.status = self.stored_status(context.run)
        self._dirty = asyncio.Event()
        self._written: dict[str, Any] | None = None
        self._summary: WindowSummary | None = None
        self._rollout_counts: dict[RolloutState, int] | None = None
        self._trainer_report: TrainerReport | None = None
        self._stats_read_at = -float("inf")  # monotonic time of the last stats read

    @staticmethod
    def stored_status(run: JSON) -> AsyncTrainingRunStatus:
        """The status the run has stored (what an earlier operator process wrote)."""
        return AsyncTrainingRunStatus.model_validate(run.get("status") or {})

    def changed(self) -> None:
        """Something the status shows may have changed: write (if it did) at the next chance."""
        self._dirty.set()

    async def summary_loop(self) -> None:
        last_step: int | None = None
        while True:
            after_step = -1 if last_step is None else last_step
            poll = functools.partial(
                self.gateway.summary, after_step=after_step, wait_seconds=SUMMARY_WAIT_SECONDS
            )
            summary = await self.link.call(poll)
            if summary is not None and summary.step != last_step:
                last_step = summary.step
                self._summary = summary
                self._dirty.set()
            # Now, while the gateway is surely up: counts, and a trainer report (which also ends the wait).
            # Changed counts are written too: a Pool run has no Job events to wake the writer between steps.
            report, counts = self._trainer_report, self._rollout_counts
            await self._read_stats()
            if self._trainer_report != report or self._rollout_counts != counts:
                self._dirty.set()

    async def status_loop(self) -> None:
        last_write = 0.0
        while True:
            await self.write()
            last_write = time.monotonic()
            self._dirty.clear()
            await self._dirty.wait()
            await asyncio.sleep(max(0.0, last_write + STATUS_MIN_INTERVAL_SECONDS - time.monotonic()))

    async def _read_stats(self) -> None:
        try:  # one attempt: the status must not wait for an absent gateway
            stats = await self.gateway.stats()
        except (httpx.TransportError, GatewayError):
            return
        self._stats_read_at = time.monotonic()
        await self.link.observe(stats.instance_id, stats.launches)
        # In flight now, and finished ever: the trainer deletes the rollouts it consumed.
        self._rollout_counts = {
            **stats.finished_totals,
            **{state: stats.rollouts.get(state, 0) for state in (RolloutState.QUEUED, RolloutState.RUNNING)},
        }
        self._trainer_report = stats.trainer_report

    async def write(self) -> None:
        """Patch the run's status when the next one differs from what was last written."""
        supervisor = self.supervisor
        # One stats read per cycle: the summary loop's, when it just read them (and woke this write).
        fresh = time.monotonic() - self._stats_read_at < STATUS_MIN_INTERVAL_SECONDS
        if self.link.reachable and not fresh:
            await self._read_stats()
        counts = self.link.job_counts()
        observation = RunObservation(
            generation=int(self.context.run["metadata"].get("generation") or 0),
            suspended=self.context.spec.suspend,
            trainer_job=supervisor.trainer_job,
            gateway_reachable=self.link.reachable,
            summary=self._summary,
            rollout_counts=self._rollout_counts,
            jobs_active=supervisor.active_jobs or self._pool_running(),
            jobs_created=counts.created,
            jobs_failed=counts.failed,
            template_error=supervisor.template_error,
            fatal_error=supervisor.fatal_error or self._trainer_fatal_error(),
            trainer_error=self._trainer_error(),
            ray_cluster=supervisor.ray_cluster,
        )
        status = next_status(self.status, observation, now=datetime.now(UTC))
        self.metrics.observe_run(namespace=self.context.namespace, name=self.context.name, status=status)
        payload = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        if payload == self._written:
            return
        if status.phase != self.status.phase:
            await self.kube.post_event(
                self.context.run, reason=f"Phase{status.phase}", message=status.message or str(status.phase)
            )
        await self.kube.patch_run_status(self.context.namespace, self.context.name, payload)
        self.metrics.status_writes.inc()
        self.status = status
        self._written = payload
        self.link.counts_shown(counts)
        if status.phase is Phase.FAILED:
            await supervisor.stop_failed_run()

    def _pool_running(self) -> int:
        """agents.mode Pool has no agent Jobs: its active agents are the running rollouts."""
        if self.context.spec.agents.mode is not AgentsMode.POOL or self._rollout_counts is None:
            return 0
        return self._rollout_counts.get(RolloutState.RUNNING, 0)

    def _trainer_fatal_error(self) -> str | None:
        report = self._trainer_report
        if report is None or not report.outcome.is_permanent:
            return None
        what = "configuration error" if report.outcome is TrainerOutcome.CONFIG_ERROR else "run failed"
        return f"the trainer stopped ({what}): {report.message}"

    def _trainer_error(self) -> str | None:
        report = self._trainer_report
        return None if report is None or report.outcome.is_permanent else report.message
