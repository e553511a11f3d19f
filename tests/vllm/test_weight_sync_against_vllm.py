"""After a weight update, the real vLLM (CPU build) serves the trained policy: same prompt log-probs as torch.

Real here: vLLM 0.24's own OpenAI server, started for this module with its development endpoints, on the
tiny model made in code (given its own LM head: see `asyncrl.testing.vllm_weights` for why); the policy is
the same model in torch and transformers at the GPU image's pins (the vLLM venv), trained one Adam step per
update. Each update goes into the running server in place, between the engine calls verl makes around its
own weight update (pause, sleep, wake, ..., resume); the server is never restarted.

The test fails if the served weights stay the old ones (the log-probs must move as far as the policy's) and
if they are anything but the new ones (they must equal the policy's within float32 noise).

Replaced, because it cannot run on vLLM's CPU build: verl's own weight transfer into vLLM
(`vLLMColocateWorkerExtension.update_weights_from_ipc`, verl/workers/rollout/vllm_rollout/utils.py:405, which
calls `model.load_weights`). On CPU it fails with "'Parameter' object has no attribute 'weight_loader'"
(vllm/model_executor/models/llama.py:468) after part of the model was replaced, because the CPU linear kernels
repack each weight and drop the loadable parameter (vllm/model_executor/layers/linear.py:211-215). vLLM's own
in-place `reload_weights` loads the same tensors under the same names instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from asyncrl.testing.vllm_cpu import VllmServer, VllmVenv, start_vllm_server
from asyncrl.testing.vllm_weights import DEV_MODE_ENV
from tests.vllm.conftest import SERVED_MODEL, SRC

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

# Same float32 weights, same prompt, two CPU implementations (vLLM's kernels, torch's): measured 5e-7.
TOLERANCE = 1e-4
# An Adam step at lr 1e-2 moves the prompt's log-probs by more than 1 nat (measured 1.6 and 2.0).
MIN_CHANGE = 0.1
ROUNDS = 2


@pytest.fixture(scope="module")
def untied_model_dir(
    vllm_venv: VllmVenv, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    target = tmp_path_factory.mktemp("tiny-untied")
    vllm_venv.run(
        ["-m", "asyncrl.testing.vllm_weights", "untie", str(tiny_model_dir), str(target)],
        src_dir=SRC,
        timeout=600,
    )
    return target


@pytest.fixture(scope="module")
def dev_server(
    vllm_venv: VllmVenv, untied_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    server = start_vllm_server(
        vllm_venv,
        model_dir=untied_model_dir,
        served_model_name=SERVED_MODEL,
        log_path=tmp_path_factory.mktemp("vllm-dev") / "vllm.log",
        src_dir=SRC,
        env=DEV_MODE_ENV,
    )
    yield server
    server.stop()


def worst(a: Sequence[float], b: Sequence[float]) -> float:
    assert len(a) == len(b) > 0
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_each_weight_update_is_what_vllm_serves(
    vllm_venv: VllmVenv, dev_server: VllmServer, untied_model_dir: Path, tmp_path: Path
) -> None:
    completed = vllm_venv.run(
        [
            "-m",
            "asyncrl.testing.vllm_weights",
            "check",
            "--url",
            dev_server.url,
            "--model",
            dev_server.model,
            "--model-dir",
            str(untied_model_dir),
            "--work-dir",
            str(tmp_path),
            "--rounds",
            str(ROUNDS),
        ],
        src_dir=SRC,
        timeout=600,
    )
    report: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    initial = report["initial"]
    assert len(initial["served"]) == len(report["token_ids"]) - 1
    assert worst(initial["served"], initial["policy"]) <= TOLERANCE, (
        "vLLM and torch disagree before any update"
    )

    previous = initial
    assert len(report["updates"]) == ROUNDS
    for step, update in enumerate(report["updates"]):
        moved = worst(update["policy"], previous["policy"])
        assert moved > MIN_CHANGE, f"step {step}: the optimizer step barely moved the policy ({moved})"
        assert worst(update["served"], previous["served"]) > MIN_CHANGE, (
            f"step {step}: vLLM still serves the previous weights"
        )
        gap = worst(update["served"], update["policy"])
        assert gap <= TOLERANCE, f"step {step}: vLLM serves something else than the new policy (off by {gap})"
        previous = update
