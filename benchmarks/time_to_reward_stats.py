"""The pure parts of the time-to-reward benchmark (issue 27): when a run first reaches a reward threshold,
and the median and spread of that wall-clock over seeds. No I/O, so the benchmark's figures are tested on
made-up curves; the runner that drives the real local loop is still to be written.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
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
