"""The one tracking layer: every step reaches the JSON-lines file, W&B, TensorBoard and Prometheus alike."""

from __future__ import annotations

import argparse
import json
import socket
import urllib.request
from pathlib import Path

import pytest
import yaml

from asyncrl.api import load_run
from asyncrl.trainer.main import build_sinks
from asyncrl.trainer.metrics import JsonLinesSink, MetricsSinks
from tests.support.wandb_log import history

REPO = Path(__file__).resolve().parents[2]
STEPS = [
    {
        "critic/score/mean": 0.25,
        "training/async/n_new_carry_over_rollouts": 2.0,
        "timing_s/step": 1.5,
    },
    {
        "critic/score/mean": 0.5,
        "training/async/n_new_carry_over_rollouts": 0.0,
        "timing_s/step": 1.25,
    },
    {
        "critic/score/mean": 0.75,
        "training/async/n_new_carry_over_rollouts": 4.0,
        "timing_s/step": 1.0,
    },
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _args(tmp_path: Path, *, metrics_port: int = 0) -> argparse.Namespace:
    return argparse.Namespace(
        checkpoint_dir=None,
        metrics_file=tmp_path / "metrics.jsonl",
        metrics_port=metrics_port,
        wandb_dir=tmp_path / "wandb-runs",
        tensorboard_dir=None,
    )


def _tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = directory.rglob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(events.parent))
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)]
        for tag in accumulator.Tags()["scalars"]
    }


def test_every_step_reaches_json_lines_wandb_tensorboard_and_prometheus_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    run = load_run(yaml.safe_load((REPO / "examples" / "quickstart-local.yaml").read_text()))  # W&B Offline
    port = _free_port()
    sinks = build_sinks(run, _args(tmp_path, metrics_port=port))
    for step, metrics in enumerate(STEPS):
        sinks.log(step, metrics)
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    sinks.close()

    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": step, **metrics} for step, metrics in enumerate(STEPS)]
    (wandb_run,) = (tmp_path / "wandb-runs" / "wandb").glob("offline-run-*")
    logged = history(wandb_run)
    assert [{key: row[key] for key in STEPS[0]} for row in logged] == STEPS
    scalars = _tensorboard_scalars(tmp_path / "wandb-runs" / "tensorboard")
    for key in STEPS[0]:
        assert scalars[key] == [(step, pytest.approx(metrics[key])) for step, metrics in enumerate(STEPS)]
    assert "asyncrl_critic_score_mean 0.75" in scraped
    assert "asyncrl_trainer_step 2.0" in scraped


def test_disabled_wandb_still_writes_tensorboard_and_leaves_no_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = load_run(yaml.safe_load((REPO / "examples" / "quickstart-local.yaml").read_text()))
    sinks = build_sinks(run, _args(tmp_path))
    sinks.log(0, STEPS[0])
    sinks.close()
    assert not (tmp_path / "wandb-runs" / "wandb").exists()
    assert _tensorboard_scalars(tmp_path / "wandb-runs" / "tensorboard")["critic/score/mean"] == [(0, 0.25)]


class _BrokenSink(JsonLinesSink):
    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.calls = 0

    def log(self, step: int, metrics: object) -> None:  # type: ignore[override]
        self.calls += 1
        raise OSError("disk full")


def test_a_failing_sink_is_skipped_and_the_others_still_log(tmp_path: Path) -> None:
    broken = _BrokenSink(tmp_path / "broken.jsonl")
    kept = JsonLinesSink(tmp_path / "kept.jsonl")
    sinks = MetricsSinks([broken, kept])
    for step, metrics in enumerate(STEPS):
        sinks.log(step, metrics)
    sinks.close()
    assert broken.calls == len(STEPS)
    assert len((tmp_path / "kept.jsonl").read_text().splitlines()) == len(STEPS)


def test_a_taken_metrics_port_turns_prometheus_off_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "disabled")
    run = load_run(yaml.safe_load((REPO / "examples" / "quickstart-local.yaml").read_text()))
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        sinks = build_sinks(run, _args(tmp_path, metrics_port=int(taken.getsockname()[1])))
    sinks.log(0, STEPS[0])
    sinks.close()
    assert [type(sink).__name__ for sink in sinks.sinks] == ["JsonLinesSink", "VerlTrackingSink"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 1
