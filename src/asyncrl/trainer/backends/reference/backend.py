"""The reference backend: the `TrainerBackend` that runs on a laptop or in CI, without a GPU.

It collocates, as the verl backend does on GPUs, a policy that serves agents (through the gateway) and the
trainer that updates it: one process, one model, an inference server on the trainer's event loop. Updates
run in a worker thread (the loop keeps serving and answering the gateway) and publish a frozen copy of the
new weights when they are done. `sleep()` and `wake()` have nothing to free on CPU and do nothing.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from asyncrl.trainer.backends import TrainerBackend, UpdateMetrics
from asyncrl.trainer.backends.reference import checkpoint
from asyncrl.trainer.backends.reference.batch import pad_rows
from asyncrl.trainer.backends.reference.config import ReferenceBackendConfig
from asyncrl.trainer.backends.reference.grpo import grpo_update
from asyncrl.trainer.backends.reference.model import build_policy_model, freeze_for_serving
from asyncrl.trainer.backends.reference.server import InferenceServer
from asyncrl.trainer.backends.reference.tokenizer import build_tokenizer
from asyncrl.trainer.rows import TrainingRow

logger = logging.getLogger(__name__)


class ReferenceBackend:
    """A tiny causal LM trained with verl's GRPO on CPU and served over OpenAI-compatible HTTP."""

    def __init__(self, config: ReferenceBackendConfig | None = None) -> None:
        self.config = config or ReferenceBackendConfig()
        if self.config.torch_threads is not None:
            torch.set_num_threads(self.config.torch_threads)
        self.tokenizer: PreTrainedTokenizerFast = build_tokenizer()
        self.model: LlamaForCausalLM = build_policy_model(self.config.model, vocab_size=len(self.tokenizer))
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=self.config.update.learning_rate,
            weight_decay=self.config.update.weight_decay,
        )
        self._shuffle = torch.Generator().manual_seed(self.config.model.seed)
        self._training = threading.Lock()  # one update or checkpoint at a time touches the weights
        self.server = InferenceServer(
            config=self.config.server,
            tokenizer=self.tokenizer,
            max_model_len=self.config.model.max_model_len,
            policy=freeze_for_serving(self.model, version=0),
        )

    @property
    def serve_urls(self) -> tuple[str, ...]:
        return (self.config.server.url or self.server.url,)

    @property
    def served_model(self) -> str:
        return self.config.server.served_model_name

    @property
    def model_version(self) -> int:
        return self.server.policy.version

    async def start(self) -> None:
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop()

    async def sleep(self) -> None:
        """Nothing to free on CPU: the served copy is small and the trainer never waits for memory."""

    async def wake(self) -> None:
        """Nothing to restore on CPU; the update already published the new weights."""

    async def update(self, rows: Sequence[TrainingRow], *, step: int) -> UpdateMetrics:
        return await asyncio.to_thread(self.update_blocking, list(rows), step=step)

    async def save_checkpoint(self, path: Path, *, step: int) -> None:
        await asyncio.to_thread(self._save_blocking, Path(path), step)

    async def load_checkpoint(self, path: Path) -> int:
        return await asyncio.to_thread(self._load_blocking, Path(path))

    def update_blocking(self, rows: Sequence[TrainingRow], *, step: int) -> UpdateMetrics:
        """`update` without the event loop, for scripts and tests that own no loop."""
        started = time.perf_counter()
        batch = pad_rows(
            rows,
            pad_token_id=int(self.tokenizer.pad_token_id),
            vocab_size=len(self.tokenizer),
            max_model_len=self.config.model.max_model_len,
        )
        with self._training:
            stats = grpo_update(
                self.model, self.optimizer, batch, config=self.config.update, generator=self._shuffle
            )
            self.server.publish(freeze_for_serving(self.model, version=step + 1))
        seconds = time.perf_counter() - started
        rewards = [row.reward for row in rows]
        total_tokens = sum(len(row.prompt_token_ids) + len(row.response_token_ids) for row in rows)
        metrics = UpdateMetrics(
            step=step,
            model_version=step + 1,
            loss=stats.loss,
            grad_norm=stats.grad_norm,
            reward_mean=statistics.fmean(rewards),
            reward_std=statistics.pstdev(rewards),
            rows=len(rows),
            trained_tokens=int(batch.response_mask.sum()),
            total_tokens=total_tokens,
            seconds=seconds,
            tokens_per_second=total_tokens / seconds if seconds > 0 else 0.0,
            clip_fraction=stats.clip_fraction,
            ppo_kl=stats.ppo_kl,
            importance_weight_mean=stats.importance_weight_mean,
            importance_weight_max=stats.importance_weight_max,
            importance_weight_min=stats.importance_weight_min,
            extra=stats.extra,
        )
        logger.info(
            "step %d: loss %.4f, reward %.3f, %d rows, %.0f tokens/s",
            step,
            metrics.loss,
            metrics.reward_mean,
            metrics.rows,
            metrics.tokens_per_second,
        )
        return metrics

    def _save_blocking(self, path: Path, step: int) -> None:
        with self._training:
            checkpoint.save_checkpoint(
                path, model=self.model, optimizer=self.optimizer, step=step, model_config=self.config.model
            )

    def _load_blocking(self, path: Path) -> int:
        with self._training:
            step = checkpoint.load_checkpoint(
                path, model=self.model, optimizer=self.optimizer, model_config=self.config.model
            )
            self.server.publish(freeze_for_serving(self.model, version=step))
        return step


if TYPE_CHECKING:  # mypy proves the protocol is implemented
    _conforms: TrainerBackend = ReferenceBackend()
