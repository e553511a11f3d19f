"""Local mode end to end: gateway, trainer (reference backend) and agents as real local processes.

Nothing is stood in: the toy agent from examples/ calls the tiny reference model through the gateway, the
trainer updates it with verl's GRPO code, and metrics land in a JSON-lines file and an offline W&B run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.testing.waiting import wait_for
from tests.support.wandb_log import history

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SEED_METRICS = [
    "training/async/n_prev_carry_over_rollouts",
    "training/async/n_completed_rollouts",
    "training/async/n_new_carry_over_rollouts",
    "training/async/new_carry_over_age_max_steps",
    "training/async/proxy_inflight_at_pause",
    "training/async/proxy_drain_seconds",
]


def _manifest(tmp_path: Path, *, steps: int, every: int) -> Path:
    manifest: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart-local.yaml").read_text())
    spec = manifest["spec"]
    spec["data"]["inline"] = [
        {"prompt": p, "target": "ab", "tool_seconds": 0.1} for p in ("w", "x", "y", "z")
    ]
    spec.update(trainBatchSize=2, totalSteps=steps)
    spec["rollout"]["n"] = 2
    spec["async"]["asyncTrainBatchSize"] = 4
    spec["trainer"]["checkpoint"]["everySteps"] = every
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def _local_run(tmp_path: Path, manifest: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "local",
            "run",
            str(manifest),
            f"--metrics-file={tmp_path / 'metrics.jsonl'}",
            f"--work-dir={tmp_path / 'work'}",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )


def _metrics(tmp_path: Path) -> list[dict[str, float]]:
    path = tmp_path / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_local_run_trains_asynchronously_and_logs_the_seed_metrics(tmp_path: Path) -> None:
    process = _local_run(tmp_path, _manifest(tmp_path, steps=4, every=2))
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    assert "CARRY-OVER" in output  # the live status table

    steps = _metrics(tmp_path)
    assert [row["step"] for row in steps] == [0, 1, 2, 3]
    for row in steps:
        for metric in SEED_METRICS:
            assert metric in row
        assert row["training/async/n_completed_rollouts"] == 4  # trainBatchSize 2 groups x n 2
        assert "timing/rollout_queue_wait_seconds_mean" in row
        assert "timing/rollout_run_seconds_max" in row
        assert "training/update/loss" in row
    assert any(row["training/async/n_new_carry_over_rollouts"] > 0 for row in steps)
    assert max(row["training/async/new_carry_over_age_max_steps"] for row in steps) >= 1

    (run_dir,) = (tmp_path / "work" / "wandb").glob("offline-run-*")
    logged = history(run_dir)
    assert len(logged) == 4
    for metric in SEED_METRICS:
        assert [row[metric] for row in logged] == [row[metric] for row in steps]


def test_a_killed_trainer_resumes_from_its_checkpoint_with_its_window(tmp_path: Path) -> None:
    process = _local_run(tmp_path, _manifest(tmp_path, steps=6, every=1))
    try:
        wait_for(lambda: len(_metrics(tmp_path)) >= 2, timeout=180, what="two steps")
        pid = int((tmp_path / "work" / "trainer.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        killed_after = len(_metrics(tmp_path))
        output, _ = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 0, output
    assert "restarting it" in output
    log = (tmp_path / "work" / "trainer.log").read_text()
    assert "resumed from checkpoint" in log
    assert "active groups" in log  # "recovered N active groups (M complete) from the gateway"
    steps = [int(row["step"]) for row in _metrics(tmp_path)]
    assert steps[-1] == 5
    assert steps == sorted(set(steps))  # no step trained twice
    assert len(steps) >= killed_after


def test_ctrl_c_stops_every_process_of_the_run(tmp_path: Path) -> None:
    process = _local_run(tmp_path, _manifest(tmp_path, steps=50, every=10))
    try:
        wait_for(lambda: len(_metrics(tmp_path)) >= 1, timeout=180, what="a first step")
        trainer_pid = int((tmp_path / "work" / "trainer.pid").read_text())
        os.kill(process.pid, signal.SIGINT)  # what Ctrl-C sends to the foreground process
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, output
    assert "every process of the run was stopped" in output
    assert not Path(f"/proc/{trainer_pid}").exists()
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path / "work")], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout
