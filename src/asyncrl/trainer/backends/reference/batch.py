"""Training rows → padded tensors in verl's layout.

verl's actor works on `prompts` left-padded to one length P and `responses` right-padded to one length R,
concatenated into `input_ids` of width P + R, with `response_mask`, `rollout_log_probs` and
`token_level_rewards` of width R. Left padding puts every prompt's last token at column P - 1, so the logits
that predict response token j sit at column P - 1 + j for every row. Position ids count real tokens only,
so a left-padded row sees the same positions as it did when it was sampled alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from asyncrl.trainer.rows import TrainingRow


@dataclass(frozen=True)
class PaddedBatch:
    """Rows as tensors; B rows, P prompt columns, R response columns."""

    input_ids: torch.Tensor  # [B, P + R] long; pad positions hold pad_token_id
    attention_mask: torch.Tensor  # [B, P + R] long; 1 on real tokens
    position_ids: torch.Tensor  # [B, P + R] long; 0 at each row's first real token
    response_mask: torch.Tensor  # [B, R] float; 1 on trained tokens (row mask 1), 0 on context and padding
    rollout_log_probs: torch.Tensor  # [B, R] float; behaviour log-probs, 0 on padding
    token_level_rewards: torch.Tensor  # [B, R] float; the row's reward on its last trained token
    group_index: npt.NDArray[np.object_]  # [B] group ids: GRPO's `index`
    prompt_length: int  # P

    @property
    def responses(self) -> torch.Tensor:
        """[B, R] the response token ids (padding included)."""
        return self.input_ids[:, self.prompt_length :]

    def select(self, indices: torch.Tensor) -> PaddedBatch:
        """The rows at `indices` (a mini-batch), keeping the padded widths."""
        return PaddedBatch(
            input_ids=self.input_ids[indices],
            attention_mask=self.attention_mask[indices],
            position_ids=self.position_ids[indices],
            response_mask=self.response_mask[indices],
            rollout_log_probs=self.rollout_log_probs[indices],
            token_level_rewards=self.token_level_rewards[indices],
            group_index=self.group_index[indices.numpy()],
            prompt_length=self.prompt_length,
        )


def pad_rows(
    rows: Sequence[TrainingRow], *, pad_token_id: int, vocab_size: int, max_model_len: int
) -> PaddedBatch:
    """Pad `rows` into one batch; ValueError for rows the model cannot take (named by rollout id)."""
    if not rows:
        raise ValueError("no rows to train on")
    for row in rows:
        _check_row(row, vocab_size=vocab_size, max_model_len=max_model_len)
    if not any(any(row.response_mask) for row in rows):
        raise ValueError(f"none of the {len(rows)} rows has a trained token (response_mask is all 0)")

    batch_size = len(rows)
    prompt_length = max(len(row.prompt_token_ids) for row in rows)
    response_length = max(1, max(len(row.response_token_ids) for row in rows))
    input_ids = torch.full((batch_size, prompt_length + response_length), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros((batch_size, response_length), dtype=torch.float32)
    rollout_log_probs = torch.zeros_like(response_mask)
    token_level_rewards = torch.zeros_like(response_mask)
    for index, row in enumerate(rows):
        prompt, response = row.prompt_token_ids, row.response_token_ids
        start = prompt_length - len(prompt)
        input_ids[index, start:prompt_length] = torch.tensor(prompt)
        input_ids[index, prompt_length : prompt_length + len(response)] = torch.tensor(
            response, dtype=torch.long
        )
        attention_mask[index, start : prompt_length + len(response)] = 1
        response_mask[index, : len(response)] = torch.tensor(row.response_mask, dtype=torch.float32)
        rollout_log_probs[index, : len(response)] = torch.tensor(row.rollout_log_probs, dtype=torch.float32)
        trained = [position for position, mask in enumerate(row.response_mask) if mask]
        if trained:
            token_level_rewards[index, trained[-1]] = row.reward
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    group_index = np.array([row.group_id for row in rows], dtype=object)
    return PaddedBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        response_mask=response_mask,
        rollout_log_probs=rollout_log_probs,
        token_level_rewards=token_level_rewards,
        group_index=group_index,
        prompt_length=prompt_length,
    )


def _check_row(row: TrainingRow, *, vocab_size: int, max_model_len: int) -> None:
    where = f"row of rollout {row.rollout_id}"
    if not row.prompt_token_ids:
        raise ValueError(f"{where}: empty prompt (the first response token needs a context)")
    length = len(row.prompt_token_ids) + len(row.response_token_ids)
    if length > max_model_len:
        raise ValueError(f"{where}: {length} tokens exceed the model's context of {max_model_len}")
    for token in (*row.prompt_token_ids, *row.response_token_ids):
        if not 0 <= token < vocab_size:
            raise ValueError(f"{where}: token id {token} is outside the vocabulary of {vocab_size}")
    if any(mask not in (0, 1) for mask in row.response_mask):
        raise ValueError(f"{where}: response_mask must hold only 0 and 1")
