"""Claims become agent Jobs, each at most once (agents.mode Jobs); a Pool run's pool is kept instead.

The claim loop long-polls the gateway for queued rollouts and launches one Job each, rate-limited
(`spec.agents.maxJobsPerMinute`) and capped (`spec.agents.maxActiveJobs`).

At-most-once launches, whatever the Jobs' TTL. The gateway's rollout record is the launch record: before
creating a Job the dispatcher calls `POST /api/rollouts/{id}/launch` with a fresh launch id. The gateway
marks the rollout launched atomically; repeating the same id is a no-op (a retry whose answer was lost), any
other id gets 409, and claims never offer a launched rollout again. So a restarted operator, which re-claims
only unlaunched rollouts, never creates a second Job for a rollout, even when the first Job already finished
and was removed by `ttlSecondsAfterFinished: 0`. What the restart cannot see is resolved, never relaunched
(`vanished_launches.py`).

Failures: transient API server and gateway errors (no connection, timeouts, 429, 5xx) are retried with
backoff (`retry.py`); only a rejection (another 4xx) fails a rollout, with one readable line as the reason.
A run whose first `REFUSALS_BEFORE_FAILING` agent Jobs the API server all refused fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Callable, Coroutine
from typing import Any

from asyncrl.agent_templates.render import TemplateError
from asyncrl.agent_templates.renderer import TemplateRenderer
from asyncrl.api.types import AgentsMode
from asyncrl.gateway_api.client import GatewayError, new_claim_key
from asyncrl.gateway_api.models import RolloutView
from asyncrl.operator.dispatcher.pool_keeper import PoolInputs, keep_agent_pool
from asyncrl.operator.dispatcher.ratelimit import SlidingWindowLimiter
from asyncrl.operator.dispatcher.shared import (
    ANNOTATION_GATEWAY_INSTANCE,
    CREATE_JOB_DEADLINE_SECONDS,
    DispatchIO,
    DispatchState,
    job_annotations,
    say_once,
    transition,
)
from asyncrl.operator.dispatcher.template_checks import agent_job_settings, template_failed
from asyncrl.operator.dispatcher.vanished_launches import resolve_vanished_launches
from asyncrl.operator.kube import JSON
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
from asyncrl.workloads.agent_jobs import agent_launch, shape_agent_job
from asyncrl.workloads.names import ATTEMPT_ID

logger = logging.getLogger(__name__)

# A run whose first this-many agent Jobs the API server all refused, none created, fails with the server's
# reason: its template can give no Job the server takes (a check the start's dry run could not make, e.g.
# with rows from a ConfigMap), and it would otherwise go on failing every rollout of every step.
REFUSALS_BEFORE_FAILING = 8
ANNOTATION_LAUNCH_ID = f"{names.GROUP}/launch-id"


class Launcher:
    def __init__(self, io: DispatchIO, state: DispatchState, *, renderer: TemplateRenderer) -> None:
        self.io = io
        self.state = state
        self.renderer = renderer
        self.limiter = SlidingWindowLimiter(io.context.spec.agents.max_jobs_per_minute)
        self._jobs_created = 0  # by this process: an agent Job the API server took
        self._jobs_refused = 0  # by this process: an agent Job the API server refused (a 4xx)

    def launch_loop(self) -> Callable[[], Coroutine[Any, Any, None]]:
        """Jobs: claim and launch one Job per rollout. Pool: keep the agent pool, whose pods claim."""
        if self.io.context.spec.agents.mode is AgentsMode.POOL:
            return self.pool_loop
        return self.claim_loop

    async def pool_loop(self) -> None:
        io, state = self.io, self.state
        inputs = PoolInputs(
            run=lambda: io.context.run, spec=lambda: io.context.spec, stopped=lambda: state.stopped
        )
        await keep_agent_pool(
            inputs, kube=io.kube, gateway=io.gateway, gateway_call=io.link.call, changed=state.pool_changed
        )

    async def claim_loop(self) -> None:
        await self.io.link.read_stats()
        resolving = asyncio.create_task(
            resolve_vanished_launches(self.io), name=f"{self.io.context.name}:vanished"
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
                self.io.context.name,
                one_line_reason(error),
            )

    async def _claim_forever(self) -> None:
        io, state = self.io, self.state
        while True:
            if io.context.spec.suspend:
                state.capacity.clear()
                await state.capacity.wait()
                continue
            # The first claim (and the first after a gateway restart) takes over leases of a previous claimer:
            # with one active operator per run, a lease still held at our start belongs to a claimer that is
            # gone. Launched rollouts are never offered, leased or not.
            takeover, state.takeover = state.takeover, False
            # One key per claim, kept through the link's retries: a retry whose first answer was lost gets
            # the same rollouts back instead of leaving them leased to nobody for the lease.
            claim = functools.partial(
                io.gateway.claim,
                limit=50,
                wait_seconds=30,
                lease_seconds=120,
                takeover=takeover,
                claim_key=new_claim_key(),
            )
            claimed: list[RolloutView] = await io.link.call(claim)
            for rollout in claimed:
                await self._wait_for_capacity()
                await self.launch(rollout)

    async def _wait_for_capacity(self) -> None:
        state, metrics = self.state, self.io.metrics
        while True:
            if state.stopped:  # a failed run launches nothing more
                state.capacity.clear()
                await state.capacity.wait()
                continue
            max_active = self.io.context.spec.agents.max_active_jobs
            if max_active is not None and len(state.active) >= max_active:
                metrics.rate_limit_waits.labels("max_active_jobs").inc()
                state.capacity.clear()
                await state.capacity.wait()
                continue
            delay = self.limiter.delay(time.monotonic())
            if delay > 0:
                metrics.rate_limit_waits.labels("max_jobs_per_minute").inc()
                await self._say_throttled(delay)
                # Woken early by a spec edit (a raised rate applies at once, not after the old rate's wait)
                # or a finished Job; every condition is then asked again.
                state.capacity.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await state.capacity.wait()
                continue
            return

    async def _say_throttled(self, delay: float) -> None:
        """Say on the run (a Normal event, at most once per WARN_AGAIN_SECONDS) that agent launches wait for
        the run's own rate limit: steps that wait for it looked like slow agents (28-36 s instead of 5 s)."""
        rate = self.io.context.spec.agents.max_jobs_per_minute
        await say_once(
            self.io,
            self.state,
            ("throttled", ""),
            reason="AgentLaunchesThrottled",
            message=f"agent Job creation waits {delay:.1f} s for spec.agents.maxJobsPerMinute ({rate} a "
            "minute); steps that wait for their rollouts to launch go faster with a higher rate",
            warning=False,
        )

    async def launch(self, rollout: RolloutView) -> None:
        """Render the rollout's Job, record the launch in the gateway, create the Job."""
        job = await self._render_job(rollout)
        if job is None or not await self._record_launch(rollout, job):
            return
        if not await self._create_job(rollout, job):
            return
        self._jobs_created += 1
        self.limiter.record(time.monotonic())
        self.state.active.add(job["metadata"]["name"])
        self.io.metrics.jobs_created.inc()
        self.io.changed()
        if self.state.template_error is not None:
            self.state.template_error = None
            self.io.changed()

    async def _render_job(self, rollout: RolloutView) -> JSON | None:
        """The rollout's agent Job, from the run's template; None when the template fails it."""
        context = self.io.context
        launch = agent_launch(
            rollout,
            run_name=context.name,
            namespace=context.namespace,
            job_name=names.agent_job_name(context.name, rollout.rollout_id),
            gateway_url=context.agent_gateway_url,
            gateway_key=context.gateway_key,
        )
        try:
            rendered = await self.renderer.render(context.template_source, launch.variables)
        except TemplateError as error:
            await template_failed(self.io, self.state, rollout, str(error))
            return None
        return shape_agent_job(
            rendered,
            settings=agent_job_settings(context, rollout.timeout_seconds),
            rollout_id=rollout.rollout_id,
            group_id=rollout.group_id,
            attempt_id=ATTEMPT_ID,
            agent_env=launch.env,
        )

    async def _record_launch(self, rollout: RolloutView, job: JSON) -> bool:
        """Mark the rollout launched in the gateway (the launch record) and stamp the Job with it."""
        io, launch_id = self.io, uuid.uuid4().hex
        try:
            receipt = await io.link.call(
                functools.partial(io.gateway.launch, rollout.rollout_id, launch_id=launch_id)
            )
        except GatewayError as error:
            # 409: launched before (by an earlier operator process) or no longer queued; 404: consumed.
            logger.info(
                "run %s rollout %s: not launched: %s", io.context.name, rollout.rollout_id, error.error
            )
            return False
        await io.link.observe(receipt.instance_id, receipt.totals)
        annotations = job["metadata"].setdefault("annotations", {})
        annotations[ANNOTATION_LAUNCH_ID] = launch_id
        annotations[ANNOTATION_GATEWAY_INSTANCE] = receipt.instance_id
        return True

    async def _create_job(self, rollout: RolloutView, job: JSON) -> bool:
        """Create the launched rollout's Job, retrying transient failures; a rejection fails the rollout."""
        io, name = self.io, job["metadata"]["name"]
        try:
            created = await retry_transient(
                lambda: io.kube.create_job(job),
                is_transient=kube_error_is_transient,
                what=f"run {io.context.name}: creating agent Job {name}",
                backoff=KUBE_BACKOFF,
                deadline_seconds=CREATE_JOB_DEADLINE_SECONDS,
                on_retry=lambda _error: io.metrics.errors.labels("create_job_retry").inc(),
            )
        except GaveUp as error:
            await self._launch_failed(rollout, f"could not create the agent Job {name}: {error}")
            return False
        except Exception as error:  # the API server (or the client, before sending) rejected the body
            reason = one_line_reason(error)
            await template_failed(
                io, self.state, rollout, f"the API server rejected the agent Job {name}: {reason}"
            )
            self._jobs_refused += 1
            await self._fail_if_every_job_is_refused(reason)
            return False
        return created or await self._is_our_job(rollout, job)

    async def _is_our_job(self, rollout: RolloutView, job: JSON) -> bool:
        """A Job of that name exists: ours if an earlier attempt of this very call got through unanswered."""
        io, name = self.io, job["metadata"]["name"]
        existing = await kube_call(
            lambda: io.kube.read_job(io.context.namespace, name),
            what=f"run {io.context.name}: reading Job {name}",
        )
        launch_id = job["metadata"]["annotations"][ANNOTATION_LAUNCH_ID]
        if existing is not None and job_annotations(existing).get(ANNOTATION_LAUNCH_ID) == launch_id:
            return True
        await self._launch_failed(
            rollout,
            f"an agent Job named {name} from an earlier launch of the same rollout id still exists; "
            "not replaced (a rollout runs at most once)",
        )
        return False

    async def _fail_if_every_job_is_refused(self, reason: str) -> None:
        state = self.state
        if (
            state.fatal_error is not None
            or self._jobs_created
            or self._jobs_refused < REFUSALS_BEFORE_FAILING
        ):
            return
        message = (
            f"the API server refused each of the first {self._jobs_refused} agent Jobs and took none; "
            f"fix spec.agents.template: {reason}"
        )
        logger.warning("run %s: %s", self.io.context.name, message)
        await self.io.kube.post_event(
            self.io.context.run, reason="AgentJobsRefused", message=message, warning=True
        )
        state.fatal_error = message
        self.io.changed()

    async def _launch_failed(self, rollout: RolloutView, reason: str) -> None:
        io = self.io
        logger.warning("run %s rollout %s: %s", io.context.name, rollout.rollout_id, reason)
        io.metrics.errors.labels("create_job").inc()
        await io.kube.post_event(io.context.run, reason="AgentJobFailed", message=reason, warning=True)
        await transition(io, rollout.rollout_id, RolloutState.FAILED, reason)
