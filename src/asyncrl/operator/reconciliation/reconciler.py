"""The I/O of a run's reconcile: observe, call the pure `reconcile.reconcile`, apply its actions. The one
writer of a run's status and of its phase events, and the one creator of its children, from the run's start
(the first creation, with the prerequisites the user may create later: the template's ConfigMap, the key
Secret, a multi-node run's claim) to its end (recreating what was deleted). A creation attempt's answer is
observed by the next round (at once), which decides what it means (`reconcile.Refusal`).

The run's supervisor (`run_supervisor.py`) starts it first, and the rollout dispatcher once the reconcile has
`prepared` the run (the template read, the gateway key known); the dispatcher reports what it observed; the
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
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from asyncrl.agent_templates.renderer import TemplateRenderer
from asyncrl.api import AsyncTrainingRunSpec, AsyncTrainingRunStatus
from asyncrl.api.types import AgentsMode
from asyncrl.gateway_api.client import GatewayClient, GatewayError
from asyncrl.gateway_api.models import TrainerOutcome, TrainerReport
from asyncrl.operator.kube import JSON, Kube
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.reconciliation import children_io, ray_child, status_writes
from asyncrl.operator.reconciliation.child_index import ChildIndex
from asyncrl.operator.reconciliation.reconcile import (
    Actions,
    Child,
    Event,
    Observed,
    Prerequisite,
    Problem,
    Refusal,
    invalid_spec,
    reconcile,
)
from asyncrl.operator.reconciliation.status import RunObservation, TrainerCreation
from asyncrl.operator.retry import one_line_reason
from asyncrl.operator.run_link.gateway_link import GatewayLink
from asyncrl.operator.run_link.job_counters import JobCountsSeen
from asyncrl.operator.run_link.run_context import RunContext
from asyncrl.rollouts import RolloutState
from asyncrl.window_summary import WindowSummary
from asyncrl.workloads import children, names
from asyncrl.workloads.trainer_state import TrainerObservation, suspend_patch, trainer_of_job

logger = logging.getLogger(__name__)

STATUS_MIN_INTERVAL_SECONDS = 1.0
SUMMARY_WAIT_SECONDS = 30
REQUEUE_SECONDS = 5.0  # a reconcile at least this often (and a read of a RayCluster's driver)
SECRET_READ_SECONDS = 30.0  # the key Secret: read by name, the operator may not watch Secrets
CHILDREN_RESYNC_SECONDS = 300.0  # every child read by a GET, whatever the watches said
UNWATCHED_KINDS = frozenset({"Secret", "Deployment"})  # read by name: the operator watches neither


def _child_ref(child: Child, run_name: str) -> tuple[str, str]:
    """(kind, name) of a child but the trainer."""
    match child:
        case Child.KEY_SECRET:
            return "Secret", names.gateway_key_secret_name(run_name)
        case Child.CONFIG_MAP:
            return "ConfigMap", names.config_map_name(run_name)
        case Child.SERVICE:
            return "Service", names.gateway_service_name(run_name)
        case Child.POOL_SECRET:
            return "Secret", names.agent_pool_secret_name(run_name)
        case Child.AGENT_POOL:
            return "Deployment", names.agent_pool_name(run_name)
        case Child.TRAINER:
            raise ValueError("the trainer is read as a Job or a RayCluster")


class Dispatcher(Protocol):
    """What the reconcile reads from, and asks of, the rollout dispatcher."""

    @property
    def template_error(self) -> str | None: ...

    @property
    def fatal_error(self) -> str | None: ...

    @property
    def agents_stuck(self) -> tuple[str, str] | None:
        """Agent pods that cannot start: (the kubelet's reason, one line naming a pod and its image)."""

    @property
    def active_jobs(self) -> int: ...

    @property
    def agents_stopped(self) -> bool: ...

    async def stop_agents(self) -> None: ...


class _NoDispatcher:
    """Before the dispatcher serves the run: nothing launched, nothing to stop."""

    template_error: str | None = None
    fatal_error: str | None = None
    agents_stuck: tuple[str, str] | None = None
    active_jobs = 0
    agents_stopped = True

    async def stop_agents(self) -> None:
        return None


async def write_status(
    kube: Kube, run: JSON, status: AsyncTrainingRunStatus, events: tuple[Event, ...]
) -> JSON:
    """The one way a run's status is written, after the events that say why: the payload written."""
    for event in events:
        await kube.post_event(run, reason=event.reason, message=event.message, warning=event.warning)
    payload = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    await kube.patch_run_status(run["metadata"]["namespace"], run["metadata"]["name"], payload)
    return payload


async def fail_invalid_run(kube: Kube, run: JSON, message: str) -> None:
    """A run whose spec only this operator refuses (a rule the CRD cannot state, or a version skew): nothing
    created. `run`: as much as an Event needs, and the status."""
    logger.error("run %s is invalid: %s", run["metadata"]["name"], message)
    decided = invalid_spec(Reconciler.stored_status(run), message)
    if decided is not None:
        await write_status(kube, run, *decided)


async def read_template(kube: Kube, namespace: str, spec: AsyncTrainingRunSpec) -> str:
    """The agent template: inline, or from the user's ConfigMap (which may not exist yet)."""
    template = spec.agents.template
    if template.inline is not None:
        return template.inline
    assert template.config_map_ref is not None
    return await kube.read_config_map_key(
        namespace, template.config_map_ref.name, template.config_map_ref.key
    )


class Reconciler:
    def __init__(
        self,
        context: RunContext,
        *,
        kube: Kube,
        metrics: OperatorMetrics,
        renderer: TemplateRenderer,
        index: ChildIndex | None = None,
    ) -> None:
        self.context = context
        self.kube = kube
        self.metrics = metrics
        self.renderer = renderer
        # Until the dispatcher serves the run (`serve`): no gateway, no agents.
        self.dispatcher: Dispatcher = _NoDispatcher()
        self.link: GatewayLink | None = None
        self.gateway: GatewayClient | None = None
        self.prepared = asyncio.Event()  # the template read, every child there once, the gateway key known
        self.ended = asyncio.Event()  # the status written shows a terminal phase
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
        # The children no watch reports (Secrets, the pool's Deployment): read every SECRET_READ_SECONDS.
        self._unwatched_read_at: dict[Child, float] = {}
        self._unwatched_present: dict[Child, bool] = {}
        self.index = index
        self._template_read = False
        self._seen: set[Child] = set()  # children this process found or created: a missing one is recreated
        # The last answer of each child not created and each prerequisite not read, and what was said of them:
        # a refusal that repeats every requeue (5 s) is said once, again only when it changes or after the
        # child was created.
        self._refused: dict[Problem, Refusal] = {}
        self._said: dict[Problem, Refusal] = {}
        self._create_again_at = -float("inf")  # monotonic time: after a refusal, no creation before it
        self._trainer_created: TrainerCreation | None = None  # reported in the next round's status

    def serve(self, dispatcher: Dispatcher, link: GatewayLink, gateway: GatewayClient) -> None:
        """The dispatcher serves the run now: read it, and the gateway through the shared link."""
        self.dispatcher, self.link, self.gateway = dispatcher, link, gateway
        self._dirty.set()

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
        self._unwatched_read_at.clear()
        self._dirty.set()

    # -- the loops -----------------------------------------------------------------------------------------

    async def summary_loop(self) -> None:
        gateway, link = self.gateway, self.link
        assert gateway is not None, "serve() first"
        assert link is not None, "serve() first"
        last_step: int | None = None
        while True:
            after_step = -1 if last_step is None else last_step
            poll = functools.partial(
                gateway.summary, after_step=after_step, wait_seconds=SUMMARY_WAIT_SECONDS
            )
            summary = await link.call(poll)
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
        link = self.link
        if link is not None and link.reachable and not fresh:
            await self._read_stats()
        await self._read_template()
        missing = await self._missing_children() if self._template_read else frozenset()
        counts = link.job_counts() if link is not None else self.stored_counts()
        refused = dict(self._refused)
        actions = reconcile(self._observed(missing, counts, refused), now=datetime.now(UTC))
        self._trainer_created = None  # reported in this round's status
        await self._apply_to_children(actions)
        status = actions.status
        self.metrics.observe_run(namespace=self.context.namespace, name=self.context.name, status=status)
        if self._refused != refused or self._trainer_created is not None:
            # A creation answered something new, which the next round (at once) decides on: this round's
            # status is already out of date (a run waiting for its claim would show "waiting for the trainer
            # to be created" first), so it is not written, nor its phase event; its other events are.
            phase_event = f"Phase{status.phase}"
            await self._post([event for event in actions.events if event.reason != phase_event])
        else:
            await self._write(status, actions.events, counts)
        self._said.update(refused)
        if actions.stop_agents:
            await self.dispatcher.stop_agents()
        if self._template_read and not missing and not self._refused:
            await self._read_gateway_key()

    def _observed(
        self, missing: frozenset[Child], counts: JobCountsSeen, refused: dict[Problem, Refusal]
    ) -> Observed:
        dispatcher, link = self.dispatcher, self.link
        reachable = link is not None and link.reachable
        observation = RunObservation(
            generation=int(self.context.run["metadata"].get("generation") or 0),
            suspended=self.context.spec.suspend,
            trainer=self.trainer,
            gateway_reachable=reachable,
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
        said = frozenset(
            problem for problem, refusal in refused.items() if self._said.get(problem) == refusal
        )
        return Observed(
            status=self.status,
            run=observation,
            missing=missing,
            agents_stopped=dispatcher.agents_stopped,
            announced=said,
            first_creation=frozenset(missing - self._seen),
            refused=refused,
            trainer_created=self._trainer_created,
            multi_node=self.context.spec.trainer.nodes > 1,
        )

    async def _write(
        self, status: AsyncTrainingRunStatus, events: tuple[Event, ...], counts: JobCountsSeen
    ) -> None:
        """Every event the reconcile says, also in a cycle that leaves the status as it was (a child deleted
        from a quiet run: a phase event comes only with a phase change, so with a status write anyway); the
        status when `status_writes.write_due`."""
        payload = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        since_write = time.monotonic() - self._written_at
        due = status_writes.write_due(self._written, payload, seconds_since_write=since_write)
        if not due:
            await self._post(events)
            return
        self._written = await write_status(self.kube, self.context.run, status, events)
        self._written_at = time.monotonic()
        self.metrics.status_writes.inc()
        self.status = status
        if self.link is not None:
            self.link.counts_shown(counts)
        if status.phase is not None and status.phase.is_terminal:
            self.ended.set()

    async def _post(self, events: Sequence[Event]) -> None:
        for event in events:
            await self.kube.post_event(
                self.context.run, reason=event.reason, message=event.message, warning=event.warning
            )

    def stored_counts(self) -> JobCountsSeen:
        """The Job counters the status last written (or stored) shows."""
        jobs = self.status.jobs
        return JobCountsSeen(
            created=(jobs.created if jobs else 0) or 0, failed=(jobs.failed if jobs else 0) or 0
        )

    # -- the prerequisites: read, not created -------------------------------------------------------------

    async def _read_template(self) -> None:
        """The agent template, once: inline, or from the user's ConfigMap (which may not exist yet)."""
        if self._template_read:
            return
        try:
            self.context.template_source = await read_template(
                self.kube, self.context.namespace, self.context.spec
            )
        except Exception as error:
            self._prerequisite_failed(Prerequisite.TEMPLATE, error)
            return
        self._template_read = True
        self._refused.pop(Prerequisite.TEMPLATE, None)

    async def _read_gateway_key(self) -> None:
        """The gateway key, once its Secret exists: then the dispatcher may serve the run."""
        if self.prepared.is_set():
            return
        context = self.context
        secret_name, secret_key = children.gateway_key_ref(context.run, context.spec)
        try:
            context.gateway_key = await self.kube.read_secret_key(context.namespace, secret_name, secret_key)
        except Exception as error:
            said = self._refused.get(Prerequisite.GATEWAY_KEY)
            self._prerequisite_failed(Prerequisite.GATEWAY_KEY, error)
            if self._refused.get(Prerequisite.GATEWAY_KEY) != said:
                self._dirty.set()  # a new answer: said at once; read again at the requeue
            return
        self._refused.pop(Prerequisite.GATEWAY_KEY, None)
        self.metrics.reconciles.labels("ok").inc()
        self.prepared.set()

    def _prerequisite_failed(self, prerequisite: Prerequisite, error: BaseException) -> None:
        """Said (a ReconcileError event, the Pending status) and read again at the next requeue."""
        message = f"{one_line_reason(error)}; retrying"
        logger.warning("run %s: reading its %s failed: %s", self.context.name, prerequisite.value, message)
        self.metrics.reconciles.labels("error").inc()
        self._refused[prerequisite] = Refusal("ReconcileError", message, permanent=False)

    async def _missing_children(self) -> frozenset[Child]:
        """The desired children found absent.

        The watched ones (the trainer Job, the Service, the ConfigMap) come from the operator's watch index
        at every round, at no cost; one the index has not listed yet, by a GET each requeue. The key Secret,
        which the operator may not list or watch, by a GET every `SECRET_READ_SECONDS`, as a Pool run's
        Secret and Deployment (not watched either). Everything by a GET
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
                    self.trainer = await ray_child.read_trainer(
                        kube, namespace, run_name, forbidden_as_absent=Child.TRAINER not in self._seen
                    )
            else:
                job_name = names.trainer_job_name(run_name)
                seen = known("Job", job_name)
                if seen is False:
                    self.trainer = None
                elif self.trainer is None or (seen is None and (resync or poll)):
                    job = await kube.read_job(namespace, job_name)
                    self.trainer = None if job is None else trainer_of_job(job)
            missing = {Child.TRAINER} if self.trainer is None else set()
            for child in children_io.desired_children(context.spec, with_pool=self.link is not None):
                if child is Child.TRAINER:
                    continue
                kind, name = _child_ref(child, run_name)
                if kind in UNWATCHED_KINDS:
                    if (
                        resync
                        or now - self._unwatched_read_at.get(child, -float("inf")) >= SECRET_READ_SECONDS
                    ):
                        self._unwatched_present[child] = await kube.exists(kind, namespace, name)
                        self._unwatched_read_at[child] = now
                    exists: bool | None = self._unwatched_present.get(child)
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
        desired = children_io.desired_children(context.spec, with_pool=self.link is not None)
        self._seen.update(child for child in desired if child not in missing)
        return frozenset(missing)

    async def _apply_to_children(self, actions: Actions) -> None:
        """Create what is missing, in order; stop at the first refusal (what comes after may need it): its
        answer is observed by the next round, at once."""
        if time.monotonic() < self._create_again_at:
            await self._apply_suspension(actions)
            return
        for child in actions.create:
            try:
                await self._create(child)
            except Exception as error:
                multi_node = self.context.spec.trainer.nodes > 1
                refusal = children_io.refusal(
                    child, error, started=child in self._seen, multi_node=multi_node
                )
                logger.warning("run %s: %s", self.context.name, refusal.message)
                self.metrics.reconciles.labels("error").inc()
                if self._refused.get(child) != refusal:
                    self._dirty.set()  # a new answer: the next round says it, at once
                self._refused[child] = refusal
                # Tried again at the requeue, not at every round: a quota's refusal would otherwise cost a
                # create request a second for as long as it lasts.
                self._create_again_at = time.monotonic() + REQUEUE_SECONDS
                break
            self._seen.add(child)
            self._dirty.set()  # the next round sees it (and reads the gateway key it may hold)
            if self._refused.pop(child, None) is not None:
                self._said.pop(child, None)
        await self._apply_suspension(actions)

    async def _create(self, child: Child) -> None:
        context, kube = self.context, self.kube
        run, spec = context.run, context.spec
        match child:
            case Child.TRAINER:
                self._trainer_created = await children_io.create_trainer(kube, run, spec)
                if spec.trainer.nodes == 1 and self.index is not None:
                    job = {
                        "metadata": {
                            "namespace": context.namespace,
                            "name": names.trainer_job_name(context.name),
                        }
                    }
                    self.index.apply("Job", "ADDED", job)
                return
            case Child.CONFIG_MAP:
                body = self._desired(child)
                size_error = children.config_map_size_error(body)
                if size_error is not None:
                    raise children_io.ChildRefused(size_error)
            case Child.AGENT_POOL:
                body = await children_io.agent_pool(
                    run,
                    spec,
                    renderer=self.renderer,
                    template=context.template_source,
                    agent_gateway_url=context.agent_gateway_url,
                    stopped=self.dispatcher.agents_stopped,
                )
            case _:
                body = self._desired(child)
        await children_io.create_child(kube, body)
        # Known at once, before its watch event: the next round must not create it again.
        if body["kind"] in UNWATCHED_KINDS:
            self._unwatched_present[child] = True
        elif self.index is not None:
            self.index.apply(body["kind"], "ADDED", body)

    def _desired(self, child: Child) -> JSON:
        context = self.context
        key = context.gateway_key or None  # None: the run's own key Secret gets a fresh key
        return children_io.desired_child(
            context.run, context.spec, child, template=context.template_source, key=key
        )

    async def _apply_suspension(self, actions: Actions) -> None:
        context, kube = self.context, self.kube
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
        assert self.gateway is not None, "serve() first"
        assert self.link is not None, "serve() first"
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
