"""Invariants of the async window under random runs: random completion orders, failures, ages and restarts.

A simulation drives the window through many steps the way the trainer's step loop does and keeps its own
ledger of every rollout, so each step can be checked against what the window should have done.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from asyncrl.api.types.spec import AsyncSpec
from asyncrl.rollouts import TERMINAL_STATES, RolloutState
from asyncrl.trainer.window import (
    Group,
    RolloutWindow,
    StalenessPolicy,
    StepSummary,
    TerminalOutcome,
    UpdateBatch,
    WindowConfig,
)

TERMINAL = sorted(TERMINAL_STATES)
FAILURES = [RolloutState.FAILED, RolloutState.TIMED_OUT, RolloutState.CANCELLED]


@st.composite
def window_configs(draw: st.DrawFn, *, bounded_async: bool = False) -> WindowConfig:
    """Any valid window; with `bounded_async`, async windows with a small maximum carry-over age."""
    train_batch_size = draw(st.integers(1, 4))
    async_enabled = bounded_async or draw(st.booleans())
    max_ages = st.integers(1, 2) if bounded_async else st.none() | st.integers(1, 3)
    return WindowConfig(
        train_batch_size=train_batch_size,
        samples_per_prompt=draw(st.integers(1, 4)),
        async_enabled=async_enabled,
        async_window_size=train_batch_size + draw(st.integers(1, 4)) if async_enabled else None,
        max_carry_over_age_steps=draw(max_ages),
        staleness_policy=draw(st.sampled_from(StalenessPolicy)),
        refill_during_collection=draw(st.booleans()),
    )


class Simulation:
    """The trainer's step loop with random agents, plus a ledger of what the window must have done."""

    def __init__(self, config: WindowConfig, rng: random.Random, *, failure_rate: float) -> None:
        self.config = config
        self.rng = rng
        self.failure_rate = failure_rate
        self.window = RolloutWindow(config)
        # The ledger: everything the simulation itself knows.
        self.rollouts_of: dict[str, tuple[str, ...]] = {}
        self.enqueued_step: dict[str, int] = {}
        self.speed: dict[str, float] = {}  # slow groups linger and grow old
        self.group_of: dict[str, str] = {}
        self.states: dict[str, RolloutState] = {}
        self.active: list[str] = []  # group ids in enqueue order
        self.completion_order: list[str] = []
        self.consumed: Counter[str] = Counter()
        self.cancelled: Counter[str] = Counter()
        self.last_summary: StepSummary | None = None
        self.n_drawn = 0

    # One step, in the documented call order.

    def run_step(self, step: int) -> None:
        self.begin(step)
        cancelled = self.apply_staleness_policy(step)
        self.draw(step)
        self.complete_until_ready(step)
        batch = self.window.take_update_batch(step=step)
        self.check_batch(batch, step=step, n_cancelled=len(cancelled))
        if self.rng.random() < 0.15:
            event("trainer restarted")
            self.restart_trainer()

    def begin(self, step: int) -> None:
        self.window.begin_step(step=step)
        assert [group.group_id for group in self.window.active_groups] == self.active
        expected_stale = [gid for gid in self.active if self.is_stale(gid, step)]
        assert [group.group_id for group in self.window.stale_groups(step=step)] == expected_stale

    def apply_staleness_policy(self, step: int) -> list[Group]:
        expected_stale = [gid for gid in self.active if self.is_stale(gid, step)]
        cancelled = self.window.apply_staleness_policy(step=step)
        if self.config.staleness_policy is StalenessPolicy.KEEP:
            assert cancelled == []
            return cancelled
        assert [group.group_id for group in cancelled] == expected_stale
        if cancelled:
            event("stale groups cancelled")
        for group in cancelled:
            self.active.remove(group.group_id)
            self.cancelled.update(group.rollout_ids)
            assert group.rollout_ids == self.rollouts_of[group.group_id]
        assert self.window.stale_groups(step=step) == []
        return cancelled

    def draw(self, step: int) -> None:
        config = self.config
        n_new = self.window.groups_to_draw()
        unfinished = [gid for gid in self.active if not self.is_complete(gid)]
        if config.refills:  # window_size unfinished groups, within max_groups
            room = config.window_size + config.train_batch_size - 1 - len(self.active)
            assert n_new == max(0, min(config.window_size - len(unfinished), room))
        elif config.async_enabled:
            assert n_new == config.window_size - len(self.active)
        else:
            assert self.active == []  # sync carries nothing, so each step starts empty
            assert n_new == config.train_batch_size
        for _ in range(n_new):
            group_id = f"s{step}g{self.n_drawn}"
            self.n_drawn += 1
            rollout_ids = tuple(f"{group_id}r{i}" for i in range(self.config.samples_per_prompt))
            group = self.window.add_group(group_id=group_id, rollout_ids=rollout_ids, step=step)
            assert group.enqueued_step == step
            self.rollouts_of[group_id] = rollout_ids
            self.enqueued_step[group_id] = step
            self.speed[group_id] = self.rng.choice([1.0, 1.0, 1.0, 0.01])
            self.group_of.update(dict.fromkeys(rollout_ids, group_id))
            self.active.append(group_id)
        assert self.window.groups_to_draw() == 0
        self.check_capacity()
        if not config.refills:
            assert len(self.active) == config.window_size

    def check_capacity(self) -> None:
        """At most window_size groups unfinished; refilled windows keep that many while there is room."""
        config = self.config
        unfinished = [gid for gid in self.active if not self.is_complete(gid)]
        assert len(unfinished) <= config.window_size
        assert self.window.n_unfinished_groups == len(unfinished)
        if config.refills:
            max_groups = config.window_size + config.train_batch_size - 1
            assert len(self.active) <= max_groups
            assert len(unfinished) == config.window_size or len(self.active) == max_groups
        else:
            assert len(self.active) <= config.window_size

    # Agents finishing, in a random order, with duplicate and late reports mixed in.

    def complete_until_ready(self, step: int) -> None:
        while not self.expected_ready():
            assert not self.window.ready_for_update()
            self.report_something()
            if self.config.refills and not self.expected_ready():
                event("refilled during collection")
                self.draw(step)  # as the step loop does after each page of completions
        assert self.window.ready_for_update()
        for _ in range(self.rng.randint(0, 3)):  # more finish while the trainer gets to the update
            if self.pending():
                self.finish_one()

    def report_something(self) -> None:
        roll = self.rng.random()
        if roll < 0.1 and self.states:
            rollout_id = self.rng.choice(sorted(self.states))
            outcome = self.window.record_terminal(rollout_id, self.rng.choice(TERMINAL))
            gone = self.consumed[rollout_id] or self.cancelled[rollout_id]
            assert outcome is (TerminalOutcome.UNKNOWN if gone else TerminalOutcome.DUPLICATE)
            event("late report" if gone else "duplicate report")
        elif roll < 0.15 and self.cancelled:
            rollout_id = self.rng.choice(sorted(self.cancelled))
            assert self.window.record_terminal(rollout_id, RolloutState.CANCELLED) is TerminalOutcome.UNKNOWN
        else:
            self.finish_one()

    def finish_one(self) -> None:
        pending = self.pending()
        rollout_id = self.rng.choices(pending, weights=[self.speed[self.group_of[r]] for r in pending])[0]
        failed = self.rng.random() < self.failure_rate
        state = self.rng.choice(FAILURES) if failed else RolloutState.SUCCEEDED
        self.states[rollout_id] = state
        group_id = self.group_of[rollout_id]
        completes = all(r in self.states for r in self.rollouts_of[group_id])
        outcome = self.window.record_terminal(rollout_id, state)
        assert outcome is (TerminalOutcome.GROUP_COMPLETED if completes else TerminalOutcome.RECORDED)
        if completes:
            self.completion_order.append(group_id)

    def pending(self) -> list[str]:
        return [r for gid in self.active for r in self.rollouts_of[gid] if r not in self.states]

    # What the window must answer.

    def is_complete(self, group_id: str) -> bool:
        return all(r in self.states for r in self.rollouts_of[group_id])

    def is_stale(self, group_id: str, step: int) -> bool:
        max_age = self.config.max_carry_over_age_steps
        return max_age is not None and step - self.enqueued_step[group_id] > max_age

    def expected_ready(self) -> bool:
        n_complete = sum(self.is_complete(gid) for gid in self.active)
        if self.config.async_enabled:
            return n_complete >= self.config.train_batch_size
        return len(self.active) == n_complete == self.config.train_batch_size

    def check_batch(self, batch: UpdateBatch, *, step: int, n_cancelled: int) -> None:
        config = self.config
        n = config.samples_per_prompt
        in_completion_order = [gid for gid in self.completion_order if gid in self.active]
        expected_consumed = in_completion_order[: config.train_batch_size]
        assert [group.group_id for group in batch.consumed] == expected_consumed
        for group in batch.consumed:  # group integrity: whole, exactly n members, all terminal
            assert group.rollout_ids == self.rollouts_of[group.group_id]
            assert len(group.rollout_ids) == n
            assert group.terminal_states == {r: self.states[r] for r in group.rollout_ids}
            if config.staleness_policy is StalenessPolicy.CANCEL and config.max_carry_over_age_steps:
                assert group.age_steps(step) <= config.max_carry_over_age_steps
            self.active.remove(group.group_id)
            self.consumed.update(group.rollout_ids)
        assert [group.group_id for group in batch.carried_over] == self.active
        assert [group.group_id for group in self.window.active_groups] == self.active
        if not config.async_enabled:  # sync is "wait for all": the step's whole batch, nothing carried
            assert {group.enqueued_step for group in batch.consumed} == {step}
            assert batch.carried_over == ()

        if any(group.is_complete for group in batch.carried_over):
            event("complete group carried over")
        ages = [step + 1 - self.enqueued_step[gid] for gid in self.active]
        if ages and config.max_carry_over_age_steps and max(ages) > config.max_carry_over_age_steps:
            event(f"carried past the max age ({config.staleness_policy})")
        assert [group.age_steps(step + 1) for group in batch.carried_over] == ages
        summary = batch.summary
        previous_carry_over = self.last_summary.n_new_carry_over_rollouts if self.last_summary else 0
        assert summary.step == batch.step == step
        assert summary.n_prev_carry_over_rollouts == previous_carry_over
        assert summary.n_completed_rollouts == config.train_batch_size * n
        assert summary.n_new_carry_over_rollouts == len(self.active) * n == self.window.n_active_rollouts
        assert summary.new_carry_over_age_max_steps == max(ages, default=0)
        assert summary.carry_over_age_histogram == Counter(ages)
        assert summary.n_stale_groups_cancelled == n_cancelled
        assert summary.n_failed_rollouts_consumed == sum(
            self.states[r] is not RolloutState.SUCCEEDED
            for group in batch.consumed
            for r in group.rollout_ids
        )
        assert (summary.proxy_inflight_at_pause, summary.proxy_drain_seconds) == (0, 0.0)
        assert set(summary.metrics()) >= {
            f"training/async/{name}"
            for name in (
                "n_prev_carry_over_rollouts",
                "n_completed_rollouts",
                "n_new_carry_over_rollouts",
                "new_carry_over_age_max_steps",
                "proxy_inflight_at_pause",
                "proxy_drain_seconds",
            )
        }
        self.last_summary = summary

    def restart_trainer(self) -> None:
        """Rebuild the window as a restarted trainer would, from copies of what the gateway holds."""
        held = [
            Group(
                group_id=group.group_id,
                enqueued_step=group.enqueued_step,
                rollout_ids=group.rollout_ids,
                terminal_states=dict(group.terminal_states),
                completion_sequence=group.completion_sequence,
            )
            for group in self.window.active_groups
        ]
        self.window = RolloutWindow.restore(self.config, held)

    def check_ledger(self) -> None:
        """No rollout lost or counted twice: each is consumed once, cancelled once, or still active."""
        added = set(self.group_of)
        active = {r for group in self.window.active_groups for r in group.rollout_ids}
        consumed, cancelled = set(self.consumed), set(self.cancelled)
        assert all(count == 1 for count in self.consumed.values())
        assert all(count == 1 for count in self.cancelled.values())
        assert not consumed & cancelled
        assert not consumed & active
        assert not cancelled & active
        assert consumed | cancelled | active == added


@settings(max_examples=500, deadline=None)
@given(
    config=window_configs(),
    rng=st.randoms(use_true_random=True),
    n_steps=st.integers(1, 12),
    failure_rate=st.sampled_from([0.0, 0.2, 0.6]),
)
def test_window_invariants_hold_over_random_runs(
    config: WindowConfig, rng: random.Random, n_steps: int, failure_rate: float
) -> None:
    simulation = Simulation(config, rng, failure_rate=failure_rate)
    for step in range(n_steps):
        simulation.run_step(step)
    simulation.check_ledger()


@settings(max_examples=200, deadline=None)
@given(
    config=window_configs(bounded_async=True),
    rng=st.randoms(use_true_random=True),
    n_steps=st.integers(4, 12),
)
def test_window_invariants_hold_under_bounded_staleness(
    config: WindowConfig, rng: random.Random, n_steps: int
) -> None:
    simulation = Simulation(config, rng, failure_rate=0.2)
    for step in range(n_steps):
        simulation.run_step(step)
    simulation.check_ledger()


@settings(max_examples=50, deadline=None)
@given(
    train_batch_size=st.integers(1, 64),
    async_window_size=st.none() | st.integers(1, 128),
)
def test_async_config_is_valid_exactly_when_the_window_exceeds_the_batch(
    train_batch_size: int, async_window_size: int | None
) -> None:
    def make() -> WindowConfig:
        return AsyncSpec(enabled=True, window_size=async_window_size).window_config(
            train_batch_size=train_batch_size, samples_per_prompt=1
        )

    if async_window_size is not None and async_window_size > train_batch_size:
        assert make().window_size == async_window_size
    else:
        with pytest.raises(ValueError, match=f"try windowSize: {2 * train_batch_size} "):
            make()
