"""Packed training rows with the trainer image's pins: transformers 5.9 and torch 2.11 from the vLLM venv.

The dev venv's transformers is newer than the image's; whether SDPA masks packed rows apart is decided by
transformers' mask code, so the check also runs with the versions a GPU run uses (see
tests/trainer/backends/test_verl_packing.py for what it measures).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.testing.vllm_cpu import VllmVenv
from asyncrl.trainer.preflight import GPU_STACK_PINS

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

SRC = Path(__file__).resolve().parents[2] / "src"


def test_verls_packed_rows_keep_their_own_logits_on_the_images_transformers(vllm_venv: VllmVenv) -> None:
    completed = vllm_venv.run(["-m", "asyncrl.testing.verl_packing"], src_dir=SRC, timeout=600)
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["transformers"] == GPU_STACK_PINS["transformers"]
    assert result["verl"] == GPU_STACK_PINS["verl"]
    assert result["torch"].split("+")[0] == GPU_STACK_PINS["torch"]
    assert result["max_logit_gap"] < 1e-4, result
