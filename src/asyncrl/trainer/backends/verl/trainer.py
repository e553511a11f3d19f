"""verl's colocate_async trainer, driven by asyncrl's window instead of verl's dataloader and replay buffer.

`PPOTrainerColocateAsync` (verl/trainer/ppo/v1/) builds everything a collocated async step needs: the
FSDP actor worker group, the vLLM replicas on the same GPUs (`LLMServerManager`) and the
`CheckpointEngineManager` that aborts, sleeps, updates and resumes them. Its `fit()` pulls prompts from a
dataset and samples trajectories from its replay buffer; asyncrl has both already (the prompts file, the
window over the gateway's rollouts), so this subclass keeps verl's setup and its per-batch PPO pipeline, and
replaces only the sampling:

- no dataset is loaded (`_init_dataloader`): the config carries the schedule's horizon (totalSteps, or one
  pass over the prompts);
- `train_on(batch)` runs verl's own pipeline on a batch that asyncrl put into TransferQueue: balance, old
  log-probs, reference log-probs, advantages with rollout correction, the actor update.

The abort/sleep before an update and the weight update/resume after it stay verl's (`checkpoint_manager`);
`VerlBackend` calls them around `train_on`, after the gateway has been paused and drained.
"""

from __future__ import annotations

import logging
from typing import Any

from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.trainer_colocate_async import PPOTrainerColocateAsync

logger = logging.getLogger(__name__)


class WindowDrivenTrainer(PPOTrainerColocateAsync):
    """verl's collocated async trainer with asyncrl's window as its only source of samples."""

    def _init_dataloader(self) -> None:
        # The LR schedule's horizon comes with the config (config.schedule_horizon: spec.totalSteps, or one
        # pass over the prompts; verlOverrides may set it): no dataset here to derive it from.
        horizon = int(self.config.actor_rollout_ref.actor.optim.get("total_training_steps") or -1)
        if horizon < 1:
            raise ValueError(
                "the learning-rate schedule has no horizon: set spec.totalSteps, or "
                "actor_rollout_ref.actor.optim.total_training_steps in spec.trainer.verlOverrides"
            )
        configured = self.config.trainer.get("total_training_steps")
        self.total_training_steps = int(configured) if configured else horizon
        self.steps_per_epoch = self.total_training_steps
        self.train_dataset = self.val_dataset = None
        self.train_dataloader = self.val_dataloader = None
        self.train_dataloader_it = None
        logger.info(
            "verl trainer without a dataset: asyncrl's window supplies the batches; LR schedule: %d updates",
            horizon,
        )

    def train_on(self, batch: KVBatchMeta, *, step: int) -> dict[str, Any]:
        """verl's PPO pipeline on `batch` (in TransferQueue) as global step `step + 1`; its metrics."""
        self.global_steps = step + 1  # verl counts from 1; asyncrl's step s trains into version s + 1
        metrics: dict[str, Any] = {}
        batch = self._balance_batch(batch, metrics=metrics)
        batch = self._compute_old_log_prob(batch, metrics=metrics)
        if self.use_reference_policy:
            batch = self._compute_ref_log_prob(batch, metrics=metrics)
        if self.use_critic:
            batch = self._compute_values(batch, metrics=metrics)
        batch = self._compute_advantage(batch, metrics=metrics)
        if self.use_critic:
            batch = self._update_critic(batch, metrics=metrics)
        self._update_actor(batch, metrics=metrics)
        return metrics
