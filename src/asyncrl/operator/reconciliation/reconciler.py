"""The I/O of a run's reconcile: observe, call the pure `reconcile.reconcile`, apply its actions.

The rollout dispatcher (`controller.RunController`) launches agent Jobs and reports what it observed; the
Job watch reports the trainer Job (`observe_trainer`); the summary loop long-polls the trainer's window
summary and reads the gateway's stats. Each of them wakes the reconcile (`changed()`), as does a watched
child's deletion, and it also runs every `REQUEUE_SECONDS` on its own. A reconcile knows which children exist
from the operator's watches (`child_index.ChildIndex`: the trainer Job, Service and ConfigMap), reads the key
Secret by a GET every `SECRET_READ_SECONDS` and a RayCluster (and its head pod) every requeue, and reads
everything every `CHILDREN_RESYNC_SECONDS`. It then creates the missing ones, suspends or resumes the
trainer, stops the agents of a failed run, posts the events and patches the status, at most once per
`STATUS_MIN_INTERVAL_SECONDS`, only when the payload differs from what it last wrote, and when only the counts
differ, not before `status_writes.COUNTS_MIN_INTERVAL_SECONDS` (they would print a line each in `kubectl get
atr -w`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from asyncrl.api import AsyncTrainingRunStatus
from asyncrl.api.types import AgentsMode
from asyncrl.gateway_api.client import GatewayClient, GatewayError
from asyncrl.gateway_api.models import TrainerOutcome, TrainerReport
from asyncrl.operator.kube import JSON, Kube
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.reconciliation import children_io, ray_child, status_writes
from asyncrl.operator.reconciliation.child_index import ChildIndex
from asyncrl.operator.reconciliation.gateway_link import GatewayLink
from asyncrl.operator.reconciliation.reconcile import Actions, Child, Observed, reconcile
from asyncrl.operator.reconciliation.run_context import RunContext
from asyncrl.operator.reconciliation.status import RunObservation
from asyncrl.operator.retry import one_line_reason
from asyncrl.rollouts import RolloutState
from asyncrl.window_summary import WindowSummary
from asyncrl.workloads import names
from asyncrl.workloads.trainer_state import TrainerObservation, suspend_patch, trainer_of_job

logger = logging.getLogger(__name__)

STATUS_MIN_INTERVAL_SECONDS = 1.0
SUMMARY_WAIT_SECONDS = 30
REQUEUE_SECONDS = 5.0  # a reconcile at least this often (and a read of a RayCluster's driver)
SECRET_READ_SECONDS = 30.0  # the key Secret: read by name, the operator may not watch Secrets
CHILDREN_RESYNC_SECONDS = 300.0  # every child read by a GET, whatever the watches said


class Dispatcher(Protocol):
    """What the reconcile reads from, and asks of, the rollout dispatcher."""

    template_error: str | None
    fatal_error: str | None
    agents_stuck: tuple[str, str] | None  # agent pods that cannot start: (the kubelet's reason, one line)

    @property
    def active_jobs(self) -> int: ...

    @property
    def agents_stopped(self) -> bool: ...

    async def stop_agents(self) -> None: ...


class Reconciler:
    def __init__(
        self,
        context: RunContext,
        *,
        dispatcher: Dispatcher,
        link: GatewayLink,
        kube: Kube,
        gateway: GatewayClient,
        metrics: OperatorMetrics,
        index: ChildIndex | None = None,
    ) -> None:
        self.context = context
        self.dispatcher = dispatcher
        self.link = link
        self.kube = kube
        self.gateway = gateway
        self.metrics = metrics
        self.status = self.stored_status(context.run)
        self.trainer: TrainerObservation | None = None
        self._dirty = asyncio.Event()
        self._written: dict[str, Any] | None = None
        self._written_at = -float("inf")  # monotonic time of the last status write
        self._summary: WindowSummary | None = None
        self._rollout_counts: dict[RolloutState, int] | None = None
        self._trainer_report: TrainerReport | None = None
        self._stats_read_at = -float("inf")  # monotonic time of the last stats read
        self._children_read_at = -float("inf")  # monotonic time of the last read of every child
        self._polled_at = -float("inf")  # of the last requeue's reads (what no watch reports)
        self._secret_read_at = -float("inf")
        self._secret_present = True
        self.index = index
        # The last recreate failure said in an event, per child: a failure that repeats every requeue (5 s) is
        # said once, and again only when it changes or after the child was created.
        self._recreate_failures: dict[Child, str] = {}

    @staticmethod
    def stored_status(run: JSON) -> AsyncTrainingRunStatus:
        """The status the run has stored (what an earlier operator process wrote)."""
        return AsyncTrainingRunStatus.model_validate(run.get("status") or {})

    def changed(self) -> None:
        """Something the reconcile reads may have changed: reconcile at the next chance."""
        self._dirty.set()

    def observe_trainer_job(self, event_type: str, job: JSON) -> None:
        """The trainer Job's watch event (or its listing at start)."""
        if event_type == "DELETED":
            self.child_deleted()
        self.trainer = None if event_type == "DELETED" else trainer_of_job(job)
        self._dirty.set()

    def child_deleted(self) -> None:
        """A watched child was deleted: reconcile now, and read the key Secret too (deletions come together,
        `kubectl delete -l ...`, and what is recreated next may mount it)."""
        self._secret_read_at = -float("inf")
        self._dirty.set()

    # -- the loops -----------------------------------------------------------------------------------------

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
            # Changed counts are reconciled too: a Pool run has no Job events to wake it between steps.
            report, counts = self._trainer_report, self._rollout_counts
            await self._read_stats()
            if self._trainer_report != report or self._rollout_counts != counts:
                self._dirty.set()

    async def reconcile_loop(self) -> None:
        while True:
            last = time.monotonic()
            self._dirty.clear()
            await self.reconcile_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), timeout=REQUEUE_SECONDS)
            await asyncio.sleep(max(0.0, last + STATUS_MIN_INTERVAL_SECONDS - time.monotonic()))

    # -- one reconcile ------------------------------------------------------------------------------------

    async def reconcile_once(self) -> None:
        # One stats read per cycle: the summary loop's, when it just read them (and woke this reconcile).
        fresh = time.monotonic() - self._stats_read_at < STATUS_MIN_INTERVAL_SECONDS
        if self.link.reachable and not fresh:
            await self._read_stats()
        missing = await self._missing_children()
        counts = self.link.job_counts()
        dispatcher = self.dispatcher
        observation = RunObservation(
            generation=int(self.context.run["metadata"].get("generation") or 0),
            suspended=self.context.spec.suspend,
            trainer=self.trainer,
            gateway_reachable=self.link.reachable,
            summary=self._summary,
            rollout_counts=self._rollout_counts,
            jobs_active=dispatcher.active_jobs or self._pool_running(),
            jobs_created=counts.created,
            jobs_failed=counts.failed,
            template_error=dispatcher.template_error,
            agents_stuck=dispatcher.agents_stuck,
            fatal_error=dispatcher.fatal_error or self._trainer_fatal_error(),
            trainer_error=self._trainer_error(),
        )
        observed = Observed(
            status=self.status,
            run=observation,
            missing=missing,
            agents_stopped=dispatcher.agents_stopped,
            announced=frozenset(self._recreate_failures),
        )
        actions = reconcile(observed, now=datetime.now(UTC))
        await self._apply_to_children(actions)
        status = actions.status
        self.metrics.observe_run(namespace=self.context.namespace, name=self.context.name, status=status)
        # Every event the reconcile says, also in a cycle that leaves the status as it was (a child deleted
        # from a quiet run): a phase event comes only with a phase change, so with a status write anyway.
        for event in actions.events:
            await self.kube.post_event(
                self.context.run, reason=event.reason, message=event.message, warning=event.warning
            )
        payload = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        since_write = time.monotonic() - self._written_at
        if status_writes.write_due(self._written, payload, seconds_since_write=since_write):
            await self.kube.patch_run_status(self.context.namespace, self.context.name, payload)
            self._written_at = time.monotonic()
            self.metrics.status_writes.inc()
            self.status = status
            self._written = payload
            self.link.counts_shown(counts)
        if actions.stop_agents:
            await dispatcher.stop_agents()

    async def _missing_children(self) -> frozenset[Child]:
        """The desired children found absent.

        The watched ones (the trainer Job, the Service, the ConfigMap) come from the operator's watch index
        at every round, at no cost; one the index has not listed yet, by a GET each requeue. The key Secret,
        which the operator may not list or watch, by a GET every `SECRET_READ_SECONDS`. Everything by a GET
        every `CHILDREN_RESYNC_SECONDS`, a safety net under the watches. A multi-node run's RayCluster (and
        its driver's state) by a GET each requeue, and at once when the trainer was seen gone.
        """
        now = time.monotonic()
        resync = now - self._children_read_at >= CHILDREN_RESYNC_SECONDS
        poll = now - self._polled_at >= REQUEUE_SECONDS
        context, kube = self.context, self.kube
        namespace, run_name = context.namespace, context.name

        def known(kind: str, name: str) -> bool | None:
            return None if resync or self.index is None else self.index.exists(kind, namespace, name)

        async def present(kind: str, name: str) -> bool | None:
            """Whether it exists; None when it was not due to be read (taken as present)."""
            seen = known(kind, name)
            if seen is not None:
                return seen
            if resync or poll:
                return await kube.exists(kind, namespace, name)
            return None

        try:
            if context.spec.trainer.nodes > 1:
                if resync or poll or self.trainer is None:
                    self.trainer = await ray_child.read_trainer(kube, namespace, run_name)
            else:
                job_name = names.trainer_job_name(run_name)
                seen = known("Job", job_name)
                if seen is False:
                    self.trainer = None
                elif self.trainer is None or (seen is None and (resync or poll)):
                    job = await kube.read_job(namespace, job_name)
                    self.trainer = None if job is None else trainer_of_job(job)
            missing = {Child.TRAINER} if self.trainer is None else set()
            for child in children_io.desired_children(context.spec):
                if child is Child.TRAINER:
                    continue
                body = self._desired(child)
                kind, name = body["kind"], body["metadata"]["name"]
                if child is Child.KEY_SECRET:
                    if resync or now - self._secret_read_at >= SECRET_READ_SECONDS:
                        self._secret_present = await kube.exists(kind, namespace, name)
                        self._secret_read_at = now
                    exists: bool | None = self._secret_present
                else:
                    exists = await present(kind, name)
                if exists is False:
                    missing.add(child)
        except Exception as error:  # the API server may be briefly away: the next requeue reads again
            logger.warning("run %s: reading its children failed: %s", run_name, one_line_reason(error))
            return frozenset()
        if poll:
            self._polled_at = now
        if resync:
            self._children_read_at = now
        return frozenset(missing)

    def _desired(self, child: Child) -> JSON:
        context = self.context
        return children_io.desired_child(
            context.run, context.spec, child, template=context.template_source, key=context.gateway_key
        )

    async def _apply_to_children(self, actions: Actions) -> None:
        context, kube = self.context, self.kube
        for child in actions.create:
            try:
                if child is Child.TRAINER:
                    await children_io.create_trainer(kube, context.run, context.spec)
                    if context.spec.trainer.nodes == 1 and self.index is not None:
                        job = {
                            "metadata": {
                                "namespace": context.namespace,
                                "name": names.trainer_job_name(context.name),
                            }
                        }
                        self.index.apply("Job", "ADDED", job)
                else:
                    body = self._desired(child)
                    await children_io.create_child(kube, body)
                    # Known at once, before its watch event: the next round must not create it again.
                    if child is Child.KEY_SECRET:
                        self._secret_present = True
                    elif self.index is not None:
                        self.index.apply(body["kind"], "ADDED", body)
            except Exception as error:  # said in an event; the next reconcile tries again
                message = f"could not recreate the run's {child.value}: {one_line_reason(error)}"
                logger.warning("run %s: %s", context.name, message)
                if self._recreate_failures.get(child) != message:
                    self._recreate_failures[child] = message
                    await kube.post_event(
                        context.run, reason="ChildRecreateFailed", message=message, warning=True
                    )
            else:
                self._recreate_failures.pop(child, None)
        if actions.trainer_suspend is not None:
            patch = suspend_patch(suspend=actions.trainer_suspend)
            try:
                if context.spec.trainer.nodes > 1:
                    await ray_child.patch_ray_cluster(kube, context.namespace, context.name, patch)
                else:
                    await kube.patch_job(context.namespace, names.trainer_job_name(context.name), patch)
            except Exception as error:  # the next reconcile tries again
                logger.warning(
                    "run %s: suspending its trainer failed: %s", context.name, one_line_reason(error)
                )
                return
            logger.info(
                "run %s: trainer %s", context.name, "suspended" if actions.trainer_suspend else "resumed"
            )
            self._polled_at = -float("inf")  # a RayCluster's new state is read, not watched: next round

    # -- the gateway's stats ------------------------------------------------------------------------------

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
