"""One GRPO update with verl's own algorithm code, on a Hugging Face model on CPU.

The math is not reimplemented here: advantages come from `core_algos.compute_grpo_outcome_advantage`, the
rollout importance-sampling weights from `rollout_corr_helper.compute_rollout_correction_and_rejection_mask`,
and the loss from `core_algos.get_policy_loss_fn("vanilla")` (PPO-clip), so the reference backend trains as
the verl backend does and a CPU test of it pins verl's behaviour too. What this module adds is verl's
actor loop in miniature, in verl's decoupled (non-bypass) mode:

1. `old_log_probs`: the current policy's log-probs of the response tokens, recomputed before any step;
2. importance weights `min(exp(old - rollout), threshold)` per token (or per sequence) for the staleness
   between the policy that sampled (`rollout_log_probs`, recorded by the gateway) and the current one, and
   optionally verl's rejection mask (`rollout_rs`), which drops tokens or sequences from the loss;
3. GRPO advantages over each group's rows (`index` = group id);
4. `ppo_epochs` passes of `mini_batches` AdamW steps on the PPO-clip loss times the importance weights.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
from verl.workers.config import ActorConfig

from asyncrl.trainer.backends.reference.batch import PaddedBatch
from asyncrl.trainer.backends.reference.config import UpdateConfig

logger = logging.getLogger(__name__)

POLICY_LOSS = "vanilla"  # verl's PPO-clip policy loss (with dual clip for negative advantages)


@dataclass(frozen=True)
class UpdateStats:
    """What one update measured; the backend adds step, timing and row counts."""

    loss: float
    grad_norm: float
    clip_fraction: float
    ppo_kl: float
    optimizer_steps: int
    importance_weight_mean: float | None
    importance_weight_max: float | None
    importance_weight_min: float | None
    extra: dict[str, float] = field(default_factory=dict)


def actor_config(config: UpdateConfig) -> ActorConfig:
    """verl's actor config carrying our clip settings (the policy loss reads them from here)."""
    return ActorConfig(
        strategy="fsdp",  # required by the dataclass; unused by the loss functions
        rollout_n=1,  # likewise; GRPO groups come from `index`, not from a fixed n
        use_dynamic_bsz=True,  # skips micro-batch-size checks that only concern the distributed actor
        use_torch_compile=False,
        clip_ratio=config.clip_ratio_low,
        clip_ratio_low=config.clip_ratio_low,
        clip_ratio_high=config.clip_ratio_high,
        clip_ratio_c=config.clip_ratio_c,
        loss_agg_mode=config.loss_agg_mode,
    )


def response_log_probs(model: PreTrainedModel, batch: PaddedBatch) -> torch.Tensor:
    """[B, R] log-probs of each response token under `model` (gradients flow unless disabled)."""
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits
    start = batch.prompt_length - 1
    predicting = logits[:, start : start + batch.responses.shape[1]].float()
    log_probs = torch.log_softmax(predicting, dim=-1)
    return log_probs.gather(-1, batch.responses.unsqueeze(-1)).squeeze(-1)


def grpo_update(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    batch: PaddedBatch,
    *,
    config: UpdateConfig,
    generator: torch.Generator | None = None,
) -> UpdateStats:
    """Train `model` in place on `batch`; `generator` shuffles rows into mini-batches."""
    model.train()
    with torch.no_grad():
        old_log_probs = response_log_probs(model, batch) * batch.response_mask
    advantages, _returns = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=batch.token_level_rewards,
        response_mask=batch.response_mask,
        index=batch.group_index,
        norm_adv_by_std_in_grpo=config.norm_adv_by_std_in_grpo,
    )
    weights_proto, response_mask, extra = compute_rollout_correction_and_rejection_mask(
        old_log_prob=old_log_probs,
        rollout_log_prob=batch.rollout_log_probs,
        response_mask=batch.response_mask,
        rollout_is=config.rollout_is,
        rollout_is_threshold=config.rollout_is_threshold,
        rollout_rs=config.rollout_rs,
        rollout_rs_threshold=config.rollout_rs_threshold,
    )
    weights = None if weights_proto is None else weights_proto.batch["rollout_is_weights"]
    loss_fn = core_algos.get_policy_loss_fn(POLICY_LOSS)  # type: ignore[no-untyped-call]
    loss_config = actor_config(config)

    losses: list[float] = []
    grad_norms: list[float] = []
    per_step: list[dict[str, Any]] = []
    for _epoch in range(config.ppo_epochs):
        for rows in _mini_batches(len(batch.group_index), config.mini_batches, generator):
            mask = response_mask[rows]
            if not mask.any():
                continue  # verl's token-mean would divide by zero; nothing to learn from these rows
            log_probs = response_log_probs(model, batch.select(rows))
            loss, metrics = loss_fn(
                old_log_prob=old_log_probs[rows],
                log_prob=log_probs,
                advantages=advantages[rows],
                response_mask=mask,
                loss_agg_mode=config.loss_agg_mode,
                config=loss_config,
                rollout_is_weights=None if weights is None else weights[rows],
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            if torch.isfinite(grad_norm):
                optimizer.step()
            else:  # as verl's actor does: skip the step rather than poison the weights
                logger.warning("skipped an optimizer step: gradient norm is %s", float(grad_norm))
            optimizer.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            grad_norms.append(float(grad_norm))
            per_step.append(metrics)

    trained = response_mask.bool()  # after rejection: masked tokens took no part in the loss
    used = weights[trained] if weights is not None and trained.any() else None
    return UpdateStats(
        loss=_mean(losses),
        grad_norm=_mean(grad_norms),
        clip_fraction=_mean([float(m["actor/pg_clipfrac"]) for m in per_step]),
        ppo_kl=_mean([float(m["actor/ppo_kl"]) for m in per_step]),
        optimizer_steps=len(losses),
        importance_weight_mean=None if used is None else float(used.mean()),
        importance_weight_max=None if used is None else float(used.max()),
        importance_weight_min=None if used is None else float(used.min()),
        extra={key: float(value) for key, value in extra.items()},
    )


def _mini_batches(rows: int, count: int, generator: torch.Generator | None) -> list[torch.Tensor]:
    order = torch.randperm(rows, generator=generator) if count > 1 else torch.arange(rows)
    return [part for part in torch.tensor_split(order, min(count, rows)) if len(part)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
