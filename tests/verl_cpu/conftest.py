"""Fixtures for verl's own trainer end to end on CPU: the third venv, the tiny model, one driver run.

The venv is `scripts/provision-verl-cpu.sh`'s (verl, Ray, TransferQueue and the vLLM CPU build in one
interpreter). When it is missing the tests are skipped, naming the script; ASYNCRL_REQUIRE_VERL_CPU=1 turns
that skip into a failure, as ASYNCRL_REQUIRE_VLLM_CPU does for tests/vllm.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from asyncrl.testing.vllm_cpu import provisioned_venv

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"


@pytest.fixture(scope="session")
def verl_cpu_python() -> Path:
    venv = provisioned_venv(REPO / "scripts" / "provision-verl-cpu.sh")
    if venv is None:
        message = "verl's CPU trainer environment is not provisioned here: run scripts/provision-verl-cpu.sh"
        if os.environ.get("ASYNCRL_REQUIRE_VERL_CPU") == "1":
            pytest.fail(f"{message} (ASYNCRL_REQUIRE_VERL_CPU=1: these tests must run)")
        pytest.skip(message)
    return venv / "bin" / "python"


@pytest.fixture(scope="session")
def tiny_model_dir(verl_cpu_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama (head_dim 64) and its byte tokenizer, as tests/vllm makes them."""
    directory = tmp_path_factory.mktemp("tiny-model")
    subprocess.run(
        [str(verl_cpu_python), "-m", "asyncrl.testing.tiny_model", str(directory)],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        check=True,
        capture_output=True,
        timeout=600,
    )
    return directory
