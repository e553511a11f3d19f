"""Rows from the real events → rows adapter, as verl's trajectory records, read by verl's own CPU code.

verl's GRPO step and its rollout correction run here on the padded batch exactly as verl's
`PPOTrainer._compute_advantage` builds it from TransferQueue (`DataProto(batch=fields.to_padded_tensor())`,
uid out of the tensors): what they compute from our rows is what they will compute on the GPU machine.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from verl.protocol import DataProto
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

from asyncrl.trainer.adapter import adapt_rollout
from asyncrl.trainer.backends.verl.backend import update_metrics
from asyncrl.trainer.backends.verl.batch import TOKEN_FIELDS, TrajectoryBatch, build_trajectory_batch
from asyncrl.trainer.rows import TrainingRow
from tests.trainer.backends.verl_support import verl_config
from tests.trainer.test_adapter import TRAJECTORY, TRANSITION, call, document

REWARDS = {"g_a": [1.0, 0.0, 0.5], "g_b": [0.2, 0.4, 0.4]}  # two groups of three rollouts


def agent_rows(config: Any) -> list[TrainingRow]:
    """Two model calls per rollout (a tool result between them), through the real adapter."""
    rows: list[TrainingRow] = []
    for group, rewards in REWARDS.items():
        for i, reward in enumerate(rewards):
            doc = document(
                call([1, 2], [3, 4], started_at=1.0, logprobs=[-0.1, -0.2]),
                call([1, 2, 3, 4, 9], [5, 6, 7], started_at=2.0, logprobs=[-0.3, -0.4, -0.5]),
                rollout_id=f"{group}-r{i}",
                group_id=group,
                reward=reward,
            )
            rows += adapt_rollout(doc, group_id=group, config=config).rows
    return rows


def padded(batch: TrajectoryBatch) -> DataProto:
    """What verl's `_compute_advantage` makes of the records it reads back from TransferQueue."""
    fields = batch.fields().to_padded_tensor()
    uid = fields.pop("uid")
    data = DataProto(batch=fields)
    data.non_tensor_batch["uid"] = np.array(list(uid.tolist()), dtype=object)
    data.batch["token_level_scores"] = data.batch["rm_scores"]
    data.batch["token_level_rewards"] = data.batch["rm_scores"]
    return data


def expected_advantages(rewards: list[float]) -> list[float]:
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))  # torch.std: unbiased
    return [(r - mean) / (std + 1e-6) for r in rewards]


def test_trajectory_rows_become_records_keyed_uid_session_index_with_verls_fields() -> None:
    rows = agent_rows(TRAJECTORY)
    batch = build_trajectory_batch(rows, step=4)
    assert batch.keys == [f"{group}_{i}_0" for group in REWARDS for i in range(3)]
    first = batch.records[0]
    assert first["prompts"].tolist() == [1, 2]
    assert first["responses"].tolist() == [3, 4, 9, 5, 6, 7]
    assert first["response_mask"].tolist() == [1, 1, 0, 1, 1, 1]  # the tool output (9) is context only
    assert first["loss_mask"].tolist() == first["response_mask"].tolist()
    assert first["rollout_log_probs"].tolist() == pytest.approx([-0.1, -0.2, 0.0, -0.3, -0.4, -0.5])
    assert first["input_ids"].tolist() == [1, 2, 3, 4, 9, 5, 6, 7]
    assert first["position_ids"].tolist() == list(range(8))
    assert first["rm_scores"].tolist() == [0.0] * 5 + [1.0]  # the reward on the last response token
    assert [record["uid"] for record in batch.records] == ["g_a"] * 3 + ["g_b"] * 3
    assert batch.tags[0] == {
        "status": "success",
        "prompt_len": 2,
        "response_len": 6,
        "seq_len": 8,
        "global_steps": 4,
        "min_global_steps": 1,  # the calls' model version
        "max_global_steps": 1,
    }


def test_fields_are_jagged_per_token_tensors_that_pad_to_the_longest_row() -> None:
    rows = agent_rows(TRANSITION)  # two rows per rollout, of different lengths
    batch = build_trajectory_batch(rows, step=0)
    fields = batch.fields()
    assert fields.batch_size == torch.Size([len(rows)])
    for name in TOKEN_FIELDS:
        assert fields[name].is_nested, name
    data = padded(batch)
    assert data.batch["prompts"].shape == (12, 5)
    assert data.batch["responses"].shape == (12, 3)
    assert data.batch["response_mask"].tolist()[:2] == [[1, 1, 0], [1, 1, 1]]  # padding is mask 0
    assert data.batch["rollout_log_probs"].dtype == torch.float32
    assert list(data.non_tensor_batch["uid"]) == ["g_a"] * 6 + ["g_b"] * 6


@pytest.mark.parametrize("config", [TRAJECTORY, TRANSITION], ids=["trajectory", "transition"])
def test_verls_grpo_gives_each_rollout_its_group_advantage_on_every_trained_token(config: Any) -> None:
    rows = agent_rows(config)
    batch = build_trajectory_batch(rows, step=0)
    data = compute_advantage_for_multi_trajectories(
        padded(batch), batch_keys=batch.keys, adv_estimator="grpo"
    )
    advantages = data.batch["advantages"]
    mask = data.batch["response_mask"]
    expected = {}
    for group, rewards in REWARDS.items():
        for i, value in enumerate(expected_advantages(rewards)):
            expected[f"{group}-r{i}"] = value
    for index, row in enumerate(rows):
        trained = advantages[index][mask[index] == 1]
        assert trained.tolist() == pytest.approx([expected[row.rollout_id]] * len(trained), abs=1e-4)
        assert advantages[index][mask[index] == 0].abs().sum() == 0


def test_verls_rollout_correction_reads_our_log_probs_and_names_the_metrics_we_report() -> None:
    config = verl_config(rolloutCorrection={"mode": "Token", "threshold": 2.0})
    rows = agent_rows(TRAJECTORY)
    data = padded(build_trajectory_batch(rows, step=0))
    # The trainer's current log-probs: higher than the rollout's on some tokens, so some weights exceed 2.
    data.batch["old_log_probs"] = data.batch["rollout_log_probs"] + torch.linspace(-0.5, 1.5, 6)
    correction = config.algorithm.rollout_correction
    corrected, metrics = compute_rollout_correction_and_add_to_batch(data, correction)
    weights = corrected.batch["rollout_is_weights"][corrected.batch["response_mask"] == 1]
    assert weights.max().item() <= 2.0 + 1e-6  # truncated at the run's threshold
    assert weights.min().item() == pytest.approx(math.exp(-0.5), rel=1e-4)
    reported = update_metrics(rows, metrics, step=3, seconds=2.0)
    assert reported.importance_weight_max == pytest.approx(metrics["rollout_corr/rollout_is_max"])
    assert reported.importance_weight_mean == pytest.approx(metrics["rollout_corr/rollout_is_mean"])
    assert reported.importance_weight_min == pytest.approx(metrics["rollout_corr/rollout_is_min"])
    assert reported.model_version == 4
    assert reported.rows == 6
    assert reported.trained_tokens == 6 * 5
    assert reported.total_tokens == 6 * 8
    assert reported.reward_mean == pytest.approx(sum(sum(r) for r in REWARDS.values()) / 6)
    assert "rollout_corr/rollout_is_mean" in reported.as_dict()


def test_actor_metrics_map_to_the_update_metrics() -> None:
    rows = agent_rows(TRAJECTORY)
    verl_metrics = {
        "actor/pg_loss": 0.25,
        "actor/grad_norm": 1.5,
        "actor/pg_clipfrac": 0.1,
        "actor/ppo_kl": 0.02,
    }
    reported = update_metrics(rows, {**verl_metrics, "a/text": "not a number"}, step=0, seconds=1.0)
    got = (reported.loss, reported.grad_norm, reported.clip_fraction, reported.ppo_kl)
    assert got == (0.25, 1.5, 0.1, 0.02)
    assert reported.importance_weight_mean is None  # rollout correction off: no weights
    assert "a/text" not in reported.extra


def test_rows_with_nothing_to_train_on_are_refused() -> None:
    (row,) = agent_rows(TRAJECTORY)[:1]
    untrained = TrainingRow(
        rollout_id="r",
        group_id="g",
        prompt_token_ids=(1,),
        response_token_ids=(2, 3),
        response_mask=(0, 0),
        rollout_log_probs=(0.0, 0.0),
        reward=1.0,
        model_version=0,
    )
    with pytest.raises(ValueError, match="nothing to train on"):
        build_trajectory_batch([untrained], step=0)
    with pytest.raises(ValueError, match="at least one row"):
        build_trajectory_batch([], step=0)
    assert len(build_trajectory_batch([row, untrained], step=0)) == 2  # fine beside a trainable row
