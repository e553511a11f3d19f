"""Training rows → the per-trajectory records verl's v1 trainer reads from TransferQueue.

verl's own agent loop writes one record per model output under the key `{uid}_{session}_{index}` (prompt
group, sibling rollout, output of that rollout); its GRPO step (`compute_advantage_for_multi_trajectories`)
takes each rollout's last output for the group statistics and gives the resulting advantage to all outputs of
that rollout. Our rows map onto that exactly: uid = the row's group id, session = the rollout's place in its
group, index = the row's place in its rollout (several rows per rollout at `transition` level, or where a
trajectory could not be merged). The fields are the ones verl's agent loop writes (`prompts`, `responses`,
`response_mask`, `input_ids`, `position_ids`, `rollout_log_probs`, `rm_scores` with the reward on the last
response token, ...), so verl's log-prob, advantage, rollout-correction and actor-update code reads our rows
as it reads its own.

Pure except for building tensors: no TransferQueue, Ray or GPU here, so all of it is tested on CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import NonTensorStack, TensorDict

from asyncrl.trainer.rows import TrainingRow

# Per-token fields: variable length, stored as jagged nested tensors (as verl's agent loop stores them).
TOKEN_FIELDS = (
    "prompts",
    "responses",
    "response_mask",
    "loss_mask",
    "input_ids",
    "position_ids",
    "rollout_log_probs",
    "rm_scores",
)


@dataclass(frozen=True)
class TrajectoryBatch:
    """One update's rows as TransferQueue records: `keys[i]` names `records[i]`, tagged by `tags[i]`."""

    keys: list[str]
    records: list[dict[str, Any]]
    tags: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.keys)

    def fields(self) -> TensorDict:
        """The records as one TensorDict (jagged per-token fields, per-row scalars, non-tensor uid)."""
        data: dict[str, Any] = {}
        for name in self.records[0]:
            values = [record[name] for record in self.records]
            if name in TOKEN_FIELDS:
                data[name] = torch.nested.as_nested_tensor(values, layout=torch.jagged)
            elif isinstance(values[0], torch.Tensor):
                data[name] = torch.stack(values)
            else:
                data[name] = NonTensorStack(*values)
        return TensorDict(data, batch_size=[len(self.records)])


def trajectory_keys(rows: Sequence[TrainingRow]) -> list[str]:
    """`{group_id}_{session}_{index}` per row: session numbers a group's rollouts, index a rollout's rows."""
    sessions: dict[str, dict[str, int]] = {}
    outputs: dict[tuple[str, str], int] = {}
    keys = []
    for row in rows:
        group = sessions.setdefault(row.group_id, {})
        session = group.setdefault(row.rollout_id, len(group))
        index = outputs.get((row.group_id, row.rollout_id), 0)
        outputs[(row.group_id, row.rollout_id)] = index + 1
        keys.append(f"{row.group_id}_{session}_{index}")
    return keys


def build_trajectory_batch(rows: Sequence[TrainingRow], *, step: int) -> TrajectoryBatch:
    """The records of one update (`step`), in row order; ValueError when no row has a token to train on."""
    if not rows:
        raise ValueError("an update needs at least one row")
    if not any(any(row.response_mask) for row in rows):
        raise ValueError(
            f"none of the {len(rows)} rows has a response token with mask 1: nothing to train on"
        )
    for row in rows:
        if not row.prompt_token_ids or not row.response_token_ids:
            raise ValueError(
                f"row of rollout {row.rollout_id} has {len(row.prompt_token_ids)} prompt and "
                f"{len(row.response_token_ids)} response tokens; verl needs at least one of each"
            )
    keys = trajectory_keys(rows)
    records = [_record(row, step=step) for row in rows]
    tags = [_tag(row, step=step) for row in rows]
    return TrajectoryBatch(keys=keys, records=records, tags=tags)


def _record(row: TrainingRow, *, step: int) -> dict[str, Any]:
    prompts = torch.tensor(row.prompt_token_ids, dtype=torch.int64)
    responses = torch.tensor(row.response_token_ids, dtype=torch.int64)
    mask = torch.tensor(row.response_mask, dtype=torch.int64)
    input_ids = torch.cat([prompts, responses])
    scores = torch.zeros(len(responses), dtype=torch.float32)
    scores[-1] = row.reward  # an outcome reward, on the last response token (as verl's agent loop puts it)
    return {
        "prompts": prompts,
        "responses": responses,
        "response_mask": mask,
        "loss_mask": mask.clone(),
        "input_ids": input_ids,
        "position_ids": torch.arange(len(input_ids), dtype=torch.int64),
        "rollout_log_probs": torch.tensor(row.rollout_log_probs, dtype=torch.float32),
        "rm_scores": scores,
        # Plain ints, as verl's agent loop stores them (and its padding rows copy): a tensor here, an int in
        # a padding row would be two kinds of value under one field.
        "num_turns": 1,
        "global_steps": step,
        "uid": row.group_id,
    }


def _tag(row: TrainingRow, *, step: int) -> dict[str, Any]:
    prompt_len, response_len = len(row.prompt_token_ids), len(row.response_token_ids)
    # The row knows the oldest policy version among its tokens; that bounds both ends verl's metrics read.
    version = row.model_version if row.model_version is not None else step
    return {
        "status": "success",
        "prompt_len": prompt_len,
        "response_len": response_len,
        "seq_len": prompt_len + response_len,
        "global_steps": step,
        "min_global_steps": version,
        "max_global_steps": version,
    }
