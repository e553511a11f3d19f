"""The trainer's step loop: draw groups, wait for enough complete ones, pause and drain, update, resume.

It ties the pure window (what to draw, what to train on, what carries over) to its I/O: the gateway (rollouts
are created there, completions arrive through its feed, it is paused around each update), the backend (the
update) and the metrics sinks. The gateway outlives the trainer container, so on start the loop rebuilds its
window from the gateway's rollouts and continues from the latest checkpoint: a restart loses no carried-over
group.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from asyncrl.gateway.client import GatewayClient, GatewayError
from asyncrl.gateway.models import CompletionEntry, RolloutCreate, RolloutView, WindowSummary
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.adapter import AdapterConfig, AdapterCounts, adapt_rollout
from asyncrl.trainer.backends import TrainerBackend, UpdateMetrics
from asyncrl.trainer.checkpoints import LoopState, latest_checkpoint, save_checkpoint
from asyncrl.trainer.data import PromptSource
from asyncrl.trainer.failures import RunFailed
from asyncrl.trainer.metrics import MetricsSinks, spread
from asyncrl.trainer.rows import TrainingRow
from asyncrl.trainer.window import Group, RolloutWindow, WindowConfig

logger = logging.getLogger(__name__)

EVENT_FETCH_CONCURRENCY = 16


@dataclass(frozen=True)
class LoopSettings:
    window: WindowConfig
    adapter: AdapterConfig
    rollout_timeout_seconds: float
    total_steps: int | None  # None: one pass over the data
    checkpoint_dir: Path | None
    checkpoint_every_steps: int
    retry_after_seconds: int = 5
    drain_timeout_seconds: float = 300.0
    gateway_wait_seconds: float = 300.0
    max_failed_steps: int | None = 3  # consecutive steps with nothing to train before the run fails


class StepLoop:
    def __init__(
        self,
        *,
        settings: LoopSettings,
        gateway: GatewayClient,
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
        self._cursor = 0
        self._timings: dict[str, CompletionEntry] = {}
        self._first_epoch_only = settings.total_steps is None
        self._failed_steps = 0  # consecutive steps whose consumed groups held nothing to train on
        self._saved_step: int | None = None  # the step of the last checkpoint written or loaded

    # -- start and recovery -------------------------------------------------------------------------------

    async def wait_for_gateway(self) -> None:
        deadline = time.monotonic() + self.settings.gateway_wait_seconds
        while True:
            try:
                await self.gateway.state()
                return
            except (httpx.TransportError, GatewayError) as error:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the gateway did not answer within {self.settings.gateway_wait_seconds}s"
                    ) from error
                logger.info("waiting for the gateway: %s", error)
                await asyncio.sleep(1.0)

    async def recover(self) -> None:
        """Continue from the latest checkpoint, with the window as the gateway holds it."""
        if self.settings.checkpoint_dir is not None:
            found = latest_checkpoint(self.settings.checkpoint_dir)
            if found is not None:
                path, state = found
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
                logger.info("resumed from checkpoint %s (step %d)", path, self.step)
        rollouts, self._cursor = await self.gateway.list_rollouts()
        groups = _groups_of(rollouts)
        if groups:
            self.window = RolloutWindow.restore(self.settings.window, groups)
            newest = max(group.enqueued_step for group in groups)
            self.step = max(self.step, newest)
            logger.info(
                "recovered %d active groups (%d complete) from the gateway; continuing at step %d",
                len(groups),
                self.window.n_complete_groups,
                self.step,
            )

    # -- the loop -----------------------------------------------------------------------------------------

    async def run(self) -> int:
        """Run steps until totalSteps, or until one pass over the data is trained on; returns steps run."""
        await self.wait_for_gateway()
        # The gateway forwards agents' calls to the backend's servers, which exist only now (verl's vLLM
        # replicas pick their own ports), and resumes only below.
        await self.gateway.set_upstreams(self.backend.serve_urls, model=self.backend.served_model)
        await self.recover()
        await self.gateway.resume(model_version=self.backend.model_version)
        steps_run = 0
        while self.settings.total_steps is None or self.step < self.settings.total_steps:
            if not await self._run_step():
                break
            steps_run += 1
        await self._finish()
        return steps_run

    async def _run_step(self) -> bool:
        """One step; False when there is nothing left to train on."""
        step, started = self.step, time.monotonic()
        window = self.window
        window.begin_step(step=step)
        stale = window.apply_staleness_policy(step=step)
        if stale:
            await self._cancel(stale, reason=f"older than maxCarryOverAgeSteps at step {step}")
        await self._draw(step)
        if not window.active_groups:
            return False  # the data is used up and nothing is in flight
        while not window.ready_for_update():
            if self._data_exhausted() and not self._can_still_complete():
                return False
            await self._consume_completions()
        wait_started = time.monotonic()
        drain = await self.gateway.pause(
            reason=f"weight update, step {step}",
            retry_after_seconds=self.settings.retry_after_seconds,
            wait_seconds=self.settings.drain_timeout_seconds,
        )
        if not drain.drained:
            logger.warning(
                "step %d: %d model calls still in flight after %.0fs of draining; updating anyway",
                step,
                drain.inflight,
                self.settings.drain_timeout_seconds,
            )
        batch = window.take_update_batch(step=step)
        rows, counts = await self._rows_of(batch.consumed)
        update = await self._update(rows, step)
        summary = batch.summary.with_drain(
            inflight_at_pause=drain.inflight_at_pause, drain_seconds=drain.drain_seconds
        )
        consumed_ids = [rollout_id for group in batch.consumed for rollout_id in group.rollout_ids]
        metrics = {
            **summary.metrics(),
            **self._timing_metrics(consumed_ids),
            **counts.metrics(),
            **(update.as_dict() if update is not None else {}),
            "training/reward_mean": _mean([row.reward for row in rows]),
            "timing/step_seconds": time.monotonic() - started,
            "timing/update_phase_seconds": time.monotonic() - wait_started,
        }
        self.step = step + 1
        if self.step % self.settings.checkpoint_every_steps == 0:
            await self._save_checkpoint()
        await self.gateway.resume(model_version=self.backend.model_version)
        await self.gateway.delete_rollouts(consumed_ids)
        for rollout_id in consumed_ids:
            self._timings.pop(rollout_id, None)
        await self.gateway.put_summary(
            WindowSummary(
                step=step,
                metrics=metrics,
                carry_over_age_histogram={str(age): n for age, n in summary.carry_over_age_histogram.items()},
                active_groups=len(window.active_groups),
            )
        )
        self.sinks.log(step, metrics)
        self._count_failed_step(step, batch.consumed, n_rows=len(rows))
        logger.info(
            "step %d: reward %.3f, completed %d, carried %d (max age %d), drain %.3fs, step %.1fs",
            step,
            metrics["training/reward_mean"],
            summary.n_completed_rollouts,
            summary.n_new_carry_over_rollouts,
            summary.new_carry_over_age_max_steps,
            summary.proxy_drain_seconds,
            metrics["timing/step_seconds"],
        )
        return True

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
        leftover = list(self.window.active_groups)
        if leftover:
            await self._cancel(leftover, reason="the run finished")
        if self.settings.checkpoint_dir is not None and self._saved_step != self.step:
            # Saving sleeps the model servers, as in a step: pause and drain first.
            await self.gateway.pause(
                reason="final checkpoint",
                retry_after_seconds=self.settings.retry_after_seconds,
                wait_seconds=self.settings.drain_timeout_seconds,
            )
            await self._save_checkpoint()
        await self.gateway.resume(model_version=self.backend.model_version)

    async def _save_checkpoint(self) -> None:
        """A checkpoint of the current step, once: the last step's may already be saved by the step loop."""
        if self.settings.checkpoint_dir is None or self._saved_step == self.step:
            return
        position = self.prompts.position
        await save_checkpoint(
            self.settings.checkpoint_dir,
            self.backend,
            LoopState(step=self.step, data_epoch=position.epoch, data_offset=position.offset),
        )
        self._saved_step = self.step

    # -- pieces -------------------------------------------------------------------------------------------

    def _data_exhausted(self) -> bool:
        return self._first_epoch_only and self.prompts.position.epoch > 0

    def _can_still_complete(self) -> bool:
        """Whether waiting longer can make the window ready (groups with rollouts still running)."""
        return any(not group.is_complete for group in self.window.active_groups)

    async def _draw(self, step: int) -> None:
        creations: list[RolloutCreate] = []
        groups: list[tuple[str, list[str]]] = []
        for _ in range(self.window.groups_to_draw()):
            position = self.prompts.position
            if self._first_epoch_only and position.offset >= self.prompts.n_rows:
                break  # one pass over the data is drawn
            _, row = self.prompts.draw()
            group_id = f"s{step}-{uuid.uuid4().hex[:12]}"
            rollout_ids = [f"{group_id}-r{index}" for index in range(self.settings.window.rollout_n)]
            groups.append((group_id, rollout_ids))
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
        for group_id, rollout_ids in groups:
            self.window.add_group(group_id=group_id, rollout_ids=rollout_ids, step=step)

    async def _consume_completions(self) -> None:
        try:
            page = await self.gateway.completions(after=self._cursor, wait_seconds=30)
        except GatewayError as error:
            if error.status != 410:
                raise
            await self._resync()
            return
        self._cursor = page.cursor
        for entry in page.entries:
            self._timings[entry.rollout_id] = entry
            self.window.record_terminal(entry.rollout_id, entry.state)

    async def _resync(self) -> None:
        """The feed moved past our cursor: take terminal states from the rollout listing instead."""
        rollouts, self._cursor = await self.gateway.list_rollouts()
        for rollout in rollouts:
            if rollout.state.is_terminal:
                self.window.record_terminal(rollout.rollout_id, rollout.state)

    async def _cancel(self, groups: Sequence[Group], *, reason: str) -> None:
        for group in groups:
            for rollout_id in group.rollout_ids:
                if rollout_id in group.terminal_states:
                    continue
                try:
                    await self.gateway.transition(rollout_id, RolloutState.CANCELLED, message=reason)
                except GatewayError as error:
                    if error.status not in (404, 409):
                        raise
        logger.info("cancelled %d groups: %s", len(groups), reason)

    async def _rows_of(self, groups: Sequence[Group]) -> tuple[list[TrainingRow], AdapterCounts]:
        semaphore = asyncio.Semaphore(EVENT_FETCH_CONCURRENCY)

        async def fetch(rollout_id: str) -> dict[str, Any]:
            async with semaphore:
                return await self.gateway.rollout_events(rollout_id)

        rows: list[TrainingRow] = []
        counts: list[AdapterCounts] = []
        for group in groups:
            documents = await asyncio.gather(*(fetch(rollout_id) for rollout_id in group.rollout_ids))
            for document in documents:
                result = adapt_rollout(document, group_id=group.group_id, config=self.settings.adapter)
                rows += result.rows
                counts.append(result.counts)
        return rows, AdapterCounts.total(counts)

    async def _update(self, rows: list[TrainingRow], step: int) -> UpdateMetrics | None:
        if not rows:
            logger.warning("step %d: no trainable rows in the consumed groups; the update is skipped", step)
            return None
        await self.backend.sleep()
        try:
            return await self.backend.update(rows, step=step)
        finally:
            await self.backend.wake()

    def _timing_metrics(self, rollout_ids: Sequence[str]) -> dict[str, float]:
        entries = [self._timings[rid] for rid in rollout_ids if rid in self._timings]
        waits = [e.queue_wait_seconds for e in entries if e.queue_wait_seconds is not None]
        runs = [e.run_seconds for e in entries if e.run_seconds is not None]
        return {
            **spread("timing/rollout_queue_wait_seconds", waits),
            **spread("timing/rollout_run_seconds", runs),
        }


def _groups_of(rollouts: Sequence[RolloutView]) -> list[Group]:
    members: dict[str, list[RolloutView]] = defaultdict(list)
    for rollout in rollouts:
        members[rollout.group_id].append(rollout)
    groups = []
    for group_id, views in members.items():
        views.sort(key=lambda view: view.rollout_id)
        groups.append(
            Group(
                group_id=group_id,
                enqueued_step=min(view.step for view in views),
                rollout_ids=tuple(view.rollout_id for view in views),
                terminal_states={view.rollout_id: view.state for view in views if view.state.is_terminal},
            )
        )
    groups.sort(key=lambda group: (group.enqueued_step, group.group_id))
    return groups


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
