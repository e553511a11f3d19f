"""The pure parts of the staleness-correction benchmark (issue 27 item 2): what one run's eval curve says
(the mean of its last steps, the first step reaching a threshold), how a setting at age k compares with the
same setting at age 0 (sync), and the table. No I/O and no torch, so the figures are tested on made-up
curves; benchmarks/staleness_correction.py trains the model and feeds them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from time_to_reward_stats import Spread, spread_over_seeds


@dataclass(frozen=True)
class RunCurve:
    """One (setting, age, seed) run: the eval reward after each update, and what its updates saw."""

    setting: str
    age: int
    seed: int
    eval_rewards: tuple[float, ...]  # [0] before any update, [n] after n updates
    behaviour_versions: tuple[int, ...]  # per update: the policy version that sampled what it trained on
    weight_means: tuple[float | None, ...]  # per update: mean importance weight of trained tokens
    weight_maxes: tuple[float | None, ...]
    masked_fractions: tuple[float | None, ...]  # per update: share of tokens rejection masked (None: off)
    seconds: float

    @property
    def steps(self) -> int:
        return len(self.eval_rewards) - 1


def last_mean(rewards: Sequence[float], *, last: int) -> float:
    """Mean eval reward of the last `last` updates (the curve's entry 0, before training, never counts)."""
    trained = rewards[1:]
    if not trained:
        raise ValueError("the curve has no step after an update")
    return statistics.fmean(trained[-last:])


def first_step_reaching(rewards: Sequence[float], *, threshold: float) -> int | None:
    """The first number of updates after which the eval reward is at least `threshold`; None if never."""
    for step, reward in enumerate(rewards):
        if reward >= threshold:
            return step
    return None


@dataclass(frozen=True)
class Row:
    """One setting at one age, over its seeds."""

    setting: str
    age: int
    last_mean: float
    last_low: float
    last_high: float
    to_threshold: dict[float, Spread]
    weight_mean: float | None
    weight_max: float | None
    masked_fraction: float | None
    seeds: int


def summarise(runs: Sequence[RunCurve], *, last: int, thresholds: Sequence[float]) -> Row:
    """One row from the runs of one setting and age (one per seed)."""
    if not runs or len({(r.setting, r.age) for r in runs}) != 1:
        raise ValueError("summarise takes the runs of exactly one setting and age")
    lasts = [last_mean(r.eval_rewards, last=last) for r in runs]
    means = [w for r in runs for w in r.weight_means if w is not None]
    maxes = [w for r in runs for w in r.weight_maxes if w is not None]
    masked = [m for r in runs for m in r.masked_fractions if m is not None]
    return Row(
        setting=runs[0].setting,
        age=runs[0].age,
        last_mean=statistics.fmean(lasts),
        last_low=min(lasts),
        last_high=max(lasts),
        to_threshold={
            t: spread_over_seeds(
                [
                    None if (s := first_step_reaching(r.eval_rewards, threshold=t)) is None else float(s)
                    for r in runs
                ]
            )
            for t in thresholds
        },
        weight_mean=statistics.fmean(means) if means else None,
        weight_max=max(maxes) if maxes else None,
        masked_fraction=statistics.fmean(masked) if masked else None,
        seeds=len(runs),
    )


def summarise_all(runs: Sequence[RunCurve], *, last: int, thresholds: Sequence[float]) -> list[Row]:
    """A row per (setting, age), in the order the runs first name them."""
    keys = list(dict.fromkeys((r.setting, r.age) for r in runs))
    return [
        summarise([r for r in runs if (r.setting, r.age) == key], last=last, thresholds=thresholds)
        for key in keys
    ]


def ratio(value: float | None, sync: float | None) -> float | None:
    """value / sync (the same setting at age 0); None when either is missing or sync is 0."""
    if value is None or sync is None or sync == 0:
        return None
    return value / sync


def sync_row(rows: Sequence[Row], setting: str) -> Row | None:
    """The setting's age-0 row, the sync figure its other ages are compared with."""
    return next((r for r in rows if r.setting == setting and r.age == 0), None)


def table_rows(rows: Sequence[Row], *, thresholds: Sequence[float]) -> list[list[str]]:
    """Cells of the printed table: one line per (setting, age)."""
    lines = []
    for row in rows:
        sync = sync_row(rows, row.setting)
        last_ratio = ratio(row.last_mean, sync.last_mean if sync else None)
        cells = [
            row.setting,
            str(row.age),
            f"{row.last_mean:.3f} [{row.last_low:.2f}-{row.last_high:.2f}]",
            _times(last_ratio),
        ]
        for t in thresholds:
            spread = row.to_threshold[t]
            sync_spread = sync.to_threshold[t] if sync else None
            steps_ratio = ratio(spread.median, sync_spread.median if sync_spread else None)
            median = "-" if spread.median is None else f"{spread.median:g}"
            cells.append(f"{median} ({spread.reached}/{spread.seeds}) {_times(steps_ratio)}")
        cells += [
            _number(row.weight_mean),
            _number(row.weight_max),
            "-" if row.masked_fraction is None else f"{100 * row.masked_fraction:.1f}%",
        ]
        lines.append(cells)
    return lines


def table_headers(*, last: int, thresholds: Sequence[float]) -> list[str]:
    return [
        "setting",
        "age",
        f"last-{last} reward",
        "x sync",
        *(f"step to {t:g} (x sync)" for t in thresholds),
        "IS mean",
        "IS max",
        "masked",
    ]


def ratio_to_sync(rows: Sequence[Row], *, setting: str, age: int) -> float | None:
    """The setting's last-steps reward at `age` over its own age-0 figure; None when either is missing.
    The issue's target (within 10 % of sync) holds when this is at least 0.9."""
    row = next((r for r in rows if r.setting == setting and r.age == age), None)
    sync = sync_row(rows, setting)
    if row is None or sync is None:
        return None
    return ratio(row.last_mean, sync.last_mean)


def _times(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
