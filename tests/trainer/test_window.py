"""The async window's rules, one behaviour per test: configuration, drawing, completion, carry-over, ages."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from asyncrl.api.types.spec import AsyncSpec
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.window import (
    Group,
    RolloutWindow,
    StalenessPolicy,
    StepSummary,
    TerminalOutcome,
    WindowConfig,
)

SUCCEEDED = RolloutState.SUCCEEDED


def async_config(**overrides: Any) -> WindowConfig:
    values: dict[str, Any] = {
        "train_batch_size": 2,
        "samples_per_prompt": 2,
        "async_enabled": True,
        "async_window_size": 4,
        "max_carry_over_age_steps": None,
        "staleness_policy": StalenessPolicy.CANCEL,
        "refill_during_collection": False,
    }
    return WindowConfig(**(values | overrides))


def add(window: RolloutWindow, group_id: str, *, step: int) -> Group:
    n = window.config.samples_per_prompt
    return window.add_group(group_id=group_id, rollout_ids=[f"{group_id}/{i}" for i in range(n)], step=step)


def finish(window: RolloutWindow, group: Group, state: RolloutState = SUCCEEDED) -> None:
    for rollout_id in group.rollout_ids:
        window.record_terminal(rollout_id, state)


def fill(window: RolloutWindow, *, step: int, prefix: str = "g") -> list[Group]:
    return [add(window, f"{prefix}{step}.{i}", step=step) for i in range(window.groups_to_draw())]


# Configuration


def test_async_is_off_by_default_and_the_window_is_one_batch() -> None:
    config = AsyncSpec().window_config(train_batch_size=8, samples_per_prompt=4)
    assert not config.async_enabled
    assert not config.refills
    assert config.window_size == 8
    assert config.max_carry_over_age_steps is None
    assert config.staleness_policy is StalenessPolicy.CANCEL


def test_the_async_window_holds_window_size_groups() -> None:
    assert async_config(train_batch_size=32, async_window_size=64).window_size == 64


@pytest.mark.parametrize("async_window_size", [None, 16, 32])
def test_async_requires_a_window_size_greater_than_train_batch_size(
    async_window_size: int | None,
) -> None:
    with pytest.raises(ValidationError) as error:
        async_config(train_batch_size=32, async_window_size=async_window_size)
    message = str(error.value)
    given = "unset" if async_window_size is None else str(async_window_size)
    assert f"windowSize ({given})" in message
    assert "trainBatchSize (32)" in message
    assert "try windowSize: 64 (2 x trainBatchSize)" in message


def test_window_size_is_ignored_when_async_is_off() -> None:
    config = AsyncSpec(window_size=2).window_config(train_batch_size=4, samples_per_prompt=2)
    assert config.window_size == 4


@pytest.mark.parametrize(
    "field", ["train_batch_size", "samples_per_prompt", "async_window_size", "max_carry_over_age_steps"]
)
def test_sizes_and_ages_must_be_positive(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        async_config(**{field: 0})


def test_window_config_is_frozen() -> None:
    config = async_config()
    with pytest.raises(ValidationError):
        config.train_batch_size = 3


# Drawing and adding groups


def test_async_draws_new_groups_to_keep_the_window_full() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    assert window.groups_to_draw() == 4
    first, second, _, _ = fill(window, step=0)
    assert window.groups_to_draw() == 0
    finish(window, first)
    finish(window, second)
    window.take_update_batch(step=0)

    window.begin_step(step=1)
    assert window.groups_to_draw() == 2  # window (4) - carried over (2)


def test_sync_draws_one_batch_into_an_empty_window_only() -> None:
    window = RolloutWindow(AsyncSpec().window_config(train_batch_size=2, samples_per_prompt=2))
    window.begin_step(step=0)
    assert window.groups_to_draw() == 2
    add(window, "a", step=0)
    assert window.groups_to_draw() == 0


def test_group_must_have_exactly_samples_per_prompt_members() -> None:
    window = RolloutWindow(async_config(samples_per_prompt=4))
    window.begin_step(step=0)
    for size in (3, 5):
        with pytest.raises(ValueError, match=r"rollout\.samplesPerPrompt requires exactly 4"):
            window.add_group(group_id="g", rollout_ids=[f"r{i}" for i in range(size)], step=0)
    assert window.active_groups == ()


def test_duplicate_group_id_is_rejected() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    window.add_group(group_id="g", rollout_ids=["a", "b"], step=0)
    with pytest.raises(ValueError, match="group g is already in the window"):
        window.add_group(group_id="g", rollout_ids=["c", "d"], step=0)


def test_rollout_already_in_the_window_is_rejected() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    window.add_group(group_id="g", rollout_ids=["a", "b"], step=0)
    with pytest.raises(ValueError, match=r"rollouts \['b'\] are already in the window"):
        window.add_group(group_id="h", rollout_ids=["b", "c"], step=0)
    assert window.n_active_rollouts == 2


def test_adding_beyond_the_window_is_rejected() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    fill(window, step=0)
    with pytest.raises(ValueError, match=r"the window is full \(4 groups\)"):
        add(window, "extra", step=0)


# Completion and update batches


def test_group_with_one_unfinished_sibling_is_carried_over() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    a, b, c, _ = fill(window, step=0)
    finish(window, a)
    finish(window, b)
    window.record_terminal(c.rollout_ids[0], SUCCEEDED)

    batch = window.take_update_batch(step=0)

    assert [group.group_id for group in batch.consumed] == [a.group_id, b.group_id]
    carried = {group.group_id: group for group in batch.carried_over}
    assert c.group_id in carried
    assert carried[c.group_id].n_finished == 1
    assert not carried[c.group_id].is_complete
    assert [group.group_id for group in window.active_groups] == list(carried)


def test_update_takes_first_complete_groups_in_completion_order() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    a, b, c, d = fill(window, step=0)
    for group in (d, b, a):
        finish(window, group)

    batch = window.take_update_batch(step=0)

    assert [group.group_id for group in batch.consumed] == [d.group_id, b.group_id]
    assert [group.group_id for group in batch.carried_over] == [a.group_id, c.group_id]  # enqueue order
    assert batch.carried_over[0].is_complete  # a complete group beyond the batch is carried, not dropped


def test_completion_order_follows_the_last_sibling_not_the_first() -> None:
    window = RolloutWindow(async_config(train_batch_size=1, async_window_size=2))
    window.begin_step(step=0)
    a, b = fill(window, step=0)
    window.record_terminal(a.rollout_ids[0], SUCCEEDED)
    finish(window, b)
    window.record_terminal(a.rollout_ids[1], SUCCEEDED)

    assert [group.group_id for group in window.take_update_batch(step=0).consumed] == [b.group_id]


def test_record_terminal_reports_what_it_did() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    group = add(window, "g", step=0)
    first, last = group.rollout_ids
    assert window.record_terminal(first, SUCCEEDED) is TerminalOutcome.RECORDED
    assert window.record_terminal(last, RolloutState.FAILED) is TerminalOutcome.GROUP_COMPLETED
    assert window.record_terminal("elsewhere", SUCCEEDED) is TerminalOutcome.UNKNOWN


def test_duplicate_terminal_report_is_not_counted_twice() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    group = add(window, "g", step=0)
    first = group.rollout_ids[0]
    window.record_terminal(first, SUCCEEDED)

    assert window.record_terminal(first, SUCCEEDED) is TerminalOutcome.DUPLICATE
    assert window.record_terminal(first, RolloutState.FAILED) is TerminalOutcome.DUPLICATE
    assert group.n_finished == 1
    assert not group.is_complete
    assert group.terminal_states == {first: SUCCEEDED}  # the first terminal state wins


def test_report_for_a_consumed_group_is_unknown() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    a, b, _, _ = fill(window, step=0)
    finish(window, a)
    finish(window, b)
    window.take_update_batch(step=0)
    assert window.record_terminal(a.rollout_ids[0], SUCCEEDED) is TerminalOutcome.UNKNOWN


@pytest.mark.parametrize("state", [RolloutState.QUEUED, RolloutState.RUNNING])
def test_non_terminal_state_is_rejected(state: RolloutState) -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    group = add(window, "g", step=0)
    with pytest.raises(ValueError, match="not a terminal state"):
        window.record_terminal(group.rollout_ids[0], state)


def test_failed_siblings_complete_a_group_and_are_counted() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    a, b, _, _ = fill(window, step=0)
    window.record_terminal(a.rollout_ids[0], RolloutState.TIMED_OUT)
    window.record_terminal(a.rollout_ids[1], RolloutState.CANCELLED)
    window.record_terminal(b.rollout_ids[0], RolloutState.FAILED)
    window.record_terminal(b.rollout_ids[1], SUCCEEDED)

    summary = window.take_update_batch(step=0).summary

    assert summary.n_failed_rollouts_consumed == 3
    assert summary.n_completed_rollouts == 4


def test_async_update_waits_for_train_batch_size_complete_groups() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    a, _, _, _ = fill(window, step=0)
    finish(window, a)
    assert not window.ready_for_update()
    with pytest.raises(RuntimeError, match="1 of 4 active groups complete, 2 needed"):
        window.take_update_batch(step=0)


def test_sync_update_waits_for_every_group_and_carries_nothing() -> None:
    window = RolloutWindow(AsyncSpec().window_config(train_batch_size=3, samples_per_prompt=2))
    window.begin_step(step=0)
    a, b, c = fill(window, step=0)
    finish(window, c)
    finish(window, a)
    assert not window.ready_for_update()
    finish(window, b)
    assert window.ready_for_update()

    batch = window.take_update_batch(step=0)

    assert [group.group_id for group in batch.consumed] == [c.group_id, a.group_id, b.group_id]
    assert batch.carried_over == ()
    assert batch.summary.n_new_carry_over_rollouts == 0
    assert window.active_groups == ()


# Ages and metrics


def test_carry_over_age_counts_updates_since_enqueue() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    a, b, slow, _ = fill(window, step=0)
    finish(window, a)
    finish(window, b)
    assert window.take_update_batch(step=0).summary.carry_over_age_histogram == {1: 2}

    window.begin_step(step=1)
    assert slow.age_steps(1) == 1
    fresh = fill(window, step=1)
    finish(window, fresh[0])
    finish(window, fresh[1])
    summary = window.take_update_batch(step=1).summary

    assert summary.carry_over_age_histogram == {2: 2}
    assert summary.new_carry_over_age_max_steps == 2


def test_step_summary_reports_the_six_seed_metrics() -> None:
    window = RolloutWindow(async_config(samples_per_prompt=3))
    window.begin_step(step=0)
    a, b, _, _ = fill(window, step=0)
    finish(window, a)
    finish(window, b)
    first = window.take_update_batch(step=0).summary
    window.begin_step(step=1)
    c, d = fill(window, step=1)
    finish(window, c)
    finish(window, d)

    summary = window.take_update_batch(step=1).summary.with_drain(inflight_at_pause=5, drain_seconds=1.5)

    assert first.n_new_carry_over_rollouts == summary.n_prev_carry_over_rollouts == 6
    assert summary.metrics() == {
        "training/async/n_prev_carry_over_rollouts": 6.0,
        "training/async/n_completed_rollouts": 6.0,
        "training/async/n_new_carry_over_rollouts": 6.0,
        "training/async/new_carry_over_age_max_steps": 2.0,
        "training/async/proxy_inflight_at_pause": 5.0,
        "training/async/proxy_drain_seconds": 1.5,
        "training/async/proxy_aborted_calls": 0.0,
        "training/async/n_stale_groups_cancelled": 0.0,
        "training/async/n_stale_groups_kept": 0.0,
        "training/async/n_failed_rollouts_consumed": 0.0,
        "training/async/n_uniform_groups_dropped": 0.0,
    }


def test_with_drain_returns_a_new_summary() -> None:
    summary = StepSummary(
        step=0,
        n_prev_carry_over_rollouts=0,
        n_completed_rollouts=4,
        n_new_carry_over_rollouts=0,
        new_carry_over_age_max_steps=0,
        carry_over_age_histogram={},
        n_stale_groups_cancelled=0,
        n_stale_groups_kept=0,
        n_failed_rollouts_consumed=0,
    )
    drained = summary.with_drain(inflight_at_pause=3, drain_seconds=0.25)
    assert (summary.proxy_inflight_at_pause, summary.proxy_drain_seconds) == (0, 0.0)
    assert (drained.proxy_inflight_at_pause, drained.proxy_drain_seconds) == (3, 0.25)


# Bounded staleness


def age_one_slow_group(window: RolloutWindow, *, steps: int) -> Group:
    """Run `steps` steps in which group "slow" never finishes and every other group does."""
    window.begin_step(step=0)
    slow = add(window, "slow", step=0)
    for step in range(steps):
        if step > 0:
            window.begin_step(step=step)
        for group in fill(window, step=step):
            finish(window, group)
        window.take_update_batch(step=step)
    return slow


def test_stale_groups_are_cancelled_and_replaced_under_the_cancel_policy() -> None:
    window = RolloutWindow(async_config(max_carry_over_age_steps=1))
    slow = age_one_slow_group(window, steps=2)
    window.begin_step(step=2)
    assert window.stale_groups(step=2) == [slow]
    free_slots = window.groups_to_draw()

    cancelled = window.apply_staleness_policy(step=2)

    assert cancelled == [slow]
    assert slow not in window.active_groups
    assert window.groups_to_draw() == free_slots + 1  # its slot goes to a fresh prompt
    assert window.record_terminal(slow.rollout_ids[0], RolloutState.CANCELLED) is TerminalOutcome.UNKNOWN
    for group in fill(window, step=2):
        finish(window, group)
    assert window.take_update_batch(step=2).summary.n_stale_groups_cancelled == 1


def test_group_at_the_max_age_is_not_stale() -> None:
    window = RolloutWindow(async_config(max_carry_over_age_steps=2))
    slow = age_one_slow_group(window, steps=2)
    window.begin_step(step=2)
    assert slow.age_steps(2) == 2
    assert window.apply_staleness_policy(step=2) == []


def test_stale_groups_stay_under_the_keep_policy() -> None:
    window = RolloutWindow(async_config(max_carry_over_age_steps=1, staleness_policy=StalenessPolicy.KEEP))
    slow = age_one_slow_group(window, steps=2)
    window.begin_step(step=2)

    assert window.apply_staleness_policy(step=2) == []
    assert window.stale_groups(step=2) == [slow]
    assert slow in window.active_groups
    finish(window, slow)
    for group in fill(window, step=2):
        finish(window, group)
    summary = window.take_update_batch(step=2).summary
    assert (summary.n_stale_groups_kept, summary.n_stale_groups_cancelled) == (1, 0)


def test_no_group_is_stale_without_a_max_age() -> None:
    window = RolloutWindow(async_config())
    age_one_slow_group(window, steps=5)
    window.begin_step(step=5)
    assert window.stale_groups(step=5) == []
    assert window.apply_staleness_policy(step=5) == []


# Step protocol


def test_steps_must_be_begun_before_use() -> None:
    window = RolloutWindow(async_config())
    with pytest.raises(RuntimeError, match=r"begin_step\(step=0\) was not called"):
        add(window, "g", step=0)
    with pytest.raises(RuntimeError, match="was not called"):
        window.apply_staleness_policy(step=0)
    with pytest.raises(RuntimeError, match="was not called"):
        window.take_update_batch(step=0)


def test_calls_for_another_step_than_the_begun_one_raise() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    for group in fill(window, step=0)[:2]:
        finish(window, group)
    with pytest.raises(RuntimeError, match="step 0 is in progress"):
        window.take_update_batch(step=1)
    with pytest.raises(RuntimeError, match="step 0 is in progress"):
        window.add_group(group_id="late", rollout_ids=["x", "y"], step=1)
    with pytest.raises(RuntimeError, match="step 0 has not taken its update batch"):
        window.begin_step(step=1)


def test_steps_increase_by_one_per_update() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    for group in fill(window, step=0)[:2]:
        finish(window, group)
    window.take_update_batch(step=0)
    with pytest.raises(ValueError, match="the last update was step 0"):
        window.begin_step(step=2)
    window.begin_step(step=1)
    assert window.current_step == 1


# Recovery


def test_restore_rebuilds_the_window_and_keeps_completion_order() -> None:
    config = async_config(train_batch_size=2, async_window_size=4)
    groups = [
        Group(group_id="old", enqueued_step=3, rollout_ids=("o1", "o2"), terminal_states={"o1": SUCCEEDED}),
        Group(
            group_id="late",
            enqueued_step=4,
            rollout_ids=("l1", "l2"),
            terminal_states={"l1": SUCCEEDED, "l2": SUCCEEDED},
            completion_sequence=9,
        ),
        Group(
            group_id="early",
            enqueued_step=4,
            rollout_ids=("e1", "e2"),
            terminal_states={"e1": SUCCEEDED, "e2": RolloutState.FAILED},
            completion_sequence=2,
        ),
    ]
    window = RolloutWindow.restore(config, groups)
    assert [group.group_id for group in window.active_groups] == ["old", "late", "early"]
    assert window.active_groups[0] is not groups[0]  # copied: the caller's objects are never changed

    with pytest.raises(ValueError, match="enqueued in step 4"):
        window.begin_step(step=3)
    window.begin_step(step=4)
    assert window.record_terminal("l1", SUCCEEDED) is TerminalOutcome.DUPLICATE
    batch = window.take_update_batch(step=4)

    assert [group.group_id for group in batch.consumed] == ["early", "late"]
    assert batch.summary.n_prev_carry_over_rollouts == 6
    assert batch.summary.carry_over_age_histogram == {2: 1}


def test_restore_rejects_groups_the_window_cannot_hold() -> None:
    config = async_config()
    with pytest.raises(ValueError, match=r"rollout\.samplesPerPrompt requires exactly 2"):
        RolloutWindow.restore(config, [Group(group_id="g", enqueued_step=0, rollout_ids=("a",))])
    too_many = [Group(group_id=f"g{i}", enqueued_step=0, rollout_ids=(f"{i}a", f"{i}b")) for i in range(5)]
    with pytest.raises(ValueError, match="the window is full"):
        RolloutWindow.restore(config, too_many)


def test_group_rejects_inconsistent_recovered_state() -> None:
    with pytest.raises(ValueError, match="only terminal states"):
        Group(group_id="g", enqueued_step=0, rollout_ids=("a",), terminal_states={"a": RolloutState.RUNNING})
    with pytest.raises(ValueError, match="foreign rollouts"):
        Group(group_id="g", enqueued_step=0, rollout_ids=("a",), terminal_states={"b": SUCCEEDED})
    with pytest.raises(ValueError, match="not complete"):
        Group(group_id="g", enqueued_step=0, rollout_ids=("a", "b"), completion_sequence=0)
    with pytest.raises(ValueError, match="distinct"):
        Group(group_id="g", enqueued_step=0, rollout_ids=("a", "a"))


# Refill during collection


def test_a_window_refilled_during_collection_keeps_window_size_groups_unfinished() -> None:
    window = RolloutWindow(async_config(refill_during_collection=True))  # B 2, W 4: at most 5 groups
    window.begin_step(step=0)
    first = fill(window, step=0)
    assert len(first) == 4
    finish(window, first[0])
    assert window.groups_to_draw() == 1  # one finished: one new group takes its place
    add(window, "refill-1", step=0)
    assert (window.n_unfinished_groups, len(window.active_groups)) == (4, 5)
    assert window.groups_to_draw() == 0  # full: 4 unfinished + 1 finished (a 2nd finished means update)
    finish(window, first[1])
    assert window.ready_for_update()
    batch = window.take_update_batch(step=0)
    assert [group.group_id for group in batch.consumed] == [first[0].group_id, first[1].group_id]
    assert batch.summary.n_new_carry_over_rollouts == 3 * 2  # the refill is carried like any group
    window.begin_step(step=1)
    assert window.groups_to_draw() == 1


def test_a_window_refilled_at_step_start_only_draws_nothing_while_collecting() -> None:
    window = RolloutWindow(async_config())
    window.begin_step(step=0)
    groups = fill(window, step=0)
    finish(window, groups[0])
    assert window.groups_to_draw() == 0
    with pytest.raises(ValueError, match="the window is full"):
        add(window, "one-too-many", step=0)
