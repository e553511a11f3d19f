"""The GPU smoke's strict checks, on metric files in the trainer's format, and its cleanup on real processes.

The files in smoke_records/ are written in the shape `JsonLinesSink` writes (the trainer's metric names,
non-finite values left out); they were made for these tests, not recorded on a GPU: one good run of three
steps and one file per way a smoke can look fine by its exit code and still prove nothing.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
RECORDS = Path(__file__).resolve().parent / "smoke_records"
ONE_START = "2026-12-03 10:00:00 INFO asyncrl.trainer.main preflight:\nok    packages: ...\n"


def load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


check = load("gpu_smoke_check")


def verdict_of(record: str, *, trainer_log: str = ONE_START) -> object:
    return check.verdict(check.read_metrics(RECORDS / f"{record}.jsonl"), steps=3, trainer_log=trainer_log)


def test_a_good_run_passes_and_prints_what_was_checked_per_step() -> None:
    result = verdict_of("good")
    assert result.problems == []
    lines = result.table.splitlines()
    assert lines[0].split() == [
        "step",
        "rows",
        "version",
        "loss",
        "grad_norm",
        "is_mean",
        "probs_diff",
        "pearson",
    ]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["0", "16", "1"],
        ["1", "16", "2"],
        ["2", "16", "3"],
    ]


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        ("no_rows", "step 1: trained no rows"),
        ("version_not_advanced", "step 2: model_version is 2.0, expected 3"),
        ("loss_not_finite", "step 1: actor/pg_loss is missing or not finite"),
        ("no_rollout_correction", "step 0: no rollout-correction metrics"),
        ("dummy_weights", "is vLLM serving the trained weights?"),
        ("dropped_calls", "step 0: training/adapter/dropped_calls_without_tokens = 16.0"),
        ("step_repeated", "steps logged more than once: [1]"),
    ],
)
def test_each_kind_of_hollow_run_fails_and_says_why(record: str, expected: str) -> None:
    problems = verdict_of(record).problems
    assert problems, record
    assert any(expected in problem for problem in problems), problems


def test_a_restarted_trainer_or_missing_steps_fail() -> None:
    restarted = verdict_of("good", trainer_log=ONE_START * 2).problems
    assert restarted == ["the trainer started 2 times, expected once"]
    rows = check.read_metrics(RECORDS / "good.jsonl")[:2]
    short = check.verdict(rows, steps=3, trainer_log=ONE_START).problems
    assert short == ["steps logged: [0, 1], expected 0..2"]


def test_the_cli_exits_1_with_the_reasons(tmp_path: Path) -> None:
    log = tmp_path / "trainer.log"
    log.write_text(ONE_START)
    command = [sys.executable, str(BENCHMARKS / "gpu_smoke_check.py"), "--steps=3", f"--trainer-log={log}"]
    good = subprocess.run(
        [*command, f"--metrics-file={RECORDS / 'good.jsonl'}"], capture_output=True, text=True
    )
    assert good.returncode == 0, good.stdout + good.stderr
    bad = subprocess.run(
        [*command, f"--metrics-file={RECORDS / 'no_rows.jsonl'}"], capture_output=True, text=True
    )
    assert bad.returncode == 1
    assert "FAIL step 1: trained no rows" in bad.stdout


def test_the_cleanup_stops_every_process_group_of_the_run(tmp_path: Path) -> None:
    """A run whose children sit in their own sessions (as local mode's gateway and trainer do)."""
    smoke = load("gpu_smoke")
    script = (
        "import subprocess, sys, time\n"
        "sleeper = [sys.executable, '-c', 'import time; time.sleep(600)']\n"
        "for _ in range(2):\n"
        "    subprocess.Popen(sleeper, start_new_session=True)\n"
        "time.sleep(600)\n"
    )
    run = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.monotonic() + 60
    while len(smoke.process_groups(run.pid)) < 3:
        assert time.monotonic() < deadline, "the children did not start"
        time.sleep(0.2)
    groups = smoke.process_groups(run.pid)
    assert groups[0] == run.pid
    smoke.stop_process_tree(run.pid, grace_seconds=10)
    run.wait(timeout=10)
    for group in groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)
