"""The per-run controller: queued rollouts become agent Jobs, Job outcomes reach the gateway, status is kept.

One instance per run, running as the run's kopf daemon. Four loops, none of them polling:
- claim: long-polls the gateway for queued rollouts and creates one Job each (rate-limited, capped),
- reports: applies Job watch events (delivered by the namespace's one label-selected watch) to the gateway,
- cancellations: follows the gateway's completion feed and deletes the Jobs of cancelled/timed-out rollouts,
- status: long-polls the trainer's window summary and writes the run's status when it changed, at most once
  per second.
A restart is safe: Job names are deterministic (creating one again is a no-op), claims are leases the gateway
re-offers, and the Job watch starts with a full listing.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from asyncrl.agent import AgentEnvironment
from asyncrl.api import AsyncTrainingRunSpec, AsyncTrainingRunStatus
from asyncrl.gateway.client import GatewayClient, GatewayError
from asyncrl.gateway.models import RolloutView
from asyncrl.operator import names
from asyncrl.operator.agent_jobs import AgentJobSettings, shape_agent_job
from asyncrl.operator.children import owner_reference
from asyncrl.operator.job_state import rollout_state_of_job
from asyncrl.operator.kube import JSON, Kube
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.names import ATTEMPT_ID
from asyncrl.operator.ratelimit import SlidingWindowLimiter
from asyncrl.operator.renderer import TemplateRenderer, check_template
from asyncrl.operator.status import RunObservation, next_status
from asyncrl.operator.templates import TemplateError, rollout_variables
from asyncrl.rollouts import RolloutState

logger = logging.getLogger(__name__)

STATUS_MIN_INTERVAL_SECONDS = 1.0
GATEWAY_RETRY_SECONDS = 2.0


@dataclass
class RunContext:
    run: JSON  # the AsyncTrainingRun as read from the API
    spec: AsyncTrainingRunSpec
    gateway_url: str  # how the operator reaches the gateway
    agent_gateway_url: str  # what agents are given
    gateway_key: str
    template_source: str

    @property
    def namespace(self) -> str:
        return str(self.run["metadata"]["namespace"])

    @property
    def name(self) -> str:
        return str(self.run["metadata"]["name"])


@dataclass
class _JobBook:
    """What the controller knows of its agent Jobs (rebuilt from the watch's listing after a restart)."""

    active: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    reported: dict[str, RolloutState] = field(default_factory=dict)
    created: int = 0


class RunController:
    def __init__(
        self, context: RunContext, *, kube: Kube, metrics: OperatorMetrics, renderer: TemplateRenderer
    ) -> None:
        self.context = context
        self.kube = kube
        self.metrics = metrics
        self.renderer = renderer
        self.gateway = GatewayClient(context.gateway_url, context.gateway_key)
        self.limiter = SlidingWindowLimiter(context.spec.agents.max_jobs_per_minute)
        self.jobs = _JobBook()
        self.trainer_job: JSON | None = None
        self.template_error: str | None = None
        self.fatal_error: str | None = None  # set: the run is Failed with this message
        self.gateway_reachable = False
        self._job_events: asyncio.Queue[tuple[str, JSON]] = asyncio.Queue()
        self._dirty = asyncio.Event()
        self._capacity = asyncio.Event()
        self._summary: dict[str, Any] | None = None
        self._rollout_counts: dict[str, int] | None = None
        self._status = AsyncTrainingRunStatus.model_validate(context.run.get("status") or {})
        self._written: dict[str, Any] | None = None
        self.jobs.created = (self._status.jobs.created if self._status.jobs else 0) or 0

    # -- entry points -------------------------------------------------------------------------------------

    def on_job_event(self, event_type: str, job: JSON) -> None:
        """Called on the event loop by the namespace's Job watch, for this run's Jobs."""
        self._job_events.put_nowait((event_type, job))

    def update_spec(self, run: JSON, spec: AsyncTrainingRunSpec) -> None:
        self.context.run = run
        self.context.spec = spec
        self.limiter.per_minute = spec.agents.max_jobs_per_minute
        self._capacity.set()
        self._dirty.set()

    async def run(self) -> None:
        """Run until cancelled (the run was deleted, or the operator stops)."""
        await self._check_template()
        loops: list[Callable[[], Coroutine[Any, Any, None]]] = [
            *([] if self.fatal_error else [self._claim_loop]),  # an invalid template launches nothing
            self._report_loop,
            self._cancellation_loop,
            self._summary_loop,
            self._status_loop,
        ]
        tasks: list[asyncio.Task[None]] = [
            asyncio.create_task(loop(), name=f"{self.context.name}:{loop.__name__}") for loop in loops
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()  # surface the failure
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.gateway.close()

    # -- claim → Jobs -------------------------------------------------------------------------------------

    async def _gateway_call(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Call the gateway, waiting out its absence (the trainer pod is starting or restarting)."""
        while True:
            try:
                result = await call()
            except (httpx.TransportError, GatewayError) as error:
                if isinstance(error, GatewayError) and error.status < 500:
                    raise
                if self.gateway_reachable:
                    logger.info("run %s: gateway unreachable: %s", self.context.name, error)
                    self.gateway_reachable = False
                    self._dirty.set()
                await asyncio.sleep(GATEWAY_RETRY_SECONDS)
                continue
            if not self.gateway_reachable:
                self.gateway_reachable = True
                self._dirty.set()
            return result

    async def _claim_loop(self) -> None:
        # The first claim takes over leases of a previous operator process: with one active operator per run
        # (standalone or kopf peering), a lease still held at our start belongs to a claimer that is gone.
        takeover = True
        while True:
            if self.context.spec.suspend:
                self._capacity.clear()
                await self._capacity.wait()
                continue
            claimed: list[RolloutView] = await self._gateway_call(
                functools.partial(
                    self.gateway.claim, limit=50, wait_seconds=30, lease_seconds=120, takeover=takeover
                )
            )
            takeover = False
            for rollout in claimed:
                await self._wait_for_capacity()
                await self._launch(rollout)

    async def _wait_for_capacity(self) -> None:
        while True:
            max_active = self.context.spec.agents.max_active_jobs
            if max_active is not None and len(self.jobs.active) >= max_active:
                self.metrics.rate_limit_waits.labels("max_active_jobs").inc()
                self._capacity.clear()
                await self._capacity.wait()
                continue
            delay = self.limiter.delay(time.monotonic())
            if delay > 0:
                self.metrics.rate_limit_waits.labels("max_jobs_per_minute").inc()
                await asyncio.sleep(delay)
                continue
            return

    async def _launch(self, rollout: RolloutView) -> None:
        context = self.context
        job_name = names.agent_job_name(context.name, rollout.rollout_id)
        variables = rollout_variables(
            rollout,
            attempt_id=ATTEMPT_ID,
            job_name=job_name,
            run_name=context.name,
            namespace=context.namespace,
        )
        try:
            rendered = await self.renderer.render(context.template_source, variables)
        except TemplateError as error:
            await self._template_failed(rollout, str(error))
            return
        agent_env = AgentEnvironment.for_rollout(
            gateway_url=context.agent_gateway_url,
            gateway_key=context.gateway_key,
            rollout_id=rollout.rollout_id,
            attempt_id=ATTEMPT_ID,
            mode=rollout.mode,
        )
        settings = AgentJobSettings(
            run_name=context.name,
            namespace=context.namespace,
            owner_reference=owner_reference(context.run),
            timeout_seconds=int(rollout.timeout_seconds or context.spec.rollout_timeout_seconds),
            ttl_seconds_after_finished=context.spec.agents.ttl_seconds_after_finished,
        )
        job = shape_agent_job(
            rendered,
            settings=settings,
            rollout_id=rollout.rollout_id,
            group_id=rollout.group_id,
            attempt_id=ATTEMPT_ID,
            agent_env=agent_env.as_env(),
        )
        try:
            created = await self.kube.create_job(job)
        except Exception as error:  # the API rejected what the template produced
            await self._template_failed(
                rollout, f"the API server rejected the rendered Job: {_api_reason(error)}"
            )
            return
        self.limiter.record(time.monotonic())
        if created:
            self.jobs.created += 1
            self.jobs.active.add(job_name)
            self.metrics.jobs_created.inc()
            self._dirty.set()
        if self.template_error is not None:
            self.template_error = None
            self._dirty.set()

    async def _check_template(self) -> None:
        """Render the template for the run's first row (or a placeholder row) before any rollout: a template
        that cannot give a valid agent Job fails the run now, not each rollout later."""
        context = self.context
        rows = context.spec.data.inline
        reason = await check_template(
            self.renderer,
            context.template_source,
            first_row=rows[0] if rows else None,
            run_name=context.name,
            namespace=context.namespace,
            job_name=names.agent_job_name(context.name, "sample"),
            attempt_id=ATTEMPT_ID,
        )
        if reason is None:
            return
        logger.warning("run %s: %s", context.name, reason)
        self.metrics.errors.labels("template").inc()
        if self._status.message != reason:  # not again after an operator restart
            await self.kube.post_event(context.run, reason="AgentTemplateError", message=reason, warning=True)
        self.template_error = self.fatal_error = reason

    async def _template_failed(self, rollout: RolloutView, reason: str) -> None:
        logger.warning("run %s rollout %s: %s", self.context.name, rollout.rollout_id, reason)
        self.metrics.errors.labels("template").inc()
        if self.template_error != reason:
            await self.kube.post_event(
                self.context.run, reason="AgentTemplateError", message=reason, warning=True
            )
        self.template_error = reason
        self._dirty.set()
        with contextlib.suppress(GatewayError):
            await self._gateway_call(
                lambda: self.gateway.transition(
                    rollout.rollout_id, RolloutState.FAILED, message=f"agent template: {reason}"
                )
            )

    # -- Job watch events → gateway -----------------------------------------------------------------------

    async def _report_loop(self) -> None:
        while True:
            event_type, job = await self._job_events.get()
            component = (job["metadata"].get("labels") or {}).get(names.LABEL_COMPONENT)
            if component == names.COMPONENT_TRAINER:
                self.trainer_job = None if event_type == "DELETED" else job
                self._dirty.set()
                continue
            await self._report_agent_job(event_type, job)

    async def _report_agent_job(self, event_type: str, job: JSON) -> None:
        name = job["metadata"]["name"]
        annotations = job["metadata"].get("annotations") or {}
        rollout_id = annotations.get(names.ANNOTATION_ROLLOUT_ID)
        if rollout_id is None:
            return
        observed = rollout_state_of_job(job.get("status"))
        if event_type == "DELETED" and (observed is None or not observed[0].is_terminal):
            observed = (RolloutState.FAILED, "the agent Job was deleted before it finished")
        if observed is None:
            return
        state, message = observed
        if state.is_terminal:
            if name in self.jobs.active:
                self.jobs.active.discard(name)
                self._capacity.set()
            if state is not RolloutState.SUCCEEDED:
                self.jobs.failed.add(name)
        elif event_type != "DELETED":
            self.jobs.active.add(name)
        self._dirty.set()
        if self.jobs.reported.get(name) == state:
            return
        if state is RolloutState.SUCCEEDED and self.jobs.reported.get(name) is not RolloutState.RUNNING:
            # Fast agents finish before their pod was seen ready; running comes first in the state machine.
            await self._transition(rollout_id, RolloutState.RUNNING, None)
        await self._transition(rollout_id, state, message)
        self.jobs.reported[name] = state
        if event_type == "DELETED":
            self.jobs.reported.pop(name, None)

    async def _transition(self, rollout_id: str, state: RolloutState, message: str | None) -> None:
        try:
            await self._gateway_call(
                lambda: self.gateway.transition(rollout_id, state, message=message, attempt_id=ATTEMPT_ID)
            )
        except GatewayError as error:
            # 404: consumed and deleted by the trainer; 409: already terminal (e.g. cancelled). Both are fine.
            if error.status not in (404, 409):
                raise

    # -- cancellations ------------------------------------------------------------------------------------

    async def _cancellation_loop(self) -> None:
        """Delete the Jobs of rollouts the gateway ended without them (stale groups, gateway timeouts)."""
        stats = await self._gateway_call(self.gateway.stats)
        cursor = int(stats["cursor"])
        await self._delete_orphaned_jobs()
        while True:
            try:
                page = await self._gateway_call(
                    functools.partial(self.gateway.completions, after=cursor, wait_seconds=30)
                )
            except GatewayError as error:
                if error.status != 410:
                    raise
                cursor = int(error.body.get("cursor", 0))  # fell behind the retained feed: resync
                await self._delete_orphaned_jobs()
                continue
            cursor = page.cursor
            for entry in page.entries:
                if entry.state in (RolloutState.CANCELLED, RolloutState.TIMED_OUT):
                    job_name = names.agent_job_name(self.context.name, entry.rollout_id)
                    if job_name in self.jobs.active or entry.state is RolloutState.CANCELLED:
                        await self.kube.delete_job(self.context.namespace, job_name)

    async def _delete_orphaned_jobs(self) -> None:
        """After a restart: Jobs still running for rollouts the gateway no longer wants."""
        for job in await self.kube.list_agent_jobs(self.context.namespace, self.context.name):
            if rollout_state_of_job(job.get("status")) is not None and job["status"].get("active", 0) == 0:
                continue
            rollout_id = (job["metadata"].get("annotations") or {}).get(names.ANNOTATION_ROLLOUT_ID)
            if rollout_id is None:
                continue
            try:
                rollout = await self._gateway_call(functools.partial(self.gateway.get_rollout, rollout_id))
            except GatewayError as error:
                if error.status != 404:
                    raise
                rollout = None
            if rollout is None or rollout.state in (RolloutState.CANCELLED, RolloutState.TIMED_OUT):
                await self.kube.delete_job(self.context.namespace, job["metadata"]["name"])

    # -- status -------------------------------------------------------------------------------------------

    async def _summary_loop(self) -> None:
        last_step: int | None = None
        while True:
            after_step = -1 if last_step is None else last_step
            summary = await self._gateway_call(
                functools.partial(self.gateway.summary, after_step=after_step, wait_seconds=30)
            )
            if summary is not None and summary.step != last_step:
                last_step = summary.step
                self._summary = summary.model_dump(mode="json")
                await self._refresh_rollout_counts()  # now, while the gateway is surely up
                self._dirty.set()

    async def _refresh_rollout_counts(self) -> None:
        with contextlib.suppress(httpx.TransportError, GatewayError):
            stats = await self.gateway.stats()
            # In flight now, and finished ever: the trainer deletes the rollouts it consumed.
            self._rollout_counts = {
                **stats["finished_totals"],
                **{state: stats["rollouts"][state] for state in ("queued", "running")},
            }

    async def _status_loop(self) -> None:
        last_write = 0.0
        while True:
            await self._write_status()
            last_write = time.monotonic()
            self._dirty.clear()
            await self._dirty.wait()
            await asyncio.sleep(max(0.0, last_write + STATUS_MIN_INTERVAL_SECONDS - time.monotonic()))

    async def _write_status(self) -> None:
        if self.gateway_reachable:
            await self._refresh_rollout_counts()
        observation = RunObservation(
            generation=int(self.context.run["metadata"].get("generation") or 0),
            suspended=self.context.spec.suspend,
            trainer_job=self.trainer_job,
            gateway_reachable=self.gateway_reachable,
            summary=self._summary,
            rollout_counts=self._rollout_counts,
            jobs_active=len(self.jobs.active),
            jobs_created=self.jobs.created,
            jobs_failed=len(self.jobs.failed),
            template_error=self.template_error,
            fatal_error=self.fatal_error,
        )
        status = next_status(self._status, observation, now=datetime.now(UTC))
        payload = status.model_dump(mode="json", by_alias=True, exclude_none=True)
        if payload == self._written:
            return
        if status.phase != self._status.phase:
            await self.kube.post_event(
                self.context.run, reason=f"Phase{status.phase}", message=status.message or str(status.phase)
            )
        await self.kube.patch_run_status(self.context.namespace, self.context.name, payload)
        self.metrics.status_writes.inc()
        self._status = status
        self._written = payload


def _api_reason(error: Exception) -> str:
    body = getattr(error, "body", None)
    if body:
        import json

        with contextlib.suppress(ValueError, TypeError):
            return str(json.loads(body).get("message", body))
    return str(error)
