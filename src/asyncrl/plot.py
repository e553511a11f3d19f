"""`asyncrl plot METRICS.jsonl`: the curves a user checks first after a run, as one PNG.

Three panels over the training step, read from the trainer's `--metrics-file` (one JSON object per step):
the mean reward; the carry-over (rollouts carried into the next step, and the oldest carried group's age in
steps); and the step time (the whole step, and its update phase). Reading is pure (`read_curves`) and
forgiving where a live or crashed run leaves a file: a line cut short is skipped and counted, a step logged
twice keeps its last line, and a file written before the metrics took verl's names is read under the old
names (`asyncrl.metric_names.READ_ALIASES`). Drawing needs matplotlib (the `plot` extra), imported only here.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl import metric_names as names

REWARD = names.SCORE_MEAN
CARRY_OVER_ROLLOUTS = names.CARRY_OVER_ROLLOUTS
CARRY_OVER_AGE_MAX = names.CARRY_OVER_AGE_MAX
STEP_SECONDS = names.STEP_SECONDS
UPDATE_SECONDS = names.UPDATE_PHASE_SECONDS
PLOTTED = (REWARD, CARRY_OVER_ROLLOUTS, CARRY_OVER_AGE_MAX, STEP_SECONDS, UPDATE_SECONDS)


class PlotError(Exception):
    """Why no plot can be drawn, in one line for the user."""


@dataclass(frozen=True)
class Curves:
    """The plotted series by metric name, aligned with `steps` (NaN where a step lacks the metric)."""

    steps: tuple[int, ...]
    series: Mapping[str, tuple[float, ...]]
    skipped_lines: int


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def read_curves(lines: Iterable[str], *, source: str = "the metrics file") -> Curves:
    """The step records of `lines`, ordered by step; a PlotError when there is none."""
    records: dict[int, Mapping[str, Any]] = {}
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            skipped += 1
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            skipped += 1
            continue
        # A step logged twice (a restarted trainer redid it): the last line wins. A file written before the
        # rename to verl's names is read through the alias table (`timing/step_seconds` as `timing_s/step`).
        records[step] = names.with_current_names(record)
    if not records:
        raise PlotError(
            f"{source} has no step records (expected one JSON object with an integer `step` per line, as "
            "`asyncrl trainer --metrics-file` and `asyncrl local run --metrics-file` write)"
        )
    steps = tuple(sorted(records))
    series = {metric: tuple(_number(records[step].get(metric)) for step in steps) for metric in PLOTTED}
    return Curves(steps=steps, series=series, skipped_lines=skipped)


def default_output(metrics_file: Path) -> Path:
    """Next to the metrics file, same stem: `run/metrics.jsonl` → `run/metrics.png`."""
    return metrics_file.with_suffix(".png")


def plot_hint(metrics_file: Path | None) -> str:
    """The line a finished local run prints, offering the curves."""
    if metrics_file is None:
        return "curves: pass --metrics-file FILE to keep the per-step metrics, then `asyncrl plot FILE`\n"
    return f"curves: asyncrl plot {metrics_file}  (writes {default_output(metrics_file)})\n"


def draw(curves: Curves, output: Path, *, title: str) -> None:
    """Write the three panels to `output` (PNG)."""
    try:
        import matplotlib
    except ImportError as error:
        raise PlotError("asyncrl plot needs matplotlib: pip install 'asyncrl[plot]'") from error
    matplotlib.use("Agg")  # files only; no display needed
    from matplotlib import pyplot

    steps = curves.steps
    figure, (reward, carry, timing) = pyplot.subplots(3, 1, sharex=True, figsize=(8, 9), layout="constrained")
    figure.suptitle(title)
    marker = "o" if len(steps) <= 60 else None

    reward.plot(steps, curves.series[REWARD], marker=marker, color="tab:green")
    reward.set_ylabel("mean reward")
    reward.set_title("Reward")

    carry.bar(
        steps, curves.series[CARRY_OVER_ROLLOUTS], color="tab:blue", alpha=0.6, label="carried rollouts"
    )
    carry.set_ylabel("rollouts carried over", color="tab:blue")
    carry.yaxis.get_major_locator().set_params(integer=True)
    age = carry.twinx()
    age.plot(steps, curves.series[CARRY_OVER_AGE_MAX], marker=marker, color="tab:red", label="max age")
    age.set_ylabel("oldest carried group (steps)", color="tab:red")
    age.yaxis.get_major_locator().set_params(integer=True)
    age.set_ylim(bottom=0)
    carry.set_title("Carry-over")

    timing.plot(steps, curves.series[STEP_SECONDS], marker=marker, label="step")
    timing.plot(steps, curves.series[UPDATE_SECONDS], linestyle="--", label="update phase")
    timing.set_ylabel("seconds")
    timing.set_xlabel("training step")
    timing.set_title("Step time")
    timing.legend(loc="upper right")
    timing.xaxis.get_major_locator().set_params(integer=True)

    for axes in (reward, carry, timing):
        axes.grid(alpha=0.3)
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=100)
    pyplot.close(figure)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("metrics_file", type=Path, metavar="METRICS.jsonl", help="the run's --metrics-file")
    parser.add_argument(
        "-o", "--output", type=Path, default=None, help="the PNG to write (default: next to METRICS.jsonl)"
    )


def run(args: argparse.Namespace) -> int:
    metrics_file: Path = args.metrics_file
    output: Path = args.output or default_output(metrics_file)
    try:
        try:
            text = metrics_file.read_text(encoding="utf-8", errors="replace")
        except OSError as error:
            raise PlotError(f"cannot read {metrics_file}: {error.strerror}") from error
        curves = read_curves(text.splitlines(), source=str(metrics_file))
        draw(curves, output, title=f"{metrics_file.name}: steps {curves.steps[0]} to {curves.steps[-1]}")
    except PlotError as error:
        print(f"asyncrl plot: {error}", file=sys.stderr)
        return 2
    if curves.skipped_lines:
        print(
            f"asyncrl plot: skipped {curves.skipped_lines} line(s) that are not step records", file=sys.stderr
        )
    print(f"wrote {output} ({len(curves.steps)} steps)")
    return 0
