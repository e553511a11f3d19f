"""Properties of what the trainer prefetches and which prepared rows it may still train on.

`rollouts_to_prefetch` and `invalid_prepared` decide, without I/O, what `RowPrefetcher` fetches ahead of
the pause and what it throws away. A simulation drives a real `RolloutWindow` through random steps with
staleness cancellations, gateway restarts (every group lost and redrawn) and fetches that straddle a restart,
prefetching at random moments, and checks at every update that the rows used are exactly the ones a fetch at
the pause would have given: same rollouts, same terminal states, from the gateway holding the window.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.rollouts import TERMINAL_STATES, RolloutState
from asyncrl.trainer.adapter import AdapterCounts
from asyncrl.trainer.prefetch import PreparedRollout, invalid_prepared, rollouts_to_prefetch
from asyncrl.trainer.window import Group, RolloutWindow, StalenessPolicy, WindowConfig

TERMINAL = sorted(TERMINAL_STATES)


def _prepared(rollout_id: str, group_id: str, state: RolloutState, instance_id: str) -> PreparedRollout:
    return PreparedRollout(
        rollout_id=rollout_id,
        group_id=group_id,
        state=state,
        instance_id=instance_id,
        rows=(),
        counts=AdapterCounts(rollouts=1),
    )


@st.composite
def window_groups(draw: st.DrawFn) -> list[Group]:
    """Groups with random terminal states; complete ones numbered in a random completion order."""
    n_groups = draw(st.integers(0, 8))
    size = draw(st.integers(1, 4))
    groups = []
    for index in range(n_groups):
        rollout_ids = tuple(f"g{index}-r{member}" for member in range(size))
        finished = draw(st.lists(st.sampled_from(rollout_ids), unique=True))
        states = {rid: draw(st.sampled_from(TERMINAL)) for rid in finished}
        groups.append(
            Group(group_id=f"g{index}", enqueued_step=0, rollout_ids=rollout_ids, terminal_states=states)
        )
    complete = [group for group in groups if group.is_complete]
    order = draw(st.permutations(range(len(complete))))
    for group, sequence in zip(complete, order, strict=True):
        group.completion_sequence = sequence
    return groups


@given(groups=window_groups(), data=st.data())
def test_prefetch_takes_complete_groups_in_completion_order_and_skips_what_it_has(
    groups: list[Group], data: st.DataObject
) -> None:
    every_id = [rid for group in groups for rid in group.rollout_ids]
    skip = set(data.draw(st.lists(st.sampled_from(every_id)) if every_id else st.just([])))
    limit = data.draw(st.integers(1, 40))

    batch = rollouts_to_prefetch(groups, skip=skip, max_rollouts=limit)

    group_of = {rid: group for group in groups for rid in group.rollout_ids}
    assert len(batch) == len(set(batch)) <= limit
    assert not set(batch) & skip
    assert all(group_of[rid].is_complete for rid in batch)
    sequences = [group_of[rid].completion_sequence for rid in batch]
    assert sequences == sorted(sequences)  # earliest completed (first consumed) first
    wanted = [rid for rid in every_id if group_of[rid].is_complete and rid not in skip]
    if len(batch) < limit:
        assert set(batch) == set(wanted)  # nothing wanted is left behind when there was room
    else:
        assert len(batch) == min(limit, len(wanted))


@given(groups=window_groups(), data=st.data())
def test_a_prepared_rollout_is_valid_only_in_its_group_with_its_state_from_the_current_gateway(
    groups: list[Group], data: st.DataObject
) -> None:
    candidates = [(rid, group.group_id) for group in groups for rid in group.rollout_ids] + [
        ("gone-r0", "gone")
    ]
    entries = {}
    for rollout_id, group_id in data.draw(st.lists(st.sampled_from(candidates), unique=True)):
        state = data.draw(st.sampled_from(TERMINAL))
        instance = data.draw(st.sampled_from(["now", "before"]))
        entries[rollout_id] = _prepared(rollout_id, group_id, state, instance)

    invalid = set(invalid_prepared(entries, groups, instance_id="now"))

    by_id = {group.group_id: group for group in groups}
    for rollout_id, entry in entries.items():
        group = by_id.get(entry.group_id)
        expected_valid = (
            group is not None
            and group.terminal_states.get(rollout_id) is entry.state
            and entry.instance_id == "now"
        )
        assert (rollout_id not in invalid) == expected_valid, entry


@st.composite
def async_configs(draw: st.DrawFn) -> WindowConfig:
    train_batch_size = draw(st.integers(1, 3))
    async_enabled = draw(st.booleans())
    return WindowConfig(
        train_batch_size=train_batch_size,
        samples_per_prompt=draw(st.integers(1, 3)),
        async_enabled=async_enabled,
        async_window_size=train_batch_size + draw(st.integers(1, 3)) if async_enabled else None,
        max_carry_over_age_steps=draw(st.none() | st.integers(1, 2)),
        staleness_policy=draw(st.sampled_from(StalenessPolicy)),
        refill_during_collection=draw(st.booleans()),
    )


@settings(max_examples=150, deadline=None)
@given(config=async_configs(), seed=st.integers(0, 2**32 - 1))
def test_rows_prepared_ahead_are_exactly_what_a_fetch_at_the_pause_would_give(
    config: WindowConfig, seed: int
) -> None:
    rng = random.Random(seed)
    window = RolloutWindow(config)
    instance, restarts = "gateway-0", 0
    prepared: dict[str, PreparedRollout] = {}
    in_flight: list[PreparedRollout] = []  # fetched from a gateway, not yet stored (it may restart meanwhile)
    ever_trained: set[str] = set()
    counter = 0

    def prune() -> None:
        for rollout_id in invalid_prepared(prepared, window.active_groups, instance_id=instance):
            del prepared[rollout_id]

    def fetch_now(group: Group, rollout_id: str) -> PreparedRollout:
        """What the gateway holding the window serves: the terminal state it recorded."""
        return _prepared(rollout_id, group.group_id, group.terminal_states[rollout_id], instance)

    def prefetch() -> None:
        groups = window.active_groups
        ids = rollouts_to_prefetch(groups, skip=prepared.keys(), max_rollouts=rng.randint(1, 4))
        group_of = {rid: group for group in groups for rid in group.rollout_ids}
        in_flight.extend(fetch_now(group_of[rid], rid) for rid in ids)

    def land() -> None:
        """Fetched documents arrive and are stored; the prefetcher prunes right after storing."""
        for entry in in_flight:
            prepared[entry.rollout_id] = entry
        in_flight.clear()
        prune()

    def draw_groups(step: int) -> None:
        nonlocal counter
        for _ in range(window.groups_to_draw()):
            counter += 1
            ids = [f"g{counter}-r{member}" for member in range(config.samples_per_prompt)]
            window.add_group(group_id=f"g{counter}", rollout_ids=ids, step=step)

    for step in range(6):
        window.begin_step(step=step)
        window.apply_staleness_policy(step=step)  # cancelled stale groups leave the window
        prune()
        draw_groups(step)
        while not window.ready_for_update():
            unfinished = [
                (group, rid)
                for group in window.active_groups
                for rid in group.rollout_ids
                if rid not in group.terminal_states
            ]
            action = rng.random()
            if action < 0.05 and restarts < 2:  # the gateway restarts: every group is lost and redrawn
                restarts += 1
                instance = f"gateway-{restarts}"
                window.drop_groups([group.group_id for group in window.active_groups])
                draw_groups(step)
            elif action < 0.25:
                prefetch()
            elif action < 0.4:
                land()
            elif unfinished:
                _, rollout_id = rng.choice(unfinished)
                window.record_terminal(rollout_id, rng.choice(TERMINAL))
            if config.refills and not window.ready_for_update():
                draw_groups(step)
        land()
        prune()
        groups = window.update_groups()
        used = {
            rid: prepared.get(rid) or fetch_now(group, rid) for group in groups for rid in group.rollout_ids
        }
        expected = {rid: fetch_now(group, rid) for group in groups for rid in group.rollout_ids}
        assert used == expected
        assert not set(used) & ever_trained, "a rollout was trained twice"
        ever_trained |= set(used)
        batch = window.take_update_batch(step=step)
        assert batch.consumed == groups
        prune()
        consumed = {group.group_id for group in batch.consumed}
        assert not any(entry.group_id in consumed for entry in prepared.values())
        active = {group.group_id for group in window.active_groups}
        assert all(entry.group_id in active and entry.instance_id == instance for entry in prepared.values())
