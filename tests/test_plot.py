"""`asyncrl plot`: a run's metrics file read forgivingly, drawn as one PNG, bad input named in one line."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.plot import CARRY_OVER_AGE_MAX, REWARD, STEP_SECONDS, PlotError, plot_hint, read_curves

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _line(step: int, **metrics: float) -> str:
    names = {"reward": REWARD, "age": CARRY_OVER_AGE_MAX, "seconds": STEP_SECONDS}
    return json.dumps({"step": step, **{names[key]: value for key, value in metrics.items()}})


def _plot(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "plot", *args], capture_output=True, text=True, timeout=120
    )


def test_a_line_cut_short_and_foreign_lines_are_skipped_and_counted() -> None:
    curves = read_curves([_line(0, reward=0.1), '{"step": 1, "training/rew', "[1, 2]", '{"step": true}', ""])
    assert curves.steps == (0,)
    assert curves.skipped_lines == 3


def test_a_step_logged_twice_keeps_its_last_line_and_steps_are_ordered() -> None:
    curves = read_curves([_line(2, reward=0.9), _line(0, reward=0.1), _line(2, reward=0.5)])
    assert curves.steps == (0, 2)
    assert curves.series[REWARD] == (0.1, 0.5)


def test_a_metric_a_step_lacks_is_a_gap_not_a_zero() -> None:
    curves = read_curves([_line(0, reward=0.1, age=1), _line(1, reward=0.2)])
    assert curves.series[CARRY_OVER_AGE_MAX][0] == 1
    assert math.isnan(curves.series[CARRY_OVER_AGE_MAX][1])


def test_a_file_written_before_the_rename_to_verls_names_still_plots(tmp_path: Path) -> None:
    old = [
        {"step": step, "training/reward_mean": step / 10, "timing/step_seconds": 2.0 + step}
        | {"training/async/new_carry_over_age_max_steps": 1, "timing/update_phase_seconds": 0.5}
        for step in range(3)
    ]
    curves = read_curves([json.dumps(line) for line in old])
    assert curves.series[REWARD] == (0.0, 0.1, 0.2)  # critic/score/mean, read from training/reward_mean
    assert curves.series[STEP_SECONDS] == (2.0, 3.0, 4.0)  # timing_s/step, from timing/step_seconds
    assert curves.series[CARRY_OVER_AGE_MAX] == (1, 1, 1)
    metrics = tmp_path / "old.jsonl"
    metrics.write_text("\n".join(json.dumps(line) for line in old))
    done = _plot(str(metrics))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "old.png").read_bytes().startswith(PNG_SIGNATURE)


def test_a_current_name_wins_over_an_old_one_in_the_same_line() -> None:
    line = json.dumps({"step": 0, "training/reward_mean": 0.1, REWARD: 0.7})
    assert read_curves([line]).series[REWARD] == (0.7,)


def test_a_file_without_step_records_names_itself_and_what_was_expected() -> None:
    with pytest.raises(PlotError, match=r"run\.jsonl has no step records .*--metrics-file"):
        read_curves(["not json", '{"loss": 1}'], source="run.jsonl")


def test_the_plot_is_written_next_to_the_metrics_file_by_default(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "\n".join(_line(step, reward=step / 10, age=step % 3, seconds=2.0) for step in range(5))
    )
    done = _plot(str(metrics))
    assert done.returncode == 0, done.stderr
    assert f"wrote {tmp_path / 'metrics.png'} (5 steps)" in done.stdout
    assert (tmp_path / "metrics.png").read_bytes().startswith(PNG_SIGNATURE)

    elsewhere = tmp_path / "out" / "curves.png"
    done = _plot(str(metrics), "-o", str(elsewhere))
    assert done.returncode == 0, done.stderr
    assert elsewhere.read_bytes().startswith(PNG_SIGNATURE)


def test_a_missing_or_empty_file_is_one_line_on_stderr_and_exit_2(tmp_path: Path) -> None:
    missing = _plot(str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2
    assert (
        missing.stderr.strip()
        == f"asyncrl plot: cannot read {tmp_path / 'nope.jsonl'}: No such file or directory"
    )
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    done = _plot(str(empty))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "has no step records" in done.stderr
    assert not (tmp_path / "empty.png").exists()
    binary = tmp_path / "image.jsonl"
    binary.write_bytes(PNG_SIGNATURE + bytes(range(256)))
    assert _plot(str(binary)).returncode == 2


def test_the_end_of_a_local_run_offers_the_plot_command() -> None:
    assert plot_hint(Path("runs/metrics.jsonl")) == (
        "curves: asyncrl plot runs/metrics.jsonl  (writes runs/metrics.png)\n"
    )
    assert "--metrics-file" in plot_hint(None)
