"""`rollout.dropUniformGroups` (dynamic sampling): groups whose rewards are all alike are dropped before the
update and replaced by new prompts; the pure rule, the window's count, and the step loop against the in-memory
gateway of tests/trainer/fake_gateway.py (the loop's HTTP client is tested against the real gateway
elsewhere; here the point is which groups each update trains)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from asyncrl.api.types.spec import AsyncSpec
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.rows import TrainingRow
from asyncrl.trainer.uniform_groups import drop_limit, uniform_groups
from asyncrl.trainer.window import Group, RolloutWindow
from tests.trainer.test_step_loop import TRAIN_BATCH, Harness, _harness, _run, _settings


def _group(group_id: str, n: int = 2) -> Group:
    return Group(group_id=group_id, enqueued_step=0, rollout_ids=tuple(f"{group_id}-r{i}" for i in range(n)))


def _row(group_id: str, index: int, reward: float) -> TrainingRow:
    return TrainingRow(
        rollout_id=f"{group_id}-r{index}",
        group_id=group_id,
        prompt_token_ids=(1,),
        response_token_ids=(2,),
        response_mask=(1,),
        rollout_log_probs=(-0.1,),
        reward=reward,
        model_version=0,
    )


def test_only_groups_of_two_or_more_rows_all_scored_alike_are_uniform() -> None:
    groups = [_group("alike"), _group("differ"), _group("single"), _group("none"), _group("ones")]
    rows = [
        _row("alike", 0, 0.0),
        _row("alike", 1, 0.0),
        _row("differ", 0, 0.0),
        _row("differ", 1, 0.25),
        _row("single", 0, 0.0),  # its other rollout gave no row: GRPO uses the reward itself
        _row("ones", 0, 1.0),
        _row("ones", 1, 1.0),
        _row("ones", 1, 1.0),  # a second row of one rollout (transition level)
    ]
    assert [group.group_id for group in uniform_groups(groups, rows)] == ["alike", "ones"]
    assert drop_limit(enabled=True, train_batch_size=4) == 4
    assert drop_limit(enabled=False, train_batch_size=4) == 0


def test_the_window_counts_dropped_groups_in_the_steps_summary_and_refuses_unfinished_ones() -> None:
    window = RolloutWindow(AsyncSpec().window_config(train_batch_size=1, samples_per_prompt=2))
    window.begin_step(step=0)
    window.add_group(group_id="g", rollout_ids=["g-r0", "g-r1"], step=0)
    window.record_terminal("g-r0", RolloutState.SUCCEEDED)
    with pytest.raises(ValueError, match="not complete"):
        window.drop_uniform_groups(["g"], step=0)
    window.record_terminal("g-r1", RolloutState.SUCCEEDED)
    assert [group.group_id for group in window.drop_uniform_groups(["g"], step=0)] == ["g"]
    assert window.n_uniform_groups_dropped == 1
    assert not window.active_groups
    window.add_group(group_id="h", rollout_ids=["h-r0", "h-r1"], step=0)
    for rollout_id in ("h-r0", "h-r1"):
        window.record_terminal(rollout_id, RolloutState.SUCCEEDED)
    batch = window.take_update_batch(step=0)
    assert batch.summary.n_uniform_groups_dropped == 1
    assert batch.summary.metrics()["training/async/n_uniform_groups_dropped"] == 1.0


def _scoring_agents(
    harness: Harness, rewards: Callable[[int], tuple[float, ...]]
) -> Callable[[Sequence[str]], None]:
    """Agents that finish each new group at once, rollout k of the group with ordinal n scoring
    rewards(n)[k]."""

    def finish(group_ids: Sequence[str]) -> None:
        for group_id in group_ids:
            ordinal = harness.gateway.group_ids.index(group_id)
            for rollout_id, reward in zip(
                harness.gateway.created_ids(group_id), rewards(ordinal), strict=True
            ):
                harness.gateway.finish_rollout(rollout_id, reward=reward)

    return finish


@pytest.mark.parametrize("async_enabled", [True, False], ids=["async", "sync"])
def test_uniform_groups_are_dropped_and_new_prompts_trained_in_their_place(
    tmp_path: Path, async_enabled: bool
) -> None:
    settings = _settings(steps=2)
    window = settings.window.model_copy(
        update={"async_enabled": async_enabled}
        if async_enabled
        else {"async_enabled": False, "async_window_size": None}
    )
    settings = dataclasses.replace(settings, window=window, drop_uniform_groups=True)
    harness = _harness(tmp_path, settings)
    # Every even group scores 0 twice (no signal); odd groups score 0 and 1.
    harness.gateway.on_groups_created = _scoring_agents(
        harness, lambda ordinal: (0.0, 0.0) if ordinal % 2 == 0 else (0.0, 1.0)
    )

    _run(harness)

    trained = harness.trained_groups()
    ordinals = [harness.gateway.group_ids.index(group) for group in trained]
    assert len(trained) == 2 * TRAIN_BATCH
    assert all(ordinal % 2 == 1 for ordinal in ordinals), ordinals  # only groups with a signal
    metrics = [json.loads(line) for line in harness.metrics_path.read_text().splitlines()]
    dropped = [m["training/async/n_uniform_groups_dropped"] for m in metrics]
    assert all(count >= 1 for count in dropped), dropped
    created = set(harness.gateway.group_ids)
    held = {rollout.group_id for rollout in harness.gateway.instance.store.select()}
    even = {group for ordinal, group in enumerate(harness.gateway.group_ids) if ordinal % 2 == 0}
    assert not (even & held) - set(g.group_id for g in harness.loop.window.active_groups)  # deleted
    assert even <= created


def test_a_run_whose_every_group_scores_alike_still_updates_after_dropping_train_batch_groups(
    tmp_path: Path,
) -> None:
    """A policy that solved the task scores 1 everywhere: without a limit it would never update again."""
    settings = dataclasses.replace(_settings(steps=3), drop_uniform_groups=True)
    harness = _harness(tmp_path, settings)
    harness.gateway.on_groups_created = _scoring_agents(harness, lambda ordinal: (1.0, 1.0))

    result = _run(harness)

    assert result.next_step == 3
    metrics = [json.loads(line) for line in harness.metrics_path.read_text().splitlines()]
    assert [m["training/async/n_uniform_groups_dropped"] for m in metrics] == [TRAIN_BATCH] * 3
    assert len(harness.trained_groups()) == 3 * TRAIN_BATCH


def test_off_by_default_every_group_is_trained_whatever_its_rewards(tmp_path: Path) -> None:
    harness = _harness(tmp_path, _settings(steps=2))
    assert harness.loop.settings.drop_uniform_groups is False
    harness.gateway.on_groups_created = _scoring_agents(harness, lambda ordinal: (0.0, 0.0))

    _run(harness)

    assert len(harness.trained_groups()) == 2 * TRAIN_BATCH
    assert (
        len(harness.gateway.group_ids) == 3 * TRAIN_BATCH
    )  # the window's 4, then 2 after step 0: none replaced
    metrics = [json.loads(line) for line in harness.metrics_path.read_text().splitlines()]
    assert [m["training/async/n_uniform_groups_dropped"] for m in metrics] == [0, 0]
