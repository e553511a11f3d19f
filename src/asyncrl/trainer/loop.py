"""The trainer's step loop: draw groups, wait for enough complete ones, pause and drain, update, resume.

It ties the pure window (what to draw, what to train on, what carries over) to its I/O: the gateway (rollouts
are created there, completions arrive through its feed, it is paused around each update), the backend (the
update) and the metrics sinks.

Restarts lose nothing they need not (`asyncrl.trainer.recovery` holds the rules). A restarted trainer
continues from its latest checkpoint: steps whose update was lost are redone, never counted as done, and the
window is rebuilt from the gateway, which outlives the trainer container. A restarted gateway has lost its
rollouts: the loop notices (a connection error, or a new `instance_id` in its stats), registers the model
servers again and redraws the groups it lost as new rollouts; a step's data is fetched before the window
commits the update, so nothing is trained twice and the step counter just continues.

A step's data is ready before its pause: as groups complete, `asyncrl.trainer.prefetch` fetches their
rollouts' events in batches and adapts them in the background, so the paused gateway waits only for the
update (and the checkpoint). Rows of groups that leave the window (stale, lost with a gateway) go with them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from asyncrl import metric_names as names
from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.gateway_api.client import GatewayError, PauseResult
from asyncrl.gateway_api.models import (
    DEFAULT_EVENTS_BATCH_BYTES,
    CompletionEntry,
    GatewayStats,
    RolloutCreate,
)
from asyncrl.pause_modes import DrainPolicy
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.adapter import AdapterConfig, AdapterCounts
from asyncrl.trainer.backends import TrainerBackend, UpdateMetrics
from asyncrl.trainer.checkpoints import LoopState, latest_checkpoint, save_checkpoint
from asyncrl.trainer.data import PromptSource
from asyncrl.trainer.failures import RunFailed
from asyncrl.trainer.gateway_port import TrainerGateway
from asyncrl.trainer.length_metrics import length_metrics
from asyncrl.trainer.metrics import MetricsSinks, spread
from asyncrl.trainer.prefetch import DEFAULT_BATCH_ROLLOUTS, PrefetchTotals, RolloutsMissing, RowPrefetcher
from asyncrl.trainer.recovery import groups_of, plan_resync, resume_decision, sharded_world_size
from asyncrl.trainer.rows import TrainingRow
from asyncrl.trainer.uniform_groups import drop_limit, uniform_groups
from asyncrl.trainer.window import Group, RolloutWindow
from asyncrl.window_config import WindowConfig

logger = logging.getLogger(__name__)

COMPLETIONS_WAIT_SECONDS = (
    30.0  # one long-poll; an empty answer doubles as a check that the gateway is the same
)
GATEWAY_POLL_SECONDS = 0.5  # how often an unreachable gateway is tried again
MAX_GATEWAY_RECOVERIES_PER_STEP = 10  # more means the gateway fails for another reason: give up loudly

# What a gateway that died or restarted looks like to a call: no connection, or a 5xx while it starts.
# A 404 for a rollout we created means the same once the instance id confirms a restart.
GatewayFailure = (httpx.TransportError, GatewayError)
RESUME_RETRY_FIRST_SECONDS = 0.05
RESUME_RETRY_MAX_SECONDS = 2.0


class GatewayRestarted(RuntimeError):
    """The gateway answers as a new instance: the rollouts, feed and upstreams it held are gone."""


@dataclass(frozen=True)
class LoopSettings:
    window: WindowConfig
    adapter: AdapterConfig
    rollout_timeout_seconds: float
    total_steps: int | None  # None: one pass over the data
    checkpoint_dir: Path | None
    checkpoint_every_steps: int
    retry_after_seconds: float = 5
    drain_policy: DrainPolicy = DrainPolicy.ABORT  # cancel calls in flight at the pause, or wait for them
    drain_timeout_seconds: float = 300.0
    gateway_wait_seconds: float = 300.0  # how long an unreachable gateway is waited for, each time
    max_failed_steps: int | None = 3  # consecutive steps with nothing to train before the run fails
    drop_uniform_groups: bool = False  # dynamic sampling: skip groups whose rewards are all alike
    # Rows are prepared as groups complete, in batched fetches in the background (asyncrl.trainer.prefetch).
    events_batch_rollouts: int = DEFAULT_BATCH_ROLLOUTS  # rollouts per events request
    events_batch_bytes: int = (
        DEFAULT_EVENTS_BATCH_BYTES  # bytes per events answer (beyond its first document)
    )
    world_size: int | None = None  # GPUs the checkpoints are sharded over (recorded, compared at resume)

    @classmethod
    def of_run(cls, spec: AsyncTrainingRunSpec, *, checkpoint_dir: Path | None) -> LoopSettings:
        """What a run's spec asks of the loop, checkpointing to `checkpoint_dir`; this process's own bounds
        (the drain and gateway waits, the events batches) keep their defaults."""
        return cls(
            window=spec.window_config(),
            adapter=AdapterConfig.of_run(spec),
            rollout_timeout_seconds=spec.rollout_timeout_seconds,
            total_steps=spec.total_steps,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every_steps=spec.trainer.checkpoint.every_steps,
            retry_after_seconds=spec.gateway.retry_after_seconds,
            drain_policy=spec.gateway.drain_policy,
            max_failed_steps=spec.max_failed_steps,
            drop_uniform_groups=spec.rollout.drop_uniform_groups,
            world_size=sharded_world_size(spec),
        )


@dataclass(frozen=True)
class RunResult:
    """What `StepLoop.run` did: steps `first_step` .. `next_step - 1` were trained by this process."""

    first_step: int  # where this process started (the checkpoint's step; 0 for a fresh run)
    next_step: int  # the next step to run: the number of steps the run has trained in total
    steps_run: int  # updates this process ran

    def describe(self) -> str:
        resumed = f", resumed at step {self.first_step}" if self.first_step else ""
        if self.next_step == 0:
            return "trained no step"
        return (
            f"trained steps 0-{self.next_step - 1} ({self.next_step} steps; "
            f"{self.steps_run} in this process{resumed})"
        )


@dataclass(frozen=True)
class _PreparedUpdate:
    """A step's update, fetched but not yet committed to the window."""

    groups: tuple[Group, ...]
    rows: list[TrainingRow]
    counts: AdapterCounts
    drain: PauseResult
    wait_started: float


class StepLoop:
    def __init__(
        self,
        *,
        settings: LoopSettings,
        gateway: TrainerGateway,
        backend: TrainerBackend,
        prompts: PromptSource,
        sinks: MetricsSinks,
    ) -> None:
        self.settings = settings
        self.gateway = gateway
        self.backend = backend
        self.prompts = prompts
        self.sinks = sinks
        self.window = RolloutWindow(settings.window)
        self.step = 0
        self._first_step_here = 0  # the first step this process trains (after a resume, not 0)
        self._cursor = 0
        self._timings: dict[str, CompletionEntry] = {}
        self._inputs: dict[str, Any] = {}  # group id -> its prompt row, to redraw a group a gateway lost
        self._instance_id: str | None = None  # the gateway instance that holds our rollouts
        self._resync_needed = False  # a gateway call failed: the window may not match the gateway
        self._step_paused = False  # this step's pause was sent and the gateway not yet resumed after it
        self._first_epoch_only = settings.total_steps is None
        self._failed_steps = 0  # consecutive steps whose consumed groups held nothing to train on
        self._saved_step: int | None = None  # the step of the last checkpoint written or loaded
        self._prefetcher = RowPrefetcher(
            gateway=gateway,
            config=settings.adapter,
            groups=lambda: self.window.active_groups,
            instance_id=lambda: self._instance_id,
            batch_rollouts=settings.events_batch_rollouts,
            batch_bytes=settings.events_batch_bytes,
        )

    # -- the gateway's lifetime ---------------------------------------------------------------------------

    async def wait_for_gateway(self) -> str:
        """Wait (bounded) until the gateway answers; return its instance id."""
        return (await self._gateway_stats()).instance_id

    async def _gateway_stats(self) -> GatewayStats:
        """The gateway's stats, once it answers (bounded wait)."""
        deadline = time.monotonic() + self.settings.gateway_wait_seconds
        logged = False
        while True:
            try:
                return await self.gateway.stats()
            except GatewayFailure as error:
                if isinstance(error, GatewayError) and error.status < 500:
                    raise
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the gateway did not answer within {self.settings.gateway_wait_seconds:.0f}s: "
                        f"{error}"
                    ) from error
                if not logged:
                    logger.warning(
                        "the gateway does not answer (%s); trying every %.1fs for up to %.0fs",
                        error or type(error).__name__,
                        GATEWAY_POLL_SECONDS,
                        self.settings.gateway_wait_seconds,
                    )
                    logged = True
                await asyncio.sleep(GATEWAY_POLL_SECONDS)

    async def connect(self) -> None:
        """Register the model servers with the gateway and remember which gateway instance holds our work."""
        instance_id = await self.wait_for_gateway()
        # The gateway forwards agents' calls to the backend's servers, which exist only now (verl's vLLM
        # replicas pick their own ports); a restarted gateway has forgotten them.
        await self.gateway.set_upstreams(self.backend.serve_urls, model=self.backend.served_model)
        self._instance_id = instance_id

    async def _gateway_restarted(self) -> bool:
        """Whether the gateway now answering is another instance than the one holding our rollouts."""
        return await self.wait_for_gateway() != self._instance_id

    async def _sync_with_gateway(self, step: int) -> None:
        """Before collecting: adopt a restarted gateway, and resync the window after any gateway failure.

        `_resync_needed` stays set until a resync completed, so a gateway that fails again halfway through
        is synced again on the next try, never trusted with a window it does not hold.
        """
        if await self._gateway_restarted():
            logger.warning(
                "step %d: the gateway restarted and lost its rollouts; registering the model servers again "
                "and redrawing the %d groups it held as new rollouts",
                step,
                len(self.window.active_groups),
            )
            await self.connect()
            await self.gateway.resume(model_version=self.backend.model_version)
            self._step_paused = False  # a restarted gateway was never paused by this step
            self._resync_needed = True
        if self._resync_needed:
            await self._resync(step)
            self._resync_needed = False

    # -- start and recovery -------------------------------------------------------------------------------

    async def recover(self) -> None:
        """Continue from the latest checkpoint, with the window as the gateway holds it.

        The step is the checkpoint's: updates after it were lost with the old process, so those steps run
        again. Groups drawn by the lost steps stay in the window, counted as drawn at the checkpoint's step.
        """
        consumed: tuple[str, ...] = ()
        if self.settings.checkpoint_dir is not None:
            found = latest_checkpoint(self.settings.checkpoint_dir)
            if found is not None:
                path, state = found
                decision = resume_decision(
                    checkpoint=str(path),
                    saved_world_size=state.world_size,
                    world_size=self.settings.world_size,
                )
                if decision.refused:  # a configuration error: the preflight refuses it first in the trainer
                    raise SystemExit(f"asyncrl trainer: {decision.detail}; fix: {decision.fix}")
                logger.info("%s", decision.detail)
                # Loading sleeps and wakes the model servers: no agent call may be in flight meanwhile (the
                # gateway outlived us and may be serving); run() resumes it after recovery.
                await self.gateway.pause(
                    reason=f"loading checkpoint {path.name}",
                    retry_after_seconds=self.settings.retry_after_seconds,
                    wait_seconds=self.settings.drain_timeout_seconds,
                )
                self.step = await self.backend.load_checkpoint(path)
                self._saved_step = self.step
                self.prompts = self.prompts.at(state.data_position)
                consumed = state.consumed_group_ids
                logger.info("resumed from checkpoint %s (step %d)", path, self.step)
        self.sinks.discard_from(self.step)
        rollouts, self._cursor = await self.gateway.list_rollouts()
        trained = [rollout for rollout in rollouts if rollout.group_id in set(consumed)]
        if trained:  # the checkpoint's update trained them; the old process died before deleting them
            await self.gateway.delete_rollouts(rollout.rollout_id for rollout in trained)
            rollouts = [rollout for rollout in rollouts if rollout.group_id not in set(consumed)]
        groups = groups_of(rollouts, resume_step=self.step)
        if groups:
            self.window = RolloutWindow.restore(self.settings.window, groups)
            self._inputs = {rollout.group_id: rollout.input for rollout in rollouts}
            logger.info(
                "recovered %d active groups (%d complete) from the gateway; continuing at step %d",
                len(groups),
                self.window.n_complete_groups,
                self.step,
            )

    async def _resync(self, step: int) -> None:
        """Make the window and the gateway agree: keep whole groups, redraw lost ones, clean up strays."""
        rollouts, cursor = await self.gateway.list_rollouts()
        plan = plan_resync(self.window.active_groups, rollouts)
        for rollout_id in plan.to_cancel:
            await self._cancel_rollout(rollout_id, reason="its group was redrawn after a gateway failure")
        if plan.to_delete:
            await self.gateway.delete_rollouts(plan.to_delete)
        lost = self.window.drop_groups(plan.lost_groups)
        for rollout_id, state in plan.terminal_states.items():
            self.window.record_terminal(rollout_id, state)
        self._cursor = cursor
        if lost:
            await self._create_groups(step, [self._inputs.pop(group.group_id) for group in lost])
            logger.info("step %d: redrew %d groups the gateway lost, as new rollouts", step, len(lost))

    # -- the loop -----------------------------------------------------------------------------------------

    async def start_serving(self) -> None:
        """Register the model servers, load the latest checkpoint, then open the gateway at that version.

        A gateway that outlived its trainer still serves agents at the old trainer's model version, while the
        fresh servers hold the base weights until the checkpoint is loaded (and forever, without one): they
        are registered while that gateway is paused, so no call is answered by other weights than its label
        says. A gateway at version 0 (a new run, or restarted with the pod) labels the base weights rightly,
        and stays open.
        """
        stats = await self._gateway_stats()
        if stats.model_version:
            await self.gateway.pause(
                reason=(
                    f"the trainer restarted: its model servers hold other weights than version "
                    f"{stats.model_version} until its checkpoint is loaded"
                ),
                retry_after_seconds=self.settings.retry_after_seconds,
                wait_seconds=self.settings.drain_timeout_seconds,
            )
        await self.connect()
        await self.recover()
        await self.gateway.resume(model_version=self.backend.model_version)

    async def run(self) -> RunResult:
        """Run steps until totalSteps, or until one pass over the data is trained on."""
        await self.start_serving()
        self._first_step_here, steps_run = self.step, 0
        try:
            while self.settings.total_steps is None or self.step < self.settings.total_steps:
                if not await self._run_step():
                    break
                steps_run += 1
        finally:
            await self._prefetcher.close()
        await self._finish()
        return RunResult(first_step=self._first_step_here, next_step=self.step, steps_run=steps_run)

    async def _run_step(self) -> bool:
        """One step; False when there is nothing left to train on."""
        step, started = self.step, time.monotonic()
        window = self.window
        window.begin_step(step=step)
        stale = window.apply_staleness_policy(step=step)
        if stale:
            try:
                await self._cancel(stale, reason=f"older than maxCarryOverAgeSteps at step {step}")
                # Cancelled first (the feed tells the operator to delete their Jobs), then deleted: a stale
                # group's captured calls would otherwise stay in the gateway's memory for the whole run.
                await self.gateway.delete_rollouts(rid for group in stale for rid in group.rollout_ids)
            except GatewayFailure as error:  # the next sync cleans up what stays behind
                logger.warning("step %d: cancelling stale groups failed: %s", step, error)
                self._resync_needed = True
        prepared = await self._prepare_update_surviving_the_gateway(step)
        if prepared is None:
            return False
        batch = window.take_update_batch(step=step)
        assert batch.consumed == prepared.groups, "the window changed between fetching and taking the batch"
        update_started = time.monotonic()
        update = await self._update(prepared.rows, step)
        drain = prepared.drain
        summary = batch.summary.with_drain(
            inflight_at_pause=drain.inflight_at_pause,
            drain_seconds=drain.drain_seconds,
            aborted_calls=drain.aborted,
        )
        consumed_ids = [rollout_id for group in batch.consumed for rollout_id in group.rollout_ids]
        rewards = [row.reward for row in prepared.rows]
        reward_mean = _mean(rewards)
        metrics = {
            **summary.metrics(),
            **self._timing_metrics(consumed_ids),
            **prepared.counts.metrics(),
            **length_metrics(prepared.rows),
            **self._prefetch_metrics(),
            **(update.as_dict() if update is not None else {}),
            **spread(names.SCORE, rewards, separator="/"),
            names.SCORE_MEAN: reward_mean,  # 0.0 when there are no rows (then without max and min)
            names.STEP_SECONDS: time.monotonic() - started,
            names.UPDATE_PHASE_SECONDS: time.monotonic() - prepared.wait_started,
            names.PAUSE_TO_UPDATE_SECONDS: update_started - prepared.wait_started,
        }
        # Logged before the checkpoint: a crash in between redoes the step, and the restart drops its line.
        self.sinks.log(step, metrics)
        self.step = step + 1
        for group in batch.consumed:
            self._inputs.pop(group.group_id, None)
        if self.settings.checkpoint_dir is not None and self.step % self.settings.checkpoint_every_steps == 0:
            await self._save_checkpoint(consumed=batch.consumed)
        try:
            await self._resume_confirmed(step)
            await self.gateway.delete_rollouts(consumed_ids)
            await self.gateway.put_summary(
                summary.window_summary(
                    active_groups=len(window.active_groups),
                    reward_mean=reward_mean,
                    step_seconds=metrics[names.STEP_SECONDS],
                    total_steps=self.settings.total_steps,
                    steps_in_process=step - self._first_step_here + 1,
                )
            )
        except GatewayFailure as error:
            # The update is done and counted; the next step syncs with whatever gateway answers then.
            logger.warning("step %d: reporting the step to the gateway failed: %s", step, error)
            self._resync_needed = True
        for rollout_id in consumed_ids:
            self._timings.pop(rollout_id, None)
        logger.info(
            "step %d: reward %.3f, completed %d, carried %d (max age %d), drain %.3fs (%d aborted), "
            "step %.1fs",
            step,
            reward_mean,
            summary.n_completed_rollouts,
            summary.n_new_carry_over_rollouts,
            summary.new_carry_over_age_max_steps,
            summary.proxy_drain_seconds,
            summary.proxy_aborted_calls,
            metrics[names.STEP_SECONDS],
        )
        # Which groups this update trained, so a run's log shows any group trained twice (benchmarks/soak.py).
        logger.info("step %d: trained groups %s", step, " ".join(group.group_id for group in batch.consumed))
        self._count_failed_step(step, batch.consumed, n_rows=len(prepared.rows))
        return True

    async def _prepare_update_surviving_the_gateway(self, step: int) -> _PreparedUpdate | None:
        """`_prepare_update`, run again after the gateway failed or restarted; the window stays consistent.

        A restarted gateway also shows as a 404 for a rollout we created, so a 404 is retried after a sync
        (a real 404 fails the step after a bounded number of tries); other 4xx answers are real errors.
        """
        for _ in range(MAX_GATEWAY_RECOVERIES_PER_STEP):
            try:
                await self._sync_with_gateway(step)
                return await self._prepare_update(step)
            except (*GatewayFailure, GatewayRestarted, RolloutsMissing) as error:
                if isinstance(error, GatewayError) and error.status < 500 and error.status != 404:
                    raise
                logger.warning(
                    "step %d: the gateway failed (%s); syncing with it and continuing", step, _failure(error)
                )
                self._resync_needed = True
                # A pause already sent is kept: if the window is still ready after the sync, the retried
                # step updates within it; `_prepare_update` resumes the gateway only if it must collect.
        raise RuntimeError(
            f"step {step}: the gateway failed {MAX_GATEWAY_RECOVERIES_PER_STEP} times in one step; giving up"
        )

    async def _prepare_update(self, step: int) -> _PreparedUpdate | None:
        """Fill the window, wait for enough complete groups, pause and drain, fetch the batch's data.

        Changes the window only by drawing, recording completions and dropping uniform groups (which a resync
        after a failure tolerates), so after a gateway failure it can run again for the same step. None when
        there is nothing left to train on.
        """
        window = self.window
        await self._draw(step)
        if not window.active_groups:
            return None  # the data is used up and nothing is in flight
        while True:
            while not window.ready_for_update():
                if self._data_exhausted() and not self._can_still_complete():
                    return None
                if self._step_paused:  # a retried step whose failed try paused the gateway must collect
                    await self._reopen_after_failure(step)
                await self._consume_completions()
                if window.config.refills and not window.ready_for_update():
                    await self._draw(step)  # keep windowSize groups unfinished while collecting
            await self._prefetcher.settle(window.update_groups())  # the rows are ready before the pause
            if not await self._drop_uniform_groups(step):
                break
        wait_started = time.monotonic()
        self._step_paused = True  # before sending: a pause whose answer is lost still paused the gateway
        drain = await self.gateway.pause(
            reason=f"weight update, step {step}",
            retry_after_seconds=self.settings.retry_after_seconds,
            wait_seconds=self.settings.drain_timeout_seconds,
            abort=self.settings.drain_policy is DrainPolicy.ABORT,
        )
        if not drain.drained:
            logger.warning(
                "step %d: %d model calls still in flight after %.0fs of draining; updating anyway",
                step,
                drain.inflight,
                self.settings.drain_timeout_seconds,
            )
        groups = window.update_groups()
        rows, counts = await self._prefetcher.rows_for(groups)
        return _PreparedUpdate(
            groups=groups, rows=rows, counts=counts, drain=drain, wait_started=wait_started
        )

    def _count_failed_step(self, step: int, consumed: Sequence[Group], *, n_rows: int) -> None:
        """A step fails when no consumed rollout succeeded or nothing was trainable; too many in a row end
        the run (a template that never renders, an agent that always crashes) instead of a Succeeded run
        that learned nothing."""
        succeeded = sum(
            state is RolloutState.SUCCEEDED for group in consumed for state in group.terminal_states.values()
        )
        if succeeded and n_rows:
            self._failed_steps = 0
            return
        self._failed_steps += 1
        limit = self.settings.max_failed_steps
        logger.warning(
            "step %d: no rollout succeeded or nothing to train on (%d in a row%s)",
            step,
            self._failed_steps,
            "" if limit is None else f", the run fails at {limit}",
        )
        if limit is not None and self._failed_steps >= limit:
            raise RunFailed(
                f"{self._failed_steps} consecutive steps (up to step {step}) had no succeeded rollout to "
                "train on (spec.maxFailedSteps); check the agent Jobs' logs and the rollouts' messages"
            )

    async def _finish(self) -> None:
        try:
            if await self._gateway_restarted():
                await self.connect()  # what the new gateway holds is not ours; nothing to cancel
            else:
                leftover = list(self.window.active_groups)
                if leftover:
                    await self._cancel(leftover, reason="the run finished")
        except GatewayFailure as error:
            logger.warning("cancelling the unfinished groups failed: %s", error)
        if self.settings.checkpoint_dir is not None and self._saved_step != self.step:
            # Saving sleeps the model servers, as in a step: pause and drain first.
            await self.gateway.pause(
                reason="final checkpoint",
                retry_after_seconds=self.settings.retry_after_seconds,
                wait_seconds=self.settings.drain_timeout_seconds,
            )
            await self._save_checkpoint(consumed=())
        await self.gateway.resume(model_version=self.backend.model_version)

    # -- pieces -------------------------------------------------------------------------------------------

    async def _reopen_after_failure(self, step: int) -> None:
        """Resume the gateway that a failed try of this step paused, before the retry collects again.

        Only a retry that must wait for completions (the sync redrew groups, so the window is no longer
        ready) resumes: with the gateway still paused, the agents it waits for could not call the model (every
        call held until the hold timeout; before 10bed41 seen up to 8.6 s in the soak). A retry whose window
        is still ready updates within the pause it already holds, so no pause ends without an update.
        """
        try:
            await self._resume_confirmed(step)
        except GatewayFailure as error:
            logger.warning(
                "step %d: resuming the gateway after the failure failed too (%s); its pause lease ends the "
                "pause if nothing else does",
                step,
                error,
            )

    async def _resume_confirmed(self, step: int) -> None:
        """Resume the gateway at the new version, retried until it answers that it is open.

        A resume that fails (a reset connection, a gateway busy for a moment) would otherwise leave the
        gateway paused through the next collection, every agent call held until the hold timeout. Gives up
        only after `gateway_wait_seconds`, raising the last failure (the next step then resyncs).
        """
        delay, deadline = RESUME_RETRY_FIRST_SECONDS, time.monotonic() + self.settings.gateway_wait_seconds
        while True:
            try:
                view = await self.gateway.resume(model_version=self.backend.model_version)
                if not view.paused:
                    self._step_paused = False
                    return
                failure: Exception = GatewayError(
                    200, "the gateway still reports paused after the resume", None
                )
            except GatewayFailure as error:
                if isinstance(error, GatewayError) and error.status < 500:
                    raise
                failure = error
            if time.monotonic() + delay > deadline:
                raise failure
            logger.warning(
                "step %d: resuming the gateway failed (%s); retrying in %.1fs", step, _failure(failure), delay
            )
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESUME_RETRY_MAX_SECONDS)

    async def _save_checkpoint(self, *, consumed: Sequence[Group]) -> None:
        """A checkpoint of the current step, once: the last step's may already be saved by the step loop."""
        if self.settings.checkpoint_dir is None or self._saved_step == self.step:
            return
        position = self.prompts.position
        await save_checkpoint(
            self.settings.checkpoint_dir,
            self.backend,
            LoopState(
                step=self.step,
                data_epoch=position.epoch,
                data_offset=position.offset,
                consumed_group_ids=tuple(group.group_id for group in consumed),
                world_size=self.settings.world_size,
            ),
        )
        self._saved_step = self.step

    def _data_exhausted(self) -> bool:
        return self._first_epoch_only and self.prompts.position.epoch > 0

    def _can_still_complete(self) -> bool:
        """Whether waiting longer can make the window ready (groups with rollouts still running)."""
        return any(not group.is_complete for group in self.window.active_groups)

    async def _drop_uniform_groups(self, step: int) -> bool:
        """With `rollout.dropUniformGroups`: drop the batch's groups whose rewards are all alike (nothing for
        GRPO to learn) and draw new prompts in their place; True when some were dropped (collect again).

        At most `drop_limit` per update, so a run whose every group scores alike still updates.
        """
        window = self.window
        room = drop_limit(
            enabled=self.settings.drop_uniform_groups, train_batch_size=window.config.train_batch_size
        )
        room -= window.n_uniform_groups_dropped
        if room <= 0:
            return False
        groups = window.update_groups()
        rows, _counts = await self._prefetcher.rows_for(groups)
        uniform = uniform_groups(groups, rows)[:room]
        if not uniform:
            return False
        dropped = window.drop_uniform_groups((group.group_id for group in uniform), step=step)
        for group in dropped:
            self._inputs.pop(group.group_id, None)
        self._prefetcher.notice()
        logger.info(
            "step %d: dropped %d group%s whose rewards were all alike (%s); drawing new prompts",
            step,
            len(dropped),
            "" if len(dropped) == 1 else "s",
            " ".join(group.group_id for group in dropped),
        )
        # Their agents have ended; a failed delete leaves strays that the next resync deletes.
        await self.gateway.delete_rollouts(rid for group in dropped for rid in group.rollout_ids)
        # Sync mode draws only into an empty window: replace the dropped groups one for one.
        await self._draw(step, count=None if window.config.async_enabled else len(dropped))
        return True

    async def _draw(self, step: int, *, count: int | None = None) -> None:
        """Draw new prompt groups: as many as the window takes now, or `count`."""
        rows: list[Any] = []
        for _ in range(self.window.groups_to_draw() if count is None else count):
            position = self.prompts.position
            if self._first_epoch_only and position.offset >= self.prompts.n_rows:
                break  # one pass over the data is drawn
            _, row = self.prompts.draw()
            rows.append(row)
        await self._create_groups(step, rows)

    async def _create_groups(self, step: int, rows: Sequence[Any]) -> None:
        """New groups (new ids) for these prompts: in the window first, then in the gateway.

        Should creating them fail, the window holds groups the gateway lacks, which `_resync` redraws.
        """
        creations: list[RolloutCreate] = []
        for row in rows:
            group_id = f"s{step}-{uuid.uuid4().hex[:12]}"
            rollout_ids = [f"{group_id}-r{index}" for index in range(self.settings.window.samples_per_prompt)]
            self.window.add_group(group_id=group_id, rollout_ids=rollout_ids, step=step)
            self._inputs[group_id] = row
            creations += [
                RolloutCreate(
                    rollout_id=rollout_id,
                    group_id=group_id,
                    step=step,
                    input=row,
                    timeout_seconds=self.settings.rollout_timeout_seconds,
                )
                for rollout_id in rollout_ids
            ]
        if creations:
            await self.gateway.create_rollouts(creations)

    async def _consume_completions(self) -> None:
        try:
            page = await self.gateway.completions(after=self._cursor, wait_seconds=COMPLETIONS_WAIT_SECONDS)
        except GatewayError as error:
            if error.status != 410:
                raise
            await self._resync_terminal_states()
            return
        if not page.entries and await self._gateway_restarted():
            # A restarted gateway's feed starts again below our cursor and would never answer it.
            raise GatewayRestarted("the gateway answers with a new instance id")
        self._cursor = page.cursor
        for entry in page.entries:
            self._timings[entry.rollout_id] = entry
            self.window.record_terminal(entry.rollout_id, entry.state)
        self._prefetcher.notice()  # fetch the groups this page completed

    async def _resync_terminal_states(self) -> None:
        """The feed moved past our cursor: take terminal states from the rollout listing instead."""
        rollouts, self._cursor = await self.gateway.list_rollouts()
        for rollout in rollouts:
            if rollout.state.is_terminal:
                self.window.record_terminal(rollout.rollout_id, rollout.state)

    async def _cancel_rollout(self, rollout_id: str, *, reason: str) -> None:
        try:
            await self.gateway.transition(rollout_id, RolloutState.CANCELLED, message=reason)
        except GatewayError as error:
            if error.status not in (404, 409):
                raise

    async def _cancel(self, groups: Sequence[Group], *, reason: str) -> None:
        for group in groups:
            self._inputs.pop(group.group_id, None)
            for rollout_id in group.rollout_ids:
                if rollout_id not in group.terminal_states:
                    await self._cancel_rollout(rollout_id, reason=reason)
        logger.info("cancelled %d groups: %s", len(groups), reason)

    async def _update(self, rows: list[TrainingRow], step: int) -> UpdateMetrics | None:
        if not rows:
            logger.warning("step %d: no trainable rows in the consumed groups; the update is skipped", step)
            return None
        await self.backend.sleep()
        try:
            return await self.backend.update(rows, step=step)
        finally:
            await self.backend.wake()

    def _prefetch_metrics(self) -> dict[str, float]:
        """What the step's prefetching moved (since the last step's metrics)."""
        totals, self._prefetcher.totals = self._prefetcher.totals, PrefetchTotals()
        return totals.metrics()

    def _timing_metrics(self, rollout_ids: Sequence[str]) -> dict[str, float]:
        entries = [self._timings[rid] for rid in rollout_ids if rid in self._timings]
        waits = [e.queue_wait_seconds for e in entries if e.queue_wait_seconds is not None]
        runs = [e.run_seconds for e in entries if e.run_seconds is not None]
        return {
            **spread(names.ROLLOUT_QUEUE_WAIT_SECONDS, waits),
            **spread(names.ROLLOUT_RUN_SECONDS, runs),
        }


def _failure(error: Exception) -> str:
    """An error as a log line names it: httpx's timeouts carry no message, so the type says what happened."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
