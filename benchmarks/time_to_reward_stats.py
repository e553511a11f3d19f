"""The pure parts of the time-to-reward benchmark (issue 27): when a run first reaches a reward threshold,
the median and spread of that wall-clock over seeds, the age of the groups each update consumed (from the
trainer's log), and the run's rollout throughput as a share of its ideal bound. No I/O, so the figures are
tested on made-up inputs; benchmarks/time_to_reward.py drives the real local loop and feeds them.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StepPoint:
    """One training step of one run: its wall-clock since the run started and its mean reward."""

    step: int
    wall_seconds: float
    reward: float


@dataclass(frozen=True)
class Spread:
    """The median and range of a figure over seeds; `reached` counts the seeds that reached it at all."""

    median: float | None
    low: float | None
    high: float | None
    reached: int
    seeds: int


def seconds_to_reward(*, curve: Sequence[StepPoint], threshold: float) -> float | None:
    """Wall-clock of the first step whose reward is at least `threshold`; None when no step reaches it."""
    for point in sorted(curve, key=lambda p: p.step):
        if point.reward >= threshold:
            return point.wall_seconds
    return None


@dataclass(frozen=True)
class PolicyPoint:
    """One policy version of one run: when it began serving, and the mean reward of the rollouts drawn while
    it served (an evaluation of that policy by its own samples, the same reading for sync and async)."""

    version: int
    published_seconds: float
    reward: float
    rollouts: int


def policy_curve(
    *, drawn: Iterable[tuple[int, float]], published: Mapping[int, float], min_rollouts: int
) -> list[PolicyPoint]:
    """Per policy version, from (the step that drew a rollout, its reward) and when each version was published
    (version v serves from the end of update v - 1; version 0 from the start): the versions with at least
    `min_rollouts` rewarded rollouts, in order. A rollout counts for the version serving when it was drawn;
    its calls after a pause are served by the next one, so this reads a policy slightly better than it was."""
    rewards: dict[int, list[float]] = {}
    for step, reward in drawn:
        rewards.setdefault(step, []).append(reward)
    return [
        PolicyPoint(version, published[version], statistics.fmean(values), len(values))
        for version, values in sorted(rewards.items())
        if version in published and len(values) >= min_rollouts
    ]


def seconds_to_policy_reward(*, curve: Sequence[PolicyPoint], threshold: float) -> float | None:
    """When the first policy version whose rollouts' mean reward is at least `threshold` began serving."""
    for point in sorted(curve, key=lambda p: p.version):
        if point.reward >= threshold:
            return point.published_seconds
    return None


def spread_over_seeds(values: Sequence[float | None]) -> Spread:
    """Median and range of the seeds that reached the figure; the median is None unless most seeds did,
    so a configuration that rarely reaches a threshold is not reported as fast."""
    reached = sorted(v for v in values if v is not None)
    if not reached or 2 * len(reached) <= len(values):
        return Spread(median=None, low=None, high=None, reached=len(reached), seeds=len(values))
    return Spread(
        median=statistics.median(reached),
        low=reached[0],
        high=reached[-1],
        reached=len(reached),
        seeds=len(values),
    )


# "step 3: trained groups s1-0a1b2c3d4e5f s3-..." (the trainer's log): a group id starts with the step that
# drew it, so its consumed age is the update's step minus that one.
_TRAINED = re.compile(r"step (\d+): trained groups ((?:s\d+-\S+ ?)+)")


def consumed_ages(trainer_log: str) -> list[int]:
    """The age, in updates, of every group each update trained on, in log order."""
    ages: list[int] = []
    for match in _TRAINED.finditer(trainer_log):
        step = int(match.group(1))
        ages += [step - int(group[1:].split("-", 1)[0]) for group in match.group(2).split()]
    return ages


@dataclass(frozen=True)
class GroupTimes:
    """When a group's first rollout started and its last one finished (wall-clock seconds)."""

    group_id: str
    started: float
    finished: float


def group_times(rollouts: Iterable[tuple[str, float, float]]) -> list[GroupTimes]:
    """Groups from (rollout id, started, finished) of their rollouts; a rollout id is `<group id>-r<k>`."""
    spans: dict[str, tuple[float, float]] = {}
    for rollout_id, started, finished in rollouts:
        group_id = rollout_id.rsplit("-r", 1)[0]
        low, high = spans.get(group_id, (started, finished))
        spans[group_id] = (min(low, started), max(high, finished))
    return [GroupTimes(group_id, low, high) for group_id, (low, high) in sorted(spans.items())]


def ideal_groups_per_second(
    *, train_batch_size: int, window_size: int, update_seconds: float, group_seconds: float
) -> float:
    """The bound of benchmarks/async_vs_sync.py: per update the update is the only idle time, and between
    updates `window_size` groups run back to back, so `train_batch_size` of them finish in
    B x G / W seconds (Little's law). Sync is W = B."""
    return train_batch_size / (update_seconds + train_batch_size * group_seconds / window_size)


def throughput_share(
    *,
    update_times: Sequence[float],
    train_batch_size: int,
    window_size: int,
    update_seconds: float,
    group_seconds: float,
) -> float | None:
    """Groups trained per second between the first and the last update, over the ideal bound; None with
    fewer than two updates."""
    if len(update_times) < 2 or update_times[-1] <= update_times[0]:
        return None
    measured = train_batch_size * (len(update_times) - 1) / (update_times[-1] - update_times[0])
    ideal = ideal_groups_per_second(
        train_batch_size=train_batch_size,
        window_size=window_size,
        update_seconds=update_seconds,
        group_seconds=group_seconds,
    )
    return measured / ideal
