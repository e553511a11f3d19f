"""The gateway's upstream connections are idle-dropped before vLLM's server closes them.

vLLM serves with uvicorn and a keep-alive timeout of VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s); aiohttp, the
gateway's upstream client, keeps idle connections 15 s by default. A model call sent on a connection vLLM was
closing got a reset, and a model call is not safe to resend. Read from the vLLM the GPU image pins.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.gateway.proxy import UPSTREAM_KEEP_ALIVE_SECONDS
from asyncrl.testing.vllm_cpu import VllmVenv

pytestmark = [pytest.mark.vllm]

SRC = Path(__file__).resolve().parents[2] / "src"


def test_the_gateway_drops_idle_upstream_connections_before_vllm_does(vllm_venv: VllmVenv) -> None:
    probe = "import vllm.envs as envs; print(envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE)"
    completed = vllm_venv.run(["-c", probe], src_dir=SRC, timeout=300)
    vllm_keep_alive = float(completed.stdout.strip().splitlines()[-1])
    assert vllm_keep_alive == 5  # vLLM 0.24's default; a change there should be looked at here
    assert vllm_keep_alive - 1 > UPSTREAM_KEEP_ALIVE_SECONDS  # a second's margin for a busy event loop
