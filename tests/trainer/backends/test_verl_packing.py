"""The verl backend's micro-batches: bounded by the token budget, and packed rows that keep their own logits.

verl's dynamic batching (asyncrl's default) counts each micro-batch's real tokens against
`ppo_max_token_len_per_gpu`. Without remove-padding the model then runs on rows x longest row positions, which
the budget does not bound: on agent rows (long trajectories, short transitions, verl's padding rows) that was
up to 7.5 times the budget, tens of GiB of logits with a 152k vocabulary. With remove-padding the rows are
packed into one sequence of exactly the real tokens. These tests run verl 0.9.1's own code on CPU:
`rearrange_micro_batches` for the micro-batches, and its FSDP engine's input packing through a transformers
model with SDPA (the trainer image's attention) for the logits.
"""

from __future__ import annotations

import random

import pytest
import torch
from tensordict import TensorDict

from asyncrl.testing.verl_packing import max_logit_gap
from tests.trainer.backends.verl_support import verl_config

pytestmark = pytest.mark.slow


def agent_update_rows(seed: int, rollouts: int = 64) -> list[int]:
    """Row lengths of one GPU's share of an update: long trajectory rows, short transition rows, padding."""
    rng = random.Random(seed)
    lengths: list[int] = []
    for _ in range(rollouts):
        kind = rng.random()
        if kind < 0.4:
            lengths.append(rng.randint(3000, 8192))  # a whole multi-turn trajectory, up to 4096 + 4096
        elif kind < 0.9:
            lengths += [rng.randint(200, 900) for _ in range(rng.randint(1, 4))]  # transition-level rows
        else:
            lengths.append(128)  # a short row, as verl's padding rows and one-turn answers are
    return lengths


def model_positions(lengths: list[int], budget: int, *, packed: bool) -> int:
    """The most positions the model runs on in one micro-batch, as verl builds them (padded or packed)."""
    from verl.utils.seqlen_balancing import rearrange_micro_batches

    ids = torch.nested.as_nested_tensor(
        [torch.ones(n, dtype=torch.int64) for n in lengths], layout=torch.jagged
    )
    _, partitions = rearrange_micro_batches(TensorDict({"input_ids": ids}, batch_size=[len(lengths)]), budget)
    if packed:
        return max(sum(lengths[i] for i in part) for part in partitions)
    return max(len(part) * max(lengths[i] for i in part) for part in partitions)


def test_the_default_configurations_micro_batches_stay_within_the_token_budget() -> None:
    config = verl_config()
    actor = config.actor_rollout_ref.actor
    packed = bool(config.actor_rollout_ref.model.use_remove_padding)
    budgets = {
        "update": actor.ppo_max_token_len_per_gpu,
        "rollout log-probs": config.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu,
        "ref log-probs": config.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu,
    }
    assert actor.use_dynamic_bsz is True
    for name, budget in budgets.items():
        worst = max(model_positions(agent_update_rows(seed), budget, packed=packed) for seed in range(40))
        assert worst <= budget, f"{name}: a micro-batch runs the model on {worst} positions (budget {budget})"
    # What the same rows cost padded (the previous default): far beyond the budget.
    padded = max(model_positions(agent_update_rows(seed), 16384, packed=False) for seed in range(40))
    assert padded > 4 * 16384


def test_packed_rows_get_the_logits_each_row_gets_alone() -> None:
    assert max_logit_gap() < 1e-4


def test_the_gap_is_measurable_when_rows_do_see_each_other() -> None:
    """The check can fail: with the causal mask built for one sequence (eager, no packed-row detection
    in the model), rows packed after others attend to them and their logits move."""
    from asyncrl.testing import verl_packing

    model = verl_packing.tiny_llama()
    generator = torch.Generator().manual_seed(1)
    rows = [torch.randint(0, 512, (n,), generator=generator) for n in (9, 17)]
    joined = torch.cat(rows)[None]
    with torch.no_grad():
        one_sequence = model(input_ids=joined, use_cache=False).logits[0]  # positions run on, no restart
        alone = torch.cat([model(input_ids=row[None], use_cache=False).logits[0] for row in rows])
    assert float((one_sequence - alone).abs().max()) > 1e-2
