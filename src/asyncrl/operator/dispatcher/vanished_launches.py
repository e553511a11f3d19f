"""Launches whose Job is gone: resolved, never relaunched (the restart's half of at-most-once launches).

What a restarted operator cannot see is resolved, never relaunched: at start, a launched rollout that is not
terminal and has no Job is ended `succeeded` if its agent reported a reward (it finished while nobody
watched) and `failed` otherwise (it was removed unfinished, or the operator stopped between the launch and
the Job), with a message saying so; the trainer trains the first with its reward and gives the second its
fill reward. A crash between launch and Job creation therefore loses that one rollout instead of running it
twice (`launching.py` holds the launch record itself).
"""

from __future__ import annotations

import asyncio
import logging
import time

from asyncrl.gateway_api.models import RolloutView
from asyncrl.operator.dispatcher.shared import (
    CREATE_JOB_DEADLINE_SECONDS,
    DispatchIO,
    job_annotations,
    transition,
)
from asyncrl.operator.retry import kube_call
from asyncrl.rollouts import RolloutState
from asyncrl.workloads import names

logger = logging.getLogger(__name__)

# A launch without a Job is judged vanished only this long after it was recorded: until then its launcher
# (this operator's claim loop, or another operator beside it) may still be creating the Job.
VANISHED_AFTER_SECONDS = CREATE_JOB_DEADLINE_SECONDS + 10.0
VANISHED_WITH_REWARD = (
    "the agent Job finished and was removed while the operator was away; its reported reward stands "
    "(not relaunched: a rollout runs at most once)"
)
VANISHED_WITHOUT_REWARD = (
    "the agent Job of this launched rollout no longer exists (removed before it reported a reward, or never "
    "created because the operator stopped right after the launch); not relaunched: a rollout runs at most "
    "once"
)


async def resolve_vanished_launches(io: DispatchIO) -> None:
    """Launched unfinished rollouts whose Job is gone (it ended unwatched): end them, never rerun.

    A launch whose agent never started (no reward, no model call, not running) and younger than
    `VANISHED_AFTER_SECONDS` is judged when it is that old, not at once: another operator serving the run
    beside this one (two at once, or an upgrade's overlap) may have recorded the launch and be creating
    its Job now; judged at once, its rollout was failed while its Job ran. One whose agent started had its
    Job (the usual case after a restart: it finished while nobody watched) and is judged at once. Only the
    launches seen at the start are judged: later ones are this process's own, or come with a Job."""
    pending: set[str] | None = None  # None: the first look, at every launched rollout
    while True:
        launched = await _launched_unfinished(io, pending)
        if not launched:
            return
        with_jobs = await _rollouts_with_jobs(io)
        now = time.time()
        without_job = [rollout for rollout in launched if rollout.rollout_id not in with_jobs]
        young = await _resolve_old_enough(io, without_job, now=now)
        if not young:
            return
        pending = set(young)
        await asyncio.sleep(min(young.values()) + VANISHED_AFTER_SECONDS - now + 1.0)


async def _launched_unfinished(io: DispatchIO, pending: set[str] | None) -> list[RolloutView]:
    """The gateway's launched rollouts that are not terminal (only those in `pending`, unless None)."""
    rollouts, _ = await io.link.call(io.gateway.list_rollouts)
    return [
        rollout
        for rollout in rollouts
        if rollout.launched_at is not None
        and not rollout.state.is_terminal
        and (pending is None or rollout.rollout_id in pending)
    ]


async def _rollouts_with_jobs(io: DispatchIO) -> set[str | None]:
    """The rollout ids of the run's agent Jobs (the Job watch's listing reports those)."""
    context = io.context
    jobs = await kube_call(
        lambda: io.kube.list_agent_jobs(context.namespace, context.name),
        what=f"run {context.name}: listing agent Jobs",
    )
    return {job_annotations(job).get(names.ANNOTATION_ROLLOUT_ID) for job in jobs}


async def _resolve_old_enough(
    io: DispatchIO, without_job: list[RolloutView], *, now: float
) -> dict[str, float]:
    """Resolve the launches old enough to judge; the others (rollout id → when launched) are judged later."""
    young: dict[str, float] = {}
    for rollout in without_job:
        launched_at = rollout.launched_at or now
        if _agent_never_started(rollout) and now - launched_at < VANISHED_AFTER_SECONDS:
            young[rollout.rollout_id] = launched_at
        else:
            await _resolve_vanished(io, rollout)
    return young


async def _resolve_vanished(io: DispatchIO, rollout: RolloutView) -> None:
    """End a launched rollout whose Job is gone: succeeded with its agent's reward, or failed."""
    name, rollout_id = io.context.name, rollout.rollout_id
    if rollout.reward is not None:
        logger.info("run %s rollout %s: %s", name, rollout_id, VANISHED_WITH_REWARD)
        if rollout.state is RolloutState.QUEUED:
            await transition(io, rollout_id, RolloutState.RUNNING, None)
        await transition(io, rollout_id, RolloutState.SUCCEEDED, VANISHED_WITH_REWARD)
    else:
        logger.warning("run %s rollout %s: %s", name, rollout_id, VANISHED_WITHOUT_REWARD)
        await transition(io, rollout_id, RolloutState.FAILED, VANISHED_WITHOUT_REWARD)
    io.metrics.errors.labels("vanished_launch").inc()


def _agent_never_started(rollout: RolloutView) -> bool:
    """No sign of its agent: no reward, no model call, never reported running (its Job may not exist yet)."""
    return rollout.reward is None and not rollout.n_model_calls and rollout.state is RolloutState.QUEUED
