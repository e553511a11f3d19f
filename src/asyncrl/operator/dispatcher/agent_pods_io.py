"""The run's agent pods, looked at every `agent_pods.CHECK_SECONDS`: which cannot start (`agent_pods.py`
decides, from their container statuses), said on the run; the rollout of one that has not started by the
start timeout fails, and the run fails when none of its agents ever started.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from asyncrl.operator.dispatcher import agent_pods
from asyncrl.operator.dispatcher.shared import (
    ANNOTATION_GATEWAY_INSTANCE,
    DispatchIO,
    DispatchState,
    job_annotations,
    say_once,
    transition,
)
from asyncrl.operator.retry import one_line_reason
from asyncrl.rollouts import RolloutState
from asyncrl.workloads import names

logger = logging.getLogger(__name__)


class AgentPodWatch:
    def __init__(self, io: DispatchIO, state: DispatchState) -> None:
        self.io = io
        self.state = state
        self._stuck_failed: set[str] = set()  # pods whose rollouts were failed for not starting

    async def agent_pods_loop(self) -> None:
        """Look at the run's agent pods every few seconds: say on the run which cannot start, fail the rollout
        of one that has not started by the start timeout, and the run when none of its agents ever started."""
        context = self.io.context
        selector = f"{names.AGENT_JOB_SELECTOR},{names.LABEL_RUN}={context.name}"  # Jobs' labels, on pods too
        while True:
            await asyncio.sleep(agent_pods.CHECK_SECONDS)
            try:
                pods = await self.io.kube.list_pods(context.namespace, selector)
            except Exception as error:  # not allowed, or the API server away: the Jobs still end by deadline
                logger.debug("run %s: agent pods not listed: %s", context.name, one_line_reason(error))
                continue
            await self.look_at_agent_pods(agent_pods.stuck_pods(pods))

    async def look_at_agent_pods(self, stuck: list[agent_pods.StuckPod]) -> None:
        await self._say_stuck(stuck)
        overdue = self._overdue(stuck)
        if not overdue:
            return
        if not self.state.agent_started and self.state.fatal_error is None:
            await self._fail_run(overdue[0])
            return
        await self._fail_rollouts(overdue)

    async def _say_stuck(self, stuck: list[agent_pods.StuckPod]) -> None:
        said = agent_pods.summary(stuck)
        if said != self.state.agents_stuck:
            self.state.agents_stuck = said
            self.io.changed()
        for pod in stuck:
            await say_once(
                self.io,
                self.state,
                (pod.reason, pod.image),
                reason="AgentPodCannotStart" if pod.never_starts else "AgentPodCrashing",
                message=f"agent {pod.describe()}",
            )

    def _overdue(self, stuck: list[agent_pods.StuckPod]) -> list[agent_pods.StuckPod]:
        """The pods that never start, stuck for the start timeout, and not failed yet."""
        now = datetime.now(UTC)
        timeout = self.io.context.agent_start_timeout_seconds
        return [
            pod
            for pod in stuck
            if pod.never_starts and pod.pod not in self._stuck_failed and pod.stuck_seconds(now) >= timeout
        ]

    async def _fail_run(self, first: agent_pods.StuckPod) -> None:
        """No agent pod of the run ever started: the run fails (its template needs a fix)."""
        context = self.io.context
        self.state.fatal_error = (
            f"no agent pod of this run started within {context.agent_start_timeout_seconds:g} s "
            f"(--agent-start-timeout-seconds): {first.describe()}; fix spec.agents.template (the image, "
            "its pull secret, the Secrets and ConfigMaps it reads)"
        )
        logger.warning("run %s: %s", context.name, self.state.fatal_error)
        await self.io.kube.post_event(
            context.run, reason="AgentPodsCannotStart", message=self.state.fatal_error, warning=True
        )
        self.io.changed()

    async def _fail_rollouts(self, overdue: list[agent_pods.StuckPod]) -> None:
        """Fail the rollout of each overdue pod and delete its Job."""
        io = self.io
        context, timeout = io.context, io.context.agent_start_timeout_seconds
        jobs = {
            job["metadata"]["name"]: job
            for job in await io.kube.list_agent_jobs(context.namespace, context.name)
        }
        for pod in overdue:
            self._stuck_failed.add(pod.pod)
            job = jobs.get(pod.job or "")
            if job is None:
                continue
            annotations = job_annotations(job)
            rollout_id = annotations.get(names.ANNOTATION_ROLLOUT_ID)
            if rollout_id is not None:
                await transition(
                    io,
                    rollout_id,
                    RolloutState.FAILED,
                    f"the agent pod did not start within {timeout:g} s: {pod.describe()}",
                    instance_id=annotations.get(ANNOTATION_GATEWAY_INSTANCE),
                )
            await io.kube.delete_job(context.namespace, job["metadata"]["name"])
