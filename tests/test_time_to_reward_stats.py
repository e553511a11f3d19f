"""The time-to-reward benchmark's pure parts (benchmarks/time_to_reward_stats.py) on made-up curves."""

from __future__ import annotations

from types import ModuleType

from tests.support.benchmark_scripts import load_benchmark


def _load() -> ModuleType:
    return load_benchmark("time_to_reward_stats")


ttr = _load()


def _curve(rewards: list[float]) -> list[object]:
    return [ttr.StepPoint(step=i + 1, wall_seconds=10.0 * (i + 1), reward=r) for i, r in enumerate(rewards)]


def test_first_step_at_or_above_the_threshold_is_the_crossing() -> None:
    curve = _curve([0.1, 0.3, 0.2, 0.7])
    assert ttr.seconds_to_reward(curve=curve, threshold=0.3) == 20.0
    assert ttr.seconds_to_reward(curve=curve, threshold=0.6) == 40.0


def test_a_threshold_never_reached_has_no_crossing() -> None:
    assert ttr.seconds_to_reward(curve=_curve([0.1, 0.2]), threshold=0.9) is None


def test_median_and_range_over_the_seeds_that_reached() -> None:
    spread = ttr.spread_over_seeds([30.0, 10.0, 20.0])
    assert (spread.median, spread.low, spread.high, spread.reached, spread.seeds) == (20.0, 10.0, 30.0, 3, 3)


def test_no_median_when_most_seeds_never_reached() -> None:
    spread = ttr.spread_over_seeds([5.0, None, None])
    assert spread.median is None
    assert (spread.reached, spread.seeds) == (1, 3)


def test_consumed_age_is_the_update_step_minus_the_step_that_drew_the_group() -> None:
    log = (
        "2026-01-01 INFO asyncrl.trainer.loop step 0: trained groups s0-aa s0-bb\n"
        "2026-01-01 INFO asyncrl.trainer.loop step 0: reward 0.1\n"
        "2026-01-01 INFO asyncrl.trainer.loop step 3: trained groups s1-cc s3-dd\n"
    )
    assert ttr.consumed_ages(log) == [0, 0, 2, 0]


def test_a_group_spans_its_first_start_to_its_last_finish() -> None:
    groups = ttr.group_times([("s0-aa-r0", 1.0, 4.0), ("s0-aa-r1", 2.0, 9.0), ("s1-bb-r0", 5.0, 6.0)])
    assert groups == [ttr.GroupTimes("s0-aa", 1.0, 9.0), ttr.GroupTimes("s1-bb", 5.0, 6.0)]


def test_a_run_at_its_ideal_bound_has_a_share_of_one() -> None:
    # B=4, W=8, u=1 s, G=4 s: the bound is 4 / (1 + 4 * 4 / 8) = 4/3 groups/s, so an update every 3 s.
    ideal = ttr.ideal_groups_per_second(
        train_batch_size=4, window_size=8, update_seconds=1.0, group_seconds=4.0
    )
    assert ideal == 4 / 3
    share = ttr.throughput_share(
        update_times=[10.0, 13.0, 16.0],
        train_batch_size=4,
        window_size=8,
        update_seconds=1.0,
        group_seconds=4.0,
    )
    assert share == 1.0
    slower = ttr.throughput_share(
        update_times=[10.0, 16.0, 22.0],
        train_batch_size=4,
        window_size=8,
        update_seconds=1.0,
        group_seconds=4.0,
    )
    assert slower == 0.5
    assert (
        ttr.throughput_share(
            update_times=[10.0], train_batch_size=4, window_size=8, update_seconds=1.0, group_seconds=4.0
        )
        is None
    )


def test_a_policy_version_is_read_from_the_rollouts_drawn_while_it_served() -> None:
    drawn = [(0, 0.0), (0, 0.2), (1, 0.5), (1, 0.7), (2, 1.0)]  # (the step that drew it, its reward)
    published = {0: 0.0, 1: 12.0, 2: 25.0, 3: 40.0}
    curve = ttr.policy_curve(drawn=drawn, published=published, min_rollouts=2)
    assert [(p.version, p.published_seconds, p.rollouts) for p in curve] == [(0, 0.0, 2), (1, 12.0, 2)]
    assert [round(p.reward, 6) for p in curve] == [0.1, 0.6]  # version 2 had too few rollouts to be read
    assert ttr.seconds_to_policy_reward(curve=curve, threshold=0.5) == 12.0
    assert ttr.seconds_to_policy_reward(curve=curve, threshold=0.9) is None


def test_a_version_never_published_is_not_read() -> None:
    """Rollouts of a step whose update never ended (the run was stopped) have no time to be placed at."""
    curve = ttr.policy_curve(drawn=[(5, 1.0), (5, 1.0)], published={0: 0.0}, min_rollouts=1)
    assert curve == []
