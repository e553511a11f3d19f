"""What the step loop needs from a training backend, and nothing more.

The trainer's step loop (window, gateway pause/drain, metrics) is the same for every backend; only the four
things below differ between the CPU reference backend and the verl GPU backend:

1. OpenAI-compatible inference endpoints that the gateway forwards model calls to (`serve_urls`, registered
   with the gateway at start with the name they serve, `served_model`), serving weights whose training step
   is `model_version`;
2. `sleep()` / `wake()` around an update, so collocated inference gives the accelerator memory back
   (vLLM's sleep mode on GPU; no-ops on CPU);
3. `update()`: one optimizer step of GRPO on the rows of complete groups;
4. checkpoints of weights, optimizer and step.

This module imports no ML library, so the operator and the gateway can name these types without torch.

Versions and steps: steps are 0-based. The weights served before any update are version 0; `update(rows,
step=s)` leaves version `s + 1` served. A checkpoint's `step` is the next step to run, which is also the
version of the saved weights.

Call order in one step of the loop (the gateway is paused and drained first):
`await backend.sleep()` → `await backend.update(rows, step=s)` → `await backend.wake()` → resume the gateway
with `model_version=backend.model_version`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from asyncrl import metric_names as names
from asyncrl.trainer.rows import TrainingRow


@dataclass(frozen=True)
class UpdateMetrics:
    """What one update did, for W&B, Prometheus and the step log.

    Importance weights are the rollout-correction weights the loss was multiplied by, over trained tokens
    only; they are None when rollout correction is off.
    """

    step: int  # the step this update ran as
    model_version: int  # the version served after the update (step + 1)
    loss: float  # the policy loss, mean over the mini-batch steps of this update
    grad_norm: float  # gradient norm before clipping, mean over the mini-batch steps
    reward_mean: float  # over rows
    reward_std: float  # over rows (population std)
    rows: int
    trained_tokens: int  # response tokens with mask 1
    total_tokens: int  # prompt + response tokens of all rows
    seconds: float  # wall time of the update, from rows to new weights served
    tokens_per_second: float  # total_tokens / seconds
    clip_fraction: float  # fraction of trained tokens whose PPO ratio was clipped
    ppo_kl: float  # approx. KL(old policy || current) over trained tokens, mean over mini-batch steps
    importance_weight_mean: float | None = None
    importance_weight_max: float | None = None
    importance_weight_min: float | None = None
    extra: Mapping[str, float] = field(default_factory=dict)  # the algorithm library's own metrics, verbatim

    def as_dict(self) -> dict[str, float]:
        """Flat metric names for W&B and Prometheus: verl's where verl logs the same quantity
        (`actor/pg_loss`, ...), else `training/update/*`; `extra` keeps its own names (`rollout_corr/...`,
        verl's `actor/...`).

        Not logged here: `reward_mean` (the step loop logs it over the same rows as `critic/score/mean`) and
        the importance weights (verl's `rollout_corr/rollout_is_*` in `extra` are the same weights).
        """
        values: dict[str, float] = {
            names.UPDATE + "step": float(self.step),
            names.UPDATE + "model_version": float(self.model_version),
            names.ACTOR_PG_LOSS: float(self.loss),
            names.ACTOR_GRAD_NORM: float(self.grad_norm),
            names.UPDATE + "reward_std": float(self.reward_std),
            names.UPDATE + "rows": float(self.rows),
            names.UPDATE + "trained_tokens": float(self.trained_tokens),
            names.TOTAL_NUM_TOKENS: float(self.total_tokens),
            names.UPDATE + "seconds": float(self.seconds),
            names.UPDATE + "tokens_per_second": float(self.tokens_per_second),
            names.ACTOR_PG_CLIPFRAC: float(self.clip_fraction),
            names.ACTOR_PPO_KL: float(self.ppo_kl),
        }
        values.update(self.extra)  # with the Verl backend, verl's actor/* are the values above, once
        return values


class TrainerBackend(Protocol):
    """A policy that serves an OpenAI-compatible endpoint and trains on rows, in one (collocated) process.

    `start()` must return with the endpoint accepting requests; `stop()` releases the port and any threads.
    Every other method needs a started backend.
    """

    @property
    def serve_urls(self) -> tuple[str, ...]:
        """Base URLs (without `/v1`) of the inference servers: the gateway's upstreams, one per replica."""
        ...

    @property
    def served_model(self) -> str:
        """The model name those servers answer to; the gateway forwards it whatever name agents send."""
        ...

    @property
    def model_version(self) -> int:
        """The training step of the weights being served: 0 before any update, `s + 1` after step `s`."""
        ...

    async def start(self) -> None:
        """Build or load the policy and start serving it."""
        ...

    async def stop(self) -> None:
        """Stop serving and release resources; idempotent."""
        ...

    async def sleep(self) -> None:
        """Free inference memory for the update (collocated GPUs); callers drain the gateway first."""
        ...

    async def wake(self) -> None:
        """Serve again, with whatever weights the last update left; idempotent."""
        ...

    async def update(self, rows: Sequence[TrainingRow], *, step: int) -> UpdateMetrics:
        """Train on the rows of complete groups (GRPO groups by `row.group_id`); then serve `step + 1`.

        Raises ValueError for rows the backend cannot train on (no trained token at all, longer than the
        model's context, token ids outside the vocabulary).
        """
        ...

    async def save_checkpoint(self, path: Path, *, step: int) -> None:
        """Write weights, optimizer state and `step` (the next step to run) to the directory `path`.

        Atomic: `path` holds the old checkpoint or the new one, never a partial one.
        """
        ...

    async def load_checkpoint(self, path: Path) -> int:
        """Restore weights and optimizer state from `path`, serve them, and return the saved step."""
        ...


__all__ = ["TrainerBackend", "TrainingRow", "UpdateMetrics"]
