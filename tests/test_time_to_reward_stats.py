"""The time-to-reward benchmark's pure parts (benchmarks/time_to_reward_stats.py) on made-up curves."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "time_to_reward_stats.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("time_to_reward_stats", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["time_to_reward_stats"] = module
    spec.loader.exec_module(module)
    return module


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
