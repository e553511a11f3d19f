"""Where the trainer keeps its per-step metrics, and verl's length summary of an update's rows (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.trainer.length_metrics import length_metrics
from asyncrl.trainer.metrics import metrics_places
from asyncrl.trainer.rows import TrainingRow


def test_metrics_are_kept_beside_the_checkpoints_unless_a_place_is_named() -> None:
    checkpoints = Path("/var/lib/asyncrl/checkpoints")
    places = metrics_places(checkpoint_dir=checkpoints, metrics_file=None, wandb_dir=None)
    assert places.metrics_file == checkpoints / "metrics" / "metrics.jsonl"
    assert places.wandb_dir == checkpoints / "metrics"
    named = metrics_places(checkpoint_dir=checkpoints, metrics_file=Path("m.jsonl"), wandb_dir=Path("w"))
    assert (named.metrics_file, named.wandb_dir) == (Path("m.jsonl"), Path("w"))
    nowhere = metrics_places(checkpoint_dir=None, metrics_file=None, wandb_dir=None)
    assert (nowhere.metrics_file, nowhere.wandb_dir) == (None, Path("wandb-runs"))


def _row(prompt: int, response: int, *, truncated: bool = False) -> TrainingRow:
    return TrainingRow(
        rollout_id="r",
        group_id="g",
        prompt_token_ids=tuple(range(prompt)),
        response_token_ids=tuple(range(response)),
        response_mask=(1,) * response,
        rollout_log_probs=(0.0,) * response,
        reward=1.0,
        model_version=0,
        truncated=truncated,
    )


def test_length_metrics_use_verls_names_and_count_cut_rows() -> None:
    metrics = length_metrics([_row(10, 4), _row(20, 8, truncated=True), _row(30, 12), _row(40, 16)])
    assert metrics == {
        "response_length/mean": pytest.approx(10.0),
        "response_length/max": 16.0,
        "response_length/min": 4.0,
        "response_length/clip_ratio": 0.25,
        "prompt_length/mean": pytest.approx(25.0),
        "prompt_length/max": 40.0,
        "prompt_length/min": 10.0,
    }
    assert length_metrics([]) == {}
