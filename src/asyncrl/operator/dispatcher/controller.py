"""The per-run controller: queued rollouts become agent Jobs, Job outcomes reach the gateway, status is kept.

One instance per run, started by the operator for each run it sees. `RunController` is the rollout
dispatcher; it owns the link to the run's gateway (`gateway_link.py`: calls that wait out its absence, its
instance, the Job counters) and the run's reconciler (`reconciler.py`), which it tells when something it
observed changed. The reconciler alone decides the run's children, its trainer's suspension, stopping, the
status and the events (`reconcile.py`); the dispatcher only launches and reports. Its loops, none polling:
- claim: long-polls the gateway for queued rollouts and launches one Job each (rate-limited, capped),
- reports: applies agent Job watch events (delivered by the namespace's one label-selected watch) to the
  gateway; the trainer Job's events go straight to the reconciler, which never waits for the gateway,
- cancellations: follows the gateway's completion feed and deletes the Jobs of cancelled/timed-out rollouts,
- the reconciler's: the summary long-poll, and the reconcile on every change and every few seconds.

At-most-once launches, whatever the Jobs' TTL. The gateway's rollout record is the launch record: before
creating a Job the controller calls `POST /api/rollouts/{id}/launch` with a fresh launch id. The gateway marks
the rollout launched atomically; repeating the same id is a no-op (a retry whose answer was lost), any other
id gets 409, and claims never offer a launched rollout again. So a restarted operator, which re-claims only
unlaunched rollouts, never creates a second Job for a rollout, even when the first Job already finished and
was removed by `ttlSecondsAfterFinished: 0`. What the restart cannot see is resolved, never relaunched: at
start, a launched rollout that is not terminal and has no Job is ended `succeeded` if its agent reported a
reward (it finished while nobody watched) and `failed` otherwise (it was removed unfinished, or the operator
stopped between the launch and the Job), with a message saying so; the trainer trains the first with its
reward and gives the second its fill reward. A crash between launch and Job creation therefore loses that
one rollout instead of running it twice.

Failures: transient API server and gateway errors (no connection, timeouts, 429, 5xx) are retried with
backoff (`retry.py`); only a rejection (another 4xx) fails a rollout, with one readable line as the reason.

Gateway restarts: every agent Job carries the gateway instance it was launched through. When the link sees
a new `instance_id`, the controller resets its completion cursor and report bookkeeping, deletes the old
instance's unfinished Jobs (their rollouts are gone with it) and ignores the old Jobs' outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from asyncrl.agent_templates.render import TemplateError, sample_variables
from asyncrl.agent_templates.renderer import TemplateRenderer, check_template
from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.api.types import AgentsMode
from asyncrl.gateway_api.client import GatewayClient, GatewayError, new_claim_key
from asyncrl.gateway_api.models import RolloutView
from asyncrl.operator.dispatcher import agent_pods
from asyncrl.operator.dispatcher.job_state import ReportBook, rollout_state_of_job
from asyncrl.operator.dispatcher.pool_keeper import PoolInputs, keep_agent_pool
from asyncrl.operator.dispatcher.ratelimit import SlidingWindowLimiter
from asyncrl.operator.kube import JSON, Kube
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.reconciliation.child_index import ChildIndex
from asyncrl.operator.reconciliation.gateway_link import GatewayLink
from asyncrl.operator.reconciliation.job_counters import JobCountsSeen
from asyncrl.operator.reconciliation.reconciler import Reconciler
from asyncrl.operator.reconciliation.run_context import RunContext
from asyncrl.operator.retry import (
    KUBE_BACKOFF,
    GaveUp,
    kube_call,
    kube_error_is_transient,
    one_line_reason,
    retry_transient,
)
from asyncrl.rollouts import RolloutState
from asyncrl.workloads import names
from asyncrl.workloads.agent_jobs import AgentJobSettings, agent_launch, shape_agent_job
from asyncrl.workloads.children import owner_reference
from asyncrl.workloads.names import ATTEMPT_ID

logger = logging.getLogger(__name__)

T = TypeVar("T")

CREATE_JOB_DEADLINE_SECONDS = 120.0  # transient API errors longer than this fail the rollout
# A launch without a Job is judged vanished only this long after it was recorded: until then its launcher
# (this operator's claim loop, or another operator beside it) may still be creating the Job.
VANISHED_AFTER_SECONDS = CREATE_JOB_DEADLINE_SECONDS + 10.0
# A run whose first this-many agent Jobs the API server all refused, none created, fails with the server's
# reason: its template can give no Job the server takes (a check the start's dry run could not make, e.g.
# with rows from a ConfigMap), and it would otherwise go on failing every rollout of every step.
REFUSALS_BEFORE_FAILING = 8
ANNOTATION_LAUNCH_ID = f"{names.GROUP}/launch-id"
ANNOTATION_GATEWAY_INSTANCE = f"{names.GROUP}/gateway-instance"
VANISHED_WITH_REWARD = (
    "the agent Job finished and was removed while the operator was away; its reported reward stands "
    "(not relaunched: a rollout runs at most once)"
)
VANISHED_WITHOUT_REWARD = (
    "the agent Job of this launched rollout no longer exists (removed before it reported a reward, or never "
    "created because the operator stopped right after the launch); not relaunched: a rollout runs at most "
    "once"
)


@dataclass
class _ObservedAgentJobs:
    """What the dispatcher observed of its agent Jobs: the active ones (by name), and the rollout state last
    reported to the gateway for each (by uid; rebuilt from the watch's listing after a restart).

    Counts that must survive restarts and TTL deletion are not kept here (see `job_counters.py`)."""

    active: set[str] = field(default_factory=set)
    reported: ReportBook = field(default_factory=ReportBook)


class RunController:
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
        self.gateway = GatewayClient(context.gateway_url, context.gateway_key)
        self.limiter = SlidingWindowLimiter(context.spec.agents.max_jobs_per_minute)
        self.jobs = _ObservedAgentJobs()
        self.template_error: str | None = None
        self.fatal_error: str | None = None  # set: the run is Failed with this message
        self._job_events: asyncio.Queue[tuple[str, JSON]] = asyncio.Queue()
        self._capacity = asyncio.Event()
        self._pool_changed = asyncio.Event()  # agents.mode Pool: the pool's size may have to change
        self._stopped_for_failure = False
        self._jobs_created = 0  # by this process: an agent Job the API server took
        self._jobs_refused = 0  # by this process: an agent Job the API server refused (a 4xx)
        self._takeover = True  # the next claim takes over leases of a claimer that is gone
        # Agent pods that cannot start: (the kubelet's reason, one line naming a pod and its image).
        self.agents_stuck: tuple[str, str] | None = None
        self._agent_started = False  # an agent pod of this run has run (reported running or done)
        self._said_at: dict[tuple[str, str], float] = {}  # what an event said once (_say_once) -> when
        self._stuck_failed: set[str] = set()  # pods whose rollouts were failed for not starting
        stored = Reconciler.stored_status(context.run).jobs
        self.link = GatewayLink(
            context,
            kube=kube,
            client=self.gateway,
            # The Job counters: never below what the stored status showed, then derived from the gateway.
            shown=JobCountsSeen(
                created=(stored.created if stored else 0) or 0, failed=(stored.failed if stored else 0) or 0
            ),
            on_change=lambda: self.reconciler.changed(),
            on_restart=self._gateway_restarted,
        )
        self.reconciler = Reconciler(
            context,
            dispatcher=self,
            link=self.link,
            kube=kube,
            gateway=self.gateway,
            metrics=metrics,
            index=index,
        )

    # -- entry points -------------------------------------------------------------------------------------

    def on_job_event(self, event_type: str, job: JSON) -> None:
        """Called on the event loop by the namespace's Job watch, for this run's Jobs."""
        component = (job["metadata"].get("labels") or {}).get(names.LABEL_COMPONENT)
        if component == names.COMPONENT_TRAINER:  # the reconcile's, whether or not the gateway answers
            self.reconciler.observe_trainer_job(event_type, job)
            return
        self._job_events.put_nowait((event_type, job))

    def update_spec(self, run: JSON, spec: AsyncTrainingRunSpec, template_source: str) -> None:
        """A spec edit the API server admitted (the immutable fields cannot change): the rate and the cap
        apply at once, the template to rollouts not yet launched, suspend through the reconcile."""
        self.context.run = run
        self.context.spec = spec
        self.context.template_source = template_source
        self.limiter.per_minute = spec.agents.max_jobs_per_minute
        self._capacity.set()
        self._pool_changed.set()
        self.reconciler.changed()

    async def run(self) -> None:
        """Run until cancelled (the run was deleted, or the operator stops)."""
        await self._check_template()
        loops: list[Callable[[], Coroutine[Any, Any, None]]] = [
            *([] if self.fatal_error else [self._launch_loop()]),  # an invalid template launches nothing
            self._report_loop,
            self._cancellation_loop,
            self._agent_pods_loop,
            self.reconciler.summary_loop,
            self.reconciler.reconcile_loop,
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
            self.metrics.forget_run(namespace=self.context.namespace, name=self.context.name)

    # -- what the reconciler reads ------------------------------------------------------------------------

    @property
    def active_jobs(self) -> int:
        return len(self.jobs.active)

    @property
    def agents_stopped(self) -> bool:
        """The run failed and its agents were stopped (see `stop_agents`)."""
        return self._stopped_for_failure

    def _gateway_restarted(self) -> None:
        """A new gateway instance: the rollouts it held are gone, and so is what we knew of them."""
        self.jobs.reported.clear()
        self._takeover = True

    # -- claim → Jobs -------------------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        await self.link.read_stats()
        resolving = asyncio.create_task(
            self._resolve_vanished_launches(), name=f"{self.context.name}:vanished"
        )
        resolving.add_done_callback(self._log_failed_resolution)
        try:
            await self._claim_forever()
        finally:
            resolving.cancel()

    def _log_failed_resolution(self, task: asyncio.Task[None]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            logger.warning(
                "run %s: launches whose Job is gone were not resolved: %s",
                self.context.name,
                one_line_reason(error),
            )

    async def _claim_forever(self) -> None:
        while True:
            if self.context.spec.suspend:
                self._capacity.clear()
                await self._capacity.wait()
                continue
            # The first claim (and the first after a gateway restart) takes over leases of a previous claimer:
            # with one active operator per run, a lease still held at our start belongs to a claimer that is
            # gone. Launched rollouts are never offered, leased or not.
            takeover, self._takeover = self._takeover, False
            # One key per claim, kept through the link's retries: a retry whose first answer was lost gets
            # the same rollouts back instead of leaving them leased to nobody for the lease.
            claim = functools.partial(
                self.gateway.claim,
                limit=50,
                wait_seconds=30,
                lease_seconds=120,
                takeover=takeover,
                claim_key=new_claim_key(),
            )
            claimed: list[RolloutView] = await self.link.call(claim)
            for rollout in claimed:
                await self._wait_for_capacity()
                await self._launch(rollout)

    def _launch_loop(self) -> Callable[[], Coroutine[Any, Any, None]]:
        """Jobs: claim and launch one Job per rollout. Pool: keep the agent pool, whose pods claim."""
        if self.context.spec.agents.mode is AgentsMode.POOL:
            return self._pool_loop
        return self._claim_loop

    async def _pool_loop(self) -> None:
        inputs = PoolInputs(
            run=lambda: self.context.run,
            spec=lambda: self.context.spec,
            stopped=lambda: self._stopped_for_failure,
            agent_gateway_url=self.context.agent_gateway_url,
            gateway_key=self.context.gateway_key,
            template_source=self.context.template_source,
        )
        await keep_agent_pool(
            inputs,
            kube=self.kube,
            renderer=self.renderer,
            gateway=self.gateway,
            gateway_call=self.link.call,
            changed=self._pool_changed,
        )

    async def _resolve_vanished_launches(self) -> None:
        """Launched unfinished rollouts whose Job is gone (it ended unwatched): end them, never rerun.

        A launch whose agent never started (no reward, no model call, not running) and younger than
        `VANISHED_AFTER_SECONDS` is judged when it is that old, not at once: another operator serving the run
        beside this one (two at once, or an upgrade's overlap) may have recorded the launch and be creating
        its Job now; judged at once, its rollout was failed while its Job ran. One whose agent started had its
        Job (the usual case after a restart: it finished while nobody watched) and is judged at once. Only the
        launches seen at the start are judged: later ones are this process's own, or come with a Job."""
        pending: set[str] | None = None  # None: the first look, at every launched rollout
        while True:
            rollouts, _ = await self.link.call(self.gateway.list_rollouts)
            launched = [
                r
                for r in rollouts
                if r.launched_at is not None
                and not r.state.is_terminal
                and (pending is None or r.rollout_id in pending)
            ]
            if not launched:
                return
            jobs = await kube_call(
                lambda: self.kube.list_agent_jobs(self.context.namespace, self.context.name),
                what=f"run {self.context.name}: listing agent Jobs",
            )
            with_jobs = {
                (job["metadata"].get("annotations") or {}).get(names.ANNOTATION_ROLLOUT_ID) for job in jobs
            }
            now = time.time()
            young: list[float] = []
            pending = set()
            for rollout in launched:
                if rollout.rollout_id in with_jobs:
                    continue  # the Job watch's listing reports it
                launched_at = rollout.launched_at or now
                if _agent_never_started(rollout) and now - launched_at < VANISHED_AFTER_SECONDS:
                    young.append(launched_at)
                    pending.add(rollout.rollout_id)
                else:
                    await self._resolve_vanished(rollout)
            if not young:
                return
            await asyncio.sleep(min(young) + VANISHED_AFTER_SECONDS - now + 1.0)

    async def _resolve_vanished(self, rollout: RolloutView) -> None:
        """End a launched rollout whose Job is gone: succeeded with its agent's reward, or failed."""
        if rollout.reward is not None:
            logger.info("run %s rollout %s: %s", self.context.name, rollout.rollout_id, VANISHED_WITH_REWARD)
            if rollout.state is RolloutState.QUEUED:
                await self._transition(rollout.rollout_id, RolloutState.RUNNING, None)
            await self._transition(rollout.rollout_id, RolloutState.SUCCEEDED, VANISHED_WITH_REWARD)
        else:
            logger.warning(
                "run %s rollout %s: %s", self.context.name, rollout.rollout_id, VANISHED_WITHOUT_REWARD
            )
            await self._transition(rollout.rollout_id, RolloutState.FAILED, VANISHED_WITHOUT_REWARD)
        self.metrics.errors.labels("vanished_launch").inc()

    async def _wait_for_capacity(self) -> None:
        while True:
            if self._stopped_for_failure:  # a failed run launches nothing more
                self._capacity.clear()
                await self._capacity.wait()
                continue
            max_active = self.context.spec.agents.max_active_jobs
            if max_active is not None and len(self.jobs.active) >= max_active:
                self.metrics.rate_limit_waits.labels("max_active_jobs").inc()
                self._capacity.clear()
                await self._capacity.wait()
                continue
            delay = self.limiter.delay(time.monotonic())
            if delay > 0:
                self.metrics.rate_limit_waits.labels("max_jobs_per_minute").inc()
                await self._say_throttled(delay)
                # Woken early by a spec edit (a raised rate applies at once, not after the old rate's wait)
                # or a finished Job; every condition is then asked again.
                self._capacity.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._capacity.wait()
                continue
            return

    async def _launch(self, rollout: RolloutView) -> None:
        context = self.context
        job_name = names.agent_job_name(context.name, rollout.rollout_id)
        launch = agent_launch(
            rollout,
            run_name=context.name,
            namespace=context.namespace,
            job_name=job_name,
            gateway_url=context.agent_gateway_url,
            gateway_key=context.gateway_key,
        )
        try:
            rendered = await self.renderer.render(context.template_source, launch.variables)
        except TemplateError as error:
            await self._template_failed(rollout, str(error))
            return
        job = shape_agent_job(
            rendered,
            settings=self._job_settings(rollout.timeout_seconds),
            rollout_id=rollout.rollout_id,
            group_id=rollout.group_id,
            attempt_id=ATTEMPT_ID,
            agent_env=launch.env,
        )
        if not await self._record_launch(rollout, job):
            return
        if not await self._create_job(rollout, job):
            return
        self._jobs_created += 1
        self.limiter.record(time.monotonic())
        self.jobs.active.add(job_name)
        self.metrics.jobs_created.inc()
        self.reconciler.changed()
        if self.template_error is not None:
            self.template_error = None
            self.reconciler.changed()

    def _job_settings(self, timeout_seconds: float | None) -> AgentJobSettings:
        context = self.context
        return AgentJobSettings(
            run_name=context.name,
            namespace=context.namespace,
            owner_reference=owner_reference(context.run),
            timeout_seconds=int(timeout_seconds or context.spec.rollout_timeout_seconds),
            ttl_seconds_after_finished=context.spec.agents.ttl_seconds_after_finished,
        )

    async def _api_server_refusal(self, first_row: Any) -> str | None:
        """Why the API server refuses the agent Job the template gives for the run's first row (a dry-run
        create: schema, label syntax, admission); None when it admits it or cannot be asked now.

        A Job every rollout would get refused (a label key that is not DNS-valid: 422 each time) otherwise
        failed every rollout while the run went on consuming steps."""
        context = self.context
        job_name = names.agent_job_name(context.name, "sample")
        variables = sample_variables(
            first_row,
            run_name=context.name,
            namespace=context.namespace,
            job_name=job_name,
            attempt_id=ATTEMPT_ID,
        )
        try:
            rendered = await self.renderer.render(context.template_source, variables)
        except TemplateError:
            return None  # check_template reports template errors
        job = shape_agent_job(
            rendered,
            settings=self._job_settings(None),
            rollout_id="sample",
            group_id="sample",
            attempt_id=ATTEMPT_ID,
            agent_env={},
        )
        try:
            await self.kube.create_job(job, dry_run=True)
        except Exception as error:
            if kube_error_is_transient(error):
                logger.info("run %s: the agent Job dry run was not answered: %s", context.name, error)
                return None
            return f"the API server rejects the agent Job the template gives: {one_line_reason(error)}"
        return None

    async def _record_launch(self, rollout: RolloutView, job: JSON) -> bool:
        """Mark the rollout launched in the gateway (the launch record) and stamp the Job with it."""
        launch_id = uuid.uuid4().hex
        try:
            receipt = await self.link.call(
                functools.partial(self.gateway.launch, rollout.rollout_id, launch_id=launch_id)
            )
        except GatewayError as error:
            # 409: launched before (by an earlier operator process) or no longer queued; 404: consumed.
            logger.info(
                "run %s rollout %s: not launched: %s", self.context.name, rollout.rollout_id, error.error
            )
            return False
        await self.link.observe(receipt.instance_id, receipt.totals)
        annotations = job["metadata"].setdefault("annotations", {})
        annotations[ANNOTATION_LAUNCH_ID] = launch_id
        annotations[ANNOTATION_GATEWAY_INSTANCE] = receipt.instance_id
        return True

    async def _create_job(self, rollout: RolloutView, job: JSON) -> bool:
        """Create the launched rollout's Job, retrying transient failures; a rejection fails the rollout."""
        name, namespace = job["metadata"]["name"], self.context.namespace
        try:
            created = await retry_transient(
                lambda: self.kube.create_job(job),
                is_transient=kube_error_is_transient,
                what=f"run {self.context.name}: creating agent Job {name}",
                backoff=KUBE_BACKOFF,
                deadline_seconds=CREATE_JOB_DEADLINE_SECONDS,
                on_retry=lambda _error: self.metrics.errors.labels("create_job_retry").inc(),
            )
        except GaveUp as error:
            await self._launch_failed(rollout, f"could not create the agent Job {name}: {error}")
            return False
        except Exception as error:  # the API server (or the client, before sending) rejected the body
            reason = one_line_reason(error)
            await self._template_failed(rollout, f"the API server rejected the agent Job {name}: {reason}")
            self._jobs_refused += 1
            await self._fail_if_every_job_is_refused(reason)
            return False
        if created:
            return True
        # A Job of that name exists: ours if an earlier attempt of this very call got through unanswered.
        existing = await kube_call(
            lambda: self.kube.read_job(namespace, name), what=f"run {self.context.name}: reading Job {name}"
        )
        launch_id = job["metadata"]["annotations"][ANNOTATION_LAUNCH_ID]
        if (
            existing is not None
            and (existing["metadata"].get("annotations") or {}).get(ANNOTATION_LAUNCH_ID) == launch_id
        ):
            return True
        await self._launch_failed(
            rollout,
            f"an agent Job named {name} from an earlier launch of the same rollout id still exists; "
            "not replaced (a rollout runs at most once)",
        )
        return False

    async def _fail_if_every_job_is_refused(self, reason: str) -> None:
        if self.fatal_error is not None or self._jobs_created or self._jobs_refused < REFUSALS_BEFORE_FAILING:
            return
        message = (
            f"the API server refused each of the first {self._jobs_refused} agent Jobs and took none; "
            f"fix spec.agents.template: {reason}"
        )
        logger.warning("run %s: %s", self.context.name, message)
        await self.kube.post_event(self.context.run, reason="AgentJobsRefused", message=message, warning=True)
        self.fatal_error = message
        self.reconciler.changed()

    async def _launch_failed(self, rollout: RolloutView, reason: str) -> None:
        logger.warning("run %s rollout %s: %s", self.context.name, rollout.rollout_id, reason)
        self.metrics.errors.labels("create_job").inc()
        await self.kube.post_event(self.context.run, reason="AgentJobFailed", message=reason, warning=True)
        await self._transition(rollout.rollout_id, RolloutState.FAILED, reason)

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
        # Only for a real row: a placeholder row's `<name>` values may be refused where real ones pass.
        if reason is None and rows:
            reason = await self._api_server_refusal(rows[0])
        if reason is None:
            return
        logger.warning("run %s: %s", context.name, reason)
        self.metrics.errors.labels("template").inc()
        if self.reconciler.status.message != reason:  # not again after an operator restart
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
        self.reconciler.changed()
        await self._transition(rollout.rollout_id, RolloutState.FAILED, f"agent template: {reason}")

    # -- Job watch events → gateway -----------------------------------------------------------------------

    async def _report_loop(self) -> None:
        await self.link.known.wait()  # which gateway instance a Job's outcome belongs to
        while True:
            event_type, job = await self._job_events.get()
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
        if state.is_terminal or event_type == "DELETED":
            if name in self.jobs.active:
                self.jobs.active.discard(name)
                self._capacity.set()
        else:
            self.jobs.active.add(name)
        self.reconciler.changed()
        instance = annotations.get(ANNOTATION_GATEWAY_INSTANCE)
        if instance is not None and instance != self.link.instance:
            return  # launched through a gateway that restarted since: its rollout is gone with it
        if state is RolloutState.RUNNING or state is RolloutState.SUCCEEDED:
            self._agent_started = True
        elif state is RolloutState.FAILED and event_type != "DELETED":
            await self._say_once(
                ("AgentJobFailed", ""),
                reason="AgentJobFailed",
                message=f"agent Job {name} (rollout {rollout_id}) failed: {message}",
            )
        uid = job["metadata"].get("uid") or name
        for step in self.jobs.reported.to_report(uid, state):
            # Bound to the Job's gateway instance: a report still retrying while the gateway restarts must not
            # land on the new gateway's rollout of the same id (the gateway refuses it, 409).
            await self._transition(rollout_id, step, message if step is state else None, instance_id=instance)
        self.jobs.reported.record(uid, state)
        if event_type == "DELETED":
            self.jobs.reported.forget(uid)

    async def _transition(
        self, rollout_id: str, state: RolloutState, message: str | None, *, instance_id: str | None = None
    ) -> None:
        try:
            await self.link.call(
                lambda: self.gateway.transition(
                    rollout_id, state, message=message, attempt_id=ATTEMPT_ID, instance_id=instance_id
                )
            )
        except GatewayError as error:
            # 404: consumed and deleted by the trainer (or gone with a restarted gateway); 409: already
            # terminal (e.g. cancelled), or meant for a gateway instance that restarted since. Any other
            # rejection is logged: an outcome is never worth a crash.
            if error.status not in (404, 409):
                logger.warning(
                    "run %s rollout %s: the gateway refused %s: %s",
                    self.context.name,
                    rollout_id,
                    state,
                    one_line_reason(error),
                )

    # -- agent pods that cannot start ---------------------------------------------------------------------

    async def _agent_pods_loop(self) -> None:
        """Look at the run's agent pods every few seconds: say on the run which cannot start, fail the rollout
        of one that has not started by the start timeout, and the run when none of its agents ever started."""
        selector = (
            f"{names.AGENT_JOB_SELECTOR},{names.LABEL_RUN}={self.context.name}"  # Jobs' labels, on pods too
        )
        while True:
            await asyncio.sleep(agent_pods.CHECK_SECONDS)
            try:
                pods = await self.kube.list_pods(self.context.namespace, selector)
            except Exception as error:  # not allowed, or the API server away: the Jobs still end by deadline
                logger.debug("run %s: agent pods not listed: %s", self.context.name, one_line_reason(error))
                continue
            await self._look_at_agent_pods(agent_pods.stuck_pods(pods))

    async def _look_at_agent_pods(self, stuck: list[agent_pods.StuckPod]) -> None:
        said = agent_pods.summary(stuck)
        if said != self.agents_stuck:
            self.agents_stuck = said
            self.reconciler.changed()
        now = datetime.now(UTC)
        for pod in stuck:
            await self._say_once(
                (pod.reason, pod.image),
                reason="AgentPodCannotStart" if pod.never_starts else "AgentPodCrashing",
                message=f"agent {pod.describe()}",
            )
        overdue = [
            pod
            for pod in stuck
            if pod.never_starts
            and pod.pod not in self._stuck_failed
            and pod.stuck_seconds(now) >= self.context.agent_start_timeout_seconds
        ]
        if not overdue:
            return
        timeout = self.context.agent_start_timeout_seconds
        if not self._agent_started and self.fatal_error is None:
            self.fatal_error = (
                f"no agent pod of this run started within {timeout:g} s (--agent-start-timeout-seconds): "
                f"{overdue[0].describe()}; fix spec.agents.template (the image, its pull secret, the Secrets "
                "and ConfigMaps it reads)"
            )
            logger.warning("run %s: %s", self.context.name, self.fatal_error)
            await self.kube.post_event(
                self.context.run, reason="AgentPodsCannotStart", message=self.fatal_error, warning=True
            )
            self.reconciler.changed()
            return
        jobs = {
            job["metadata"]["name"]: job
            for job in await self.kube.list_agent_jobs(self.context.namespace, self.context.name)
        }
        for pod in overdue:
            self._stuck_failed.add(pod.pod)
            job = jobs.get(pod.job or "")
            if job is None:
                continue
            annotations = job["metadata"].get("annotations") or {}
            rollout_id = annotations.get(names.ANNOTATION_ROLLOUT_ID)
            if rollout_id is not None:
                await self._transition(
                    rollout_id,
                    RolloutState.FAILED,
                    f"the agent pod did not start within {timeout:g} s: {pod.describe()}",
                    instance_id=annotations.get(ANNOTATION_GATEWAY_INSTANCE),
                )
            await self.kube.delete_job(self.context.namespace, job["metadata"]["name"])

    async def _say_throttled(self, delay: float) -> None:
        """Say on the run (a Normal event, at most once per WARN_AGAIN_SECONDS) that agent launches wait for
        the run's own rate limit: steps that wait for it looked like slow agents (28-36 s instead of 5 s)."""
        rate = self.context.spec.agents.max_jobs_per_minute
        await self._say_once(
            ("throttled", ""),
            reason="AgentLaunchesThrottled",
            message=f"agent Job creation waits {delay:.1f} s for spec.agents.maxJobsPerMinute ({rate} a "
            "minute); steps that wait for their rollouts to launch go faster with a higher rate",
            warning=False,
        )

    async def _say_once(
        self, key: tuple[str, str], *, reason: str, message: str, warning: bool = True
    ) -> None:
        """An event on the run (Warning unless `warning` is False), at most once per `key` per
        WARN_AGAIN_SECONDS: many agents fail alike, and a rate limit is met again and again."""
        now = time.monotonic()
        last = self._said_at.get(key)
        if last is not None and now - last < agent_pods.WARN_AGAIN_SECONDS:
            return
        self._said_at[key] = now
        logger.log(logging.WARNING if warning else logging.INFO, "run %s: %s", self.context.name, message)
        await self.kube.post_event(self.context.run, reason=reason, message=message, warning=warning)

    # -- cancellations ------------------------------------------------------------------------------------

    async def _cancellation_loop(self) -> None:
        """Delete the Jobs of rollouts the gateway ended without them (stale groups, gateway timeouts)."""
        cursor = (await self.link.read_stats()).cursor
        self.link.restarted.clear()
        await self._delete_orphaned_jobs()
        while True:
            if self.link.restarted.is_set():
                self.link.restarted.clear()
                cursor = (await self.link.read_stats()).cursor
                await self._delete_orphaned_jobs()
            try:
                page = await self._until_gateway_restart(
                    self.link.call(functools.partial(self.gateway.completions, after=cursor, wait_seconds=30))
                )
            except GatewayError as error:
                if error.status != 410:
                    raise
                cursor = int(error.body.get("cursor", 0))  # fell behind the retained feed: resync
                await self._delete_orphaned_jobs()
                continue
            if page is None:
                continue  # the gateway restarted while we waited: start over on the new one
            if not page.entries:
                await self.link.read_stats()  # a quiet half-minute: make sure it is the same gateway
            cursor = page.cursor
            for entry in page.entries:
                if entry.state in (RolloutState.CANCELLED, RolloutState.TIMED_OUT):
                    job_name = names.agent_job_name(self.context.name, entry.rollout_id)
                    if job_name in self.jobs.active or entry.state is RolloutState.CANCELLED:
                        await self.kube.delete_job(self.context.namespace, job_name)

    async def _until_gateway_restart(self, call: Coroutine[Any, Any, T]) -> T | None:
        """`await call`, or None (the call cancelled) as soon as a gateway restart is noticed."""
        work = asyncio.ensure_future(call)
        restarted = asyncio.ensure_future(self.link.restarted.wait())
        try:
            await asyncio.wait({work, restarted}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: the call must not outlive us (nor the gateway client)
            work.cancel()
            raise
        finally:
            restarted.cancel()
        if self.link.restarted.is_set():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await work
            return None
        return work.result()

    async def _delete_orphaned_jobs(self) -> None:
        """Unfinished Jobs of rollouts the gateway no longer wants (after a restart of either side)."""
        for job in await self.kube.list_agent_jobs(self.context.namespace, self.context.name):
            if rollout_state_of_job(job.get("status")) is not None and job["status"].get("active", 0) == 0:
                continue
            annotations = job["metadata"].get("annotations") or {}
            rollout_id = annotations.get(names.ANNOTATION_ROLLOUT_ID)
            if rollout_id is None:
                continue
            instance = annotations.get(ANNOTATION_GATEWAY_INSTANCE)
            if instance is not None and instance != self.link.instance:
                await self.kube.delete_job(self.context.namespace, job["metadata"]["name"])
                continue
            try:
                rollout = await self.link.call(functools.partial(self.gateway.get_rollout, rollout_id))
            except GatewayError as error:
                if error.status != 404:
                    raise
                rollout = None
            if rollout is None or rollout.state in (RolloutState.CANCELLED, RolloutState.TIMED_OUT):
                await self.kube.delete_job(self.context.namespace, job["metadata"]["name"])

    # -- stopping (decided by the reconcile) -------------------------------------------------------------

    async def stop_agents(self) -> None:
        """The run failed: launch nothing more and delete the active agent Jobs (a Pool run's pods go too).
        The trainer's suspension is the reconcile's own action."""
        if self._stopped_for_failure:
            return
        self._stopped_for_failure = True
        self._capacity.clear()
        self._pool_changed.set()
        for job_name in sorted(self.jobs.active):
            with contextlib.suppress(Exception):  # best effort: the run is already marked Failed
                await self.kube.delete_job(self.context.namespace, job_name)
        logger.info("run %s failed: agent Jobs deleted, nothing more launched", self.context.name)


def _agent_never_started(rollout: RolloutView) -> bool:
    """No sign of its agent: no reward, no model call, never reported running (its Job may not exist yet)."""
    return rollout.reward is None and not rollout.n_model_calls and rollout.state is RolloutState.QUEUED
