"""`asyncrl validate` estimates one GPU's memory when vLLM wakes, from the model's config.json when it is
readable here, against the GPU a nodeSelector names or an assumed 80 GiB H100, and says which; it says it
skipped the estimate for a model it cannot read. Run as the real command on manifest files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_validate_catches import lines_of, validate
from tests.trainer.backends.test_memory_budget import QWEN_7B, QWEN_15B
from tests.trainer.backends.verl_support import verl_manifest

pytestmark = pytest.mark.slow  # one `asyncrl validate` run that composes verl's config: about a minute here

H200_MIB = 143771  # nvidia.com/gpu.memory of an H200 node: 140.4 GiB


def manifest_with_model(directory: Path, config: dict[str, Any] | None, **trainer: Any) -> Path:
    """A Verl run on one GPU whose model directory holds `config` (None: a Hub name, not readable here)."""
    manifest = verl_manifest(trainer=trainer)
    if config is None:
        manifest["spec"]["model"]["path"] = "Qwen/Qwen2.5-7B-Instruct"
    else:
        model = directory / "model"
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps(config))
        manifest["spec"]["model"]["path"] = str(model)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


@pytest.fixture(scope="module")
def results(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Path], subprocess.CompletedProcess[str]]:
    root = tmp_path_factory.mktemp("memory")
    paths = {
        "7b on one gpu": manifest_with_model(root / "a", QWEN_7B),
        "1.5b on an h200": manifest_with_model(
            root / "b", QWEN_15B, podTemplate={"nodeSelector": {"nvidia.com/gpu.memory": str(H200_MIB)}}
        ),
        "hub model": manifest_with_model(root / "c", None),
        "short context": manifest_with_model(root / "d", {**QWEN_15B, "max_position_embeddings": 1024}),
    }
    return paths, validate(*paths.values())


def test_a_model_that_cannot_fit_one_gpu_is_refused_with_the_figures_and_the_fix(
    results: tuple[dict[str, Path], subprocess.CompletedProcess[str]],
) -> None:
    paths, result = results
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = lines_of(result, paths["7b on one gpu"])
    assert line.startswith(
        "spec.trainer: GPU memory (80.0 GiB per GPU, assumed: an 80 GiB H100; a nodeSelector on "
        "nvidia.com/gpu.memory (MiB) sets it): does not fit: 7.62B parameters, FSDP shards over 1 of 1 GPU(s)"
    ), line
    assert "weights 28.4 GiB + grads 0 (freed after the update) + optimizer 56.7 GiB" in line
    assert (
        "vLLM's reservation 40.0 GiB (its weights 14.2 GiB) + runtime 1.0 GiB = 126.1 GiB of 80.0 GiB" in line
    )
    assert line.endswith("fix: more GPUs: 4 would fit (FSDP shards the actor over them); or a smaller model")


def test_the_gpu_a_node_selector_names_is_used_and_said(
    results: tuple[dict[str, Path], subprocess.CompletedProcess[str]],
) -> None:
    paths, result = results
    valid, note = lines_of(result, paths["1.5b on an h200"])
    assert valid == "valid"
    assert note.startswith(
        "note: spec.trainer: GPU memory (140.4 GiB per GPU, nodeSelector nvidia.com/gpu.memory): fits: "
        "1.54B parameters"
    ), note
    # 5.75 + 11.5 + 0.5 x 140.4 + 1 GiB
    assert "= 88.5 GiB of 140.4 GiB" in note


def test_a_model_not_readable_here_is_said_to_be_skipped(
    results: tuple[dict[str, Path], subprocess.CompletedProcess[str]],
) -> None:
    paths, result = results
    assert lines_of(result, paths["hub model"]) == [
        "valid",
        "note: spec.trainer: GPU memory not estimated: Qwen/Qwen2.5-7B-Instruct/config.json is not "
        "readable here (a Hub name or a path in the trainer pod); the trainer's preflight estimates it "
        "against its GPU",
    ]


def test_a_context_longer_than_the_models_positions_is_refused_with_the_fix(
    results: tuple[dict[str, Path], subprocess.CompletedProcess[str]],
) -> None:
    """verl would raise it when its vLLM server starts, minutes into the run on a GPU."""
    paths, result = results
    problem, _memory = lines_of(result, paths["short context"])
    assert problem.startswith("spec.data: vLLM's context would be "), problem
    assert "but the model has 1024 positions (max_position_embeddings in its config.json)" in problem
    assert problem.endswith("so that they add up to at most 1024"), problem
