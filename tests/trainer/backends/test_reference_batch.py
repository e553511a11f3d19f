"""Rows → verl's padded layout: prompts padded left, responses right, the reward on the last trained token."""

from __future__ import annotations

import pytest
import torch

from asyncrl.trainer.backends.reference import ModelConfig, build_policy_model
from asyncrl.trainer.backends.reference.batch import pad_rows
from asyncrl.trainer.backends.reference.grpo import response_log_probs
from tests.trainer.backends.support import row

PAD = 256


def test_prompts_are_left_padded_and_responses_right_padded() -> None:
    batch = pad_rows(
        [row(prompt=[1, 2, 3], response=[4], reward=1.0), row(prompt=[5], response=[6, 7, 8], reward=0.0)],
        pad_token_id=PAD,
        vocab_size=259,
        max_model_len=64,
    )
    assert batch.prompt_length == 3
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, PAD, PAD], [PAD, PAD, 5, 6, 7, 8]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1]]
    assert batch.responses.tolist() == [[4, PAD, PAD], [6, 7, 8]]
    assert batch.response_mask.tolist() == [[1, 0, 0], [1, 1, 1]]


def test_position_ids_count_only_real_tokens() -> None:
    batch = pad_rows(
        [row(prompt=[1, 2, 3], response=[4], reward=1.0), row(prompt=[5], response=[6, 7], reward=0.0)],
        pad_token_id=PAD,
        vocab_size=259,
        max_model_len=64,
    )
    assert batch.position_ids[1, 2:].tolist() == [0, 1, 2]
    assert batch.position_ids[0, :4].tolist() == [0, 1, 2, 3]


def test_reward_sits_on_the_last_trained_token_not_on_trailing_context() -> None:
    tool_output_after = row(prompt=[1], response=[2, 3, 4, 5], mask=[1, 1, 0, 0], reward=0.5)
    batch = pad_rows([tool_output_after], pad_token_id=PAD, vocab_size=259, max_model_len=64)
    assert batch.token_level_rewards.tolist() == [[0.0, 0.5, 0.0, 0.0]]
    assert batch.response_mask.tolist() == [[1, 1, 0, 0]]


def test_left_padding_does_not_change_a_rows_log_probs() -> None:
    model = build_policy_model(ModelConfig(), vocab_size=259)
    short = row(prompt=[10, 11], response=[12, 13, 14], reward=1.0)
    long = row(prompt=list(range(40, 60)), response=[15], reward=0.0)
    alone = pad_rows([short], pad_token_id=PAD, vocab_size=259, max_model_len=64)
    together = pad_rows([short, long], pad_token_id=PAD, vocab_size=259, max_model_len=64)
    with torch.no_grad():
        expected = response_log_probs(model, alone)[0]
        padded = response_log_probs(model, together)[0]
    torch.testing.assert_close(padded, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([], "no rows"),
        ([row(prompt=[], response=[1], reward=0.0)], "empty prompt"),
        ([row(prompt=[1] * 60, response=[1] * 10, reward=0.0)], "exceed the model's context of 64"),
        ([row(prompt=[1], response=[300], reward=0.0)], "token id 300 is outside"),
        ([row(prompt=[1], response=[2], mask=[0], reward=0.0)], "has a trained token"),
        ([row(prompt=[1], response=[2], mask=[2], reward=0.0)], "only 0 and 1"),
    ],
)
def test_rows_the_model_cannot_take_are_refused_with_the_reason(rows: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pad_rows(rows, pad_token_id=PAD, vocab_size=259, max_model_len=64)
