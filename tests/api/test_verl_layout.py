"""verl's batch layout rules (asyncrl.api.types.verl_layout), checked against verl 0.9.1's own assertions.

The rules exist because verl's `validate_config` skips them when dynamic batching is on (asyncrl's default),
so a run that composes cleanly would fail at its first update on a GPU. Each rule is compared here with the
verl code that asserts it, run on CPU: `TrainingWorker.train_mini_batch` (mini-batches over the data-parallel
ranks) and `rearrange_micro_batches` (a micro-batch's token budget holds its longest row).
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.api import load_run
from asyncrl.api.types.run import InvalidRunError
from asyncrl.api.types.verl_layout import (
    LOG_PROB_PASSES,
    MINI_BATCH_KEY,
    SEQUENCE_PARALLEL_KEY,
    UPDATE_BUDGET_KEY,
    VerlLayout,
    layout_errors,
)
from tests.trainer.backends.verl_support import verl_manifest

ROLLOUT_BUDGET_KEY = LOG_PROB_PASSES["rollout"][1]


def layout(**changes: Any) -> VerlLayout:
    values: dict[str, Any] = {
        "train_batch_size": 8,
        "samples_per_prompt": 8,
        "gpus_per_node": 1,
        "nodes": 1,
        "max_prompt_length": 4096,
        "max_response_length": 4096,
        "overrides": {},
    }
    return VerlLayout(**{**values, **changes})


def verl_mini_batch_accepts(*, rows_per_mini_batch: int, data_parallel_size: int) -> bool:
    """verl's own `train_mini_batch` up to its assertion (what follows needs GPUs and a model)."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import TrainingWorker

    engine = types.SimpleNamespace(
        get_data_parallel_size=lambda: data_parallel_size, get_data_parallel_rank=lambda: 0
    )
    rows = max(rows_per_mini_batch // data_parallel_size, 1)
    data = tu.get_tensordict(
        tensor_dict={"values": torch.zeros(rows, 1)},
        non_tensor_dict={"mini_batch_size": rows_per_mini_batch, "epochs": 1},
    )
    method = getattr(TrainingWorker.train_mini_batch, "__wrapped__", TrainingWorker.train_mini_batch)
    try:
        method(types.SimpleNamespace(engine=engine), data)
    except AssertionError:
        return False
    except Exception:  # past the assertion: the fake engine has no train_mode, model or GPUs
        return True
    return True


def verl_budget_accepts(*, longest_row: int, budget: int) -> bool:
    """verl's own `rearrange_micro_batches` on rows up to `longest_row` tokens, with the budget `budget`."""
    from tensordict import TensorDict
    from verl.utils.seqlen_balancing import rearrange_micro_batches

    lengths = [longest_row, 16, 300]
    input_ids = torch.nested.as_nested_tensor(
        [torch.ones(n, dtype=torch.int64) for n in lengths], layout=torch.jagged
    )
    try:
        rearrange_micro_batches(TensorDict({"input_ids": input_ids}, batch_size=[len(lengths)]), budget)
    except AssertionError:
        return False
    return True


def test_the_issues_example_is_refused_with_fields_and_values_that_work() -> None:
    [problem] = layout_errors(layout(train_batch_size=2, samples_per_prompt=3, gpus_per_node=4))
    assert problem.field_path == ("trainBatchSize",)
    assert "2 x 3 = 6 rows" in problem.message
    assert "4 data-parallel ranks (spec.trainer.gpus 4)" in problem.message
    assert "set spec.trainBatchSize to 4, or spec.rollout.samplesPerPrompt to 4 or 2" in problem.message
    assert not verl_mini_batch_accepts(rows_per_mini_batch=6, data_parallel_size=4)


def test_the_default_gpu_run_and_the_gpu_example_pass() -> None:
    assert layout_errors(layout()) == []
    assert layout_errors(layout(gpus_per_node=8, nodes=4)) == []


def test_a_mini_batch_override_is_named_instead_of_train_batch_size() -> None:
    [problem] = layout_errors(layout(gpus_per_node=8, samples_per_prompt=3, overrides={MINI_BATCH_KEY: 3}))
    assert problem.field_path == ("trainer", "verlOverrides")
    assert f"{MINI_BATCH_KEY} x rollout.samplesPerPrompt = 3 x 3 = 9 rows" in problem.message
    assert f"set {MINI_BATCH_KEY} in spec.trainer.verlOverrides to 8" in problem.message


def test_ulysses_sequence_parallelism_divides_the_ranks() -> None:
    # 8 GPUs, Ulysses 4: 2 data-parallel ranks, so 1 x 2 rows divide; without Ulysses they would not.
    assert layout_errors(layout(train_batch_size=1, samples_per_prompt=2, gpus_per_node=8)) != []
    assert (
        layout_errors(
            layout(
                train_batch_size=1,
                samples_per_prompt=2,
                gpus_per_node=8,
                overrides={SEQUENCE_PARALLEL_KEY: 4},
            )
        )
        == []
    )


@settings(max_examples=60, deadline=None)
@given(
    groups=st.integers(1, 64),
    samples=st.integers(1, 16),
    gpus=st.integers(1, 8),
    nodes=st.integers(1, 4),
)
def test_the_rule_is_verls_assertion_and_its_suggestions_pass(
    groups: int, samples: int, gpus: int, nodes: int
) -> None:
    run = layout(train_batch_size=groups, samples_per_prompt=samples, gpus_per_node=gpus, nodes=nodes)
    problems = layout_errors(run)
    accepted = verl_mini_batch_accepts(rows_per_mini_batch=groups * samples, data_parallel_size=gpus * nodes)
    assert (problems == []) == accepted
    if problems:
        suggestions = problems[0].message.split("set spec.trainBatchSize to ")[1]
        groups_text, samples_text = suggestions.split(", or spec.rollout.samplesPerPrompt to ")
        for value in map(int, groups_text.split(" or ")):
            assert layout_errors(layout(**{**run.__dict__, "train_batch_size": value})) == []
        for value in map(int, samples_text.split(" or ")):
            assert layout_errors(layout(**{**run.__dict__, "samples_per_prompt": value})) == []


@pytest.mark.parametrize(
    ("overrides", "short"),
    [
        ({UPDATE_BUDGET_KEY: 8191}, [UPDATE_BUDGET_KEY, ROLLOUT_BUDGET_KEY, LOG_PROB_PASSES["ref"][1]]),
        ({UPDATE_BUDGET_KEY: 8192}, []),
        ({ROLLOUT_BUDGET_KEY: 4096}, [ROLLOUT_BUDGET_KEY]),
        ({UPDATE_BUDGET_KEY: 4096, "actor_rollout_ref.actor.use_dynamic_bsz": False}, []),
        ({LOG_PROB_PASSES["rollout"][0]: False, ROLLOUT_BUDGET_KEY: 100}, []),
    ],
)
def test_every_token_budget_in_use_must_hold_the_longest_row(
    overrides: dict[str, Any], short: list[str]
) -> None:
    problems = layout_errors(layout(overrides=overrides))
    named = [
        key
        for key in (UPDATE_BUDGET_KEY, *(k for _, k in LOG_PROB_PASSES.values()))
        if problems and f"{key} =" in problems[0].message
    ]
    assert named == short
    if problems:
        assert "at least 8192" in problems[0].message


@pytest.mark.parametrize("budget", [8191, 8192, 16384])
def test_the_budget_rule_is_verls_assertion(budget: int) -> None:
    run = layout(overrides={UPDATE_BUDGET_KEY: budget})
    assert (layout_errors(run) == []) == verl_budget_accepts(longest_row=run.longest_row, budget=budget)


def test_loading_a_run_refuses_it_and_the_reference_backend_is_not_checked() -> None:
    manifest = verl_manifest(
        trainer={"gpus": 4},
        trainBatchSize=2,
        rollout={"samplesPerPrompt": 3},
        **{"async": {"enabled": True, "windowSize": 4}},
    )
    with pytest.raises(InvalidRunError, match=r"spec\.trainBatchSize: verl trains on"):
        load_run(manifest)
    manifest["spec"]["trainer"] = {"backend": "Reference", "gpus": 4}
    load_run(manifest)


def test_lengths_in_verl_overrides_are_refused_in_favour_of_the_spec_fields() -> None:
    manifest = verl_manifest(trainer={"gpus": 1, "verlOverrides": {"data.max_prompt_length": 2048}})
    with pytest.raises(InvalidRunError, match=r"is set by spec\.data\.maxPromptLength"):
        load_run(manifest)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({SEQUENCE_PARALLEL_KEY: 3}, "must divide the trainer's 4 GPU(s)"),
        ({SEQUENCE_PARALLEL_KEY: 0}, "must divide the trainer's 4 GPU(s)"),
        ({MINI_BATCH_KEY: 0}, "must be at least 1"),
    ],
)
def test_sequence_parallel_sizes_and_mini_batches_verl_cannot_split_are_refused(
    overrides: dict[str, Any], named: str
) -> None:
    [problem] = layout_errors(layout(gpus_per_node=4, overrides=overrides))
    assert named in problem.message
    assert problem.field_path == ("trainer", "verlOverrides")
