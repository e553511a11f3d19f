"""--reference-model-seed: the trainer builds the Reference backend's initial weights from it, and
`asyncrl local run` passes it on (benchmarks/time_to_reward.py varies it across seeds)."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import yaml

from asyncrl.api import load_run
from asyncrl.local.run import add_arguments as local_run_arguments
from asyncrl.trainer.backends.reference import ReferenceBackend
from asyncrl.trainer.main import add_arguments as trainer_arguments
from asyncrl.trainer.main import build_reference_backend

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart-local.yaml"


def _weights(seed: int) -> list[torch.Tensor]:
    run = load_run(yaml.safe_load(QUICKSTART.read_text()))
    backend = build_reference_backend(run, inference_port=0, model_seed=seed)
    assert isinstance(backend, ReferenceBackend)
    return [parameter.detach().clone() for parameter in backend.model.parameters()]


def test_the_same_seed_builds_the_same_model_and_another_seed_another() -> None:
    first, again, other = _weights(3), _weights(3), _weights(4)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_the_trainer_defaults_to_seed_0_and_local_run_passes_only_a_given_seed() -> None:
    trainer = argparse.ArgumentParser()
    trainer_arguments(trainer)
    assert trainer.parse_args(["--config=run.yaml"]).reference_model_seed == 0
    local = argparse.ArgumentParser()
    local_run_arguments(local)
    assert local.parse_args(["run.yaml"]).reference_model_seed is None
    assert local.parse_args(["run.yaml", "--reference-model-seed=5"]).reference_model_seed == 5
