"""How a run's rows reach verl's GPUs, checked before a GPU is asked for.

Two of verl 0.9's runtime assertions depend only on the run's fields and its verlOverrides, and verl's own
`validate_config` skips both when dynamic batching is on (asyncrl's default), so a run that composes cleanly
would fail at its first update:

- **Mini-batches over the data-parallel ranks.** verl's v1 trainer sends each PPO mini-batch as
  `ppo_mini_batch_size x rollout.n` rows (`ppo_mini_batch_size` is `trainBatchSize` unless overridden) and its
  `train_mini_batch` asserts that this divides by the data-parallel size (the GPUs of all nodes, divided by
  the Ulysses sequence-parallel size).
- **Token budgets.** With `use_dynamic_bsz`, verl's `rearrange_micro_batches` asserts that each micro-batch's
  token budget (`ppo_max_token_len_per_gpu` for the update, `log_prob_max_token_len_per_gpu` for the rollout
  and reference log-probs) holds the longest row. A row is at most `spec.data.maxPromptLength +
  spec.data.maxResponseLength` tokens (the adapter drops longer prompts and cuts longer responses).

Pure: the run's numbers and the flat overrides in, messages naming the fields and a fix out. `asyncrl
validate`, loading a run (local mode, the operator) and the trainer's preflight all call `layout_errors`.
No verl import: the operator reads this module without the trainer's libraries.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# asyncrl's defaults for these verl keys (the verl backend's ASYNCRL_DEFAULTS reads them from here).
DEFAULT_TOKEN_BUDGET = 16384
DEFAULT_MAX_PROMPT_LENGTH = 4096
DEFAULT_MAX_RESPONSE_LENGTH = 4096

DYNAMIC_BATCH_KEY = "actor_rollout_ref.actor.use_dynamic_bsz"
REMOVE_PADDING_KEY = "actor_rollout_ref.model.use_remove_padding"
UPDATE_BUDGET_KEY = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
MINI_BATCH_KEY = "actor_rollout_ref.actor.ppo_mini_batch_size"
SEQUENCE_PARALLEL_KEY = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
# The log-prob passes: (their own dynamic-batching switch, their budget); verl defaults both to the actor's.
LOG_PROB_PASSES = {
    "rollout": (
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    ),
    "ref": (
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    ),
}


@dataclass(frozen=True)
class LayoutProblem:
    """One refused combination: the message (fields named, a fix given) and the field it points at."""

    message: str
    field_path: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class VerlLayout:
    """The run's numbers that decide verl's batch layout; `overrides` are flat (flatten_overrides)."""

    train_batch_size: int
    samples_per_prompt: int
    gpus_per_node: int
    nodes: int
    max_prompt_length: int
    max_response_length: int
    overrides: Mapping[str, Any]

    @property
    def longest_row(self) -> int:
        return self.max_prompt_length + self.max_response_length

    def data_parallel_size(self) -> int:
        world = self.gpus_per_node * self.nodes
        return max(world // max(self._int(SEQUENCE_PARALLEL_KEY, 1), 1), 1)

    def mini_batch_groups(self) -> int:
        return self._int(MINI_BATCH_KEY, self.train_batch_size)

    def dynamic_batching(self, switch_key: str = DYNAMIC_BATCH_KEY) -> bool:
        actor = self.overrides.get(DYNAMIC_BATCH_KEY, True)
        value = self.overrides.get(switch_key, actor)
        return value is True

    def update_budget(self) -> int:
        return self._int(UPDATE_BUDGET_KEY, DEFAULT_TOKEN_BUDGET)

    def _int(self, key: str, default: int) -> int:
        value = self.overrides.get(key, default)
        return value if isinstance(value, int) and not isinstance(value, bool) else default


def layout_errors(layout: VerlLayout) -> list[LayoutProblem]:
    """Every combination verl would assert on at its first update; empty when there is none."""
    problems = []
    divisibility = _mini_batch_problem(layout)
    if divisibility is not None:
        problems.append(divisibility)
    problems.extend(_budget_problems(layout))
    return problems


def _mini_batch_problem(layout: VerlLayout) -> LayoutProblem | None:
    world = layout.gpus_per_node * layout.nodes
    sequence_parallel = layout._int(SEQUENCE_PARALLEL_KEY, 1)
    if world >= 1 and (sequence_parallel < 1 or world % sequence_parallel):
        return LayoutProblem(
            f"{SEQUENCE_PARALLEL_KEY} = {sequence_parallel} must divide the trainer's {world} GPU(s) "
            "(verl groups that many GPUs per sequence): set it in spec.trainer.verlOverrides to one of "
            f"{', '.join(str(d) for d in range(1, world + 1) if world % d == 0)}",
            ("trainer", "verlOverrides"),
        )
    if layout.mini_batch_groups() < 1:
        return LayoutProblem(
            f"{MINI_BATCH_KEY} must be at least 1 (groups per optimizer step; unset: spec.trainBatchSize)",
            ("trainer", "verlOverrides"),
        )
    dp = layout.data_parallel_size()
    n = layout.samples_per_prompt
    groups = layout.mini_batch_groups()
    rows = groups * n
    if rows % dp == 0:
        return None
    gpus = (
        f"spec.trainer.gpus {layout.gpus_per_node}"
        if layout.nodes == 1
        else f"spec.trainer.gpusPerNode {layout.gpus_per_node} x nodes {layout.nodes}"
    )
    if sequence_parallel != 1:
        gpus += f" / {SEQUENCE_PARALLEL_KEY} {sequence_parallel}"
    parallel = f"{dp} data-parallel ranks ({gpus})"
    # groups x n divides by dp exactly when groups is a multiple of dp / gcd(dp, n), and likewise for n.
    group_step = dp // math.gcd(dp, n)
    sample_step = dp // math.gcd(dp, groups)
    group_choices = _multiples_near(groups, group_step)
    sample_choices = _multiples_near(n, sample_step)
    if MINI_BATCH_KEY in layout.overrides:
        return LayoutProblem(
            f"verl trains in mini-batches of {MINI_BATCH_KEY} x rollout.samplesPerPrompt = {groups} x {n} = "
            f"{rows} rows, which must divide evenly over the {parallel}, or its first update fails on an "
            f"assertion: set {MINI_BATCH_KEY} in spec.trainer.verlOverrides to {_or(group_choices)}, or "
            f"spec.rollout.samplesPerPrompt to {_or(sample_choices)}",
            ("trainer", "verlOverrides"),
        )
    return LayoutProblem(
        f"verl trains on trainBatchSize x rollout.samplesPerPrompt = {groups} x {n} = {rows} rows per "
        f"update, which must divide evenly over the {parallel}, or its first update fails on an "
        f"assertion: set spec.trainBatchSize to {_or(group_choices)}, or spec.rollout.samplesPerPrompt to "
        f"{_or(sample_choices)}",
        ("trainBatchSize",),
    )


def _budget_problems(layout: VerlLayout) -> list[LayoutProblem]:
    need = layout.longest_row
    budgets: list[tuple[str, int]] = []
    if layout.dynamic_batching():
        budgets.append((UPDATE_BUDGET_KEY, layout.update_budget()))
    for switch, key in LOG_PROB_PASSES.values():
        if layout.dynamic_batching(switch):
            budgets.append((key, layout._int(key, layout.update_budget())))
    short = [f"{key} = {budget}" for key, budget in budgets if budget < need]
    if not short:
        return []
    return [
        LayoutProblem(
            f"verl's token budget{'s' if len(short) > 1 else ''} {', '.join(short)} must hold the longest "
            f"row, spec.data.maxPromptLength + spec.data.maxResponseLength = {layout.max_prompt_length} + "
            f"{layout.max_response_length} = {need} tokens, or its first update fails on an assertion "
            f"(rearrange_micro_batches): set {'each' if len(short) > 1 else 'it'} to at least {need} in "
            "spec.trainer.verlOverrides, or lower the lengths",
            ("trainer", "verlOverrides") if layout.overrides else ("data", "maxPromptLength"),
        )
    ]


def _multiples_near(value: int, step: int) -> list[int]:
    """Up to two multiples of `step` around `value` (the next above first), all at least `step`."""
    above = math.ceil(value / step) * step
    below = (value // step) * step
    return [above] if below < step or below == above else [above, below]


def _or(values: list[int]) -> str:
    return " or ".join(str(value) for value in values)
