"""benchmarks/verl_actor_gpu.py's pure parts, on CPU (the script itself needs a GPU: verl's FSDP engine is
registered for CUDA only).

What a wrong part would cost on the GPU, as seen there once: a response cut one position late compared each
token's log-prob with its neighbour's (a gap of 3.2 nats between packed and unpacked log-probs, a false
failure) and fed the update old log-probs shifted by one (a clip fraction of 0.40).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from asyncrl.trainer.backends.verl.batch import build_trajectory_batch
from tests.support.benchmark_scripts import load_benchmark

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
pytestmark = pytest.mark.slow


def script() -> ModuleType:
    return load_benchmark("verl_actor_gpu")


def test_the_response_cut_takes_each_response_tokens_own_log_prob() -> None:
    """The engine's output at position i is the log-prob of token i + 1: a row's response tokens sit at
    positions prompt - 1 ... prompt + response - 2. A cut of the last `response` positions is off by one."""
    module = script()
    rows = module.agent_rows(6, 3, vocab=50, seed=3, scale=0.02)
    fields = build_trajectory_batch(rows, step=0).fields()
    positions = torch.nested.as_nested_tensor(
        [torch.arange(len(ids), dtype=torch.float32) for ids in fields["input_ids"].unbind()],
        layout=torch.jagged,
    )
    cut = module.response_part(positions, fields)
    for row, values in zip(rows, cut, strict=True):
        prompt, response = len(row.prompt_token_ids), len(row.response_token_ids)
        expected = torch.arange(prompt - 1, prompt + response - 1, dtype=torch.float32)
        assert torch.equal(values, expected)


def test_agent_rows_are_groups_of_trainable_rows_with_masked_tool_output() -> None:
    module = script()
    rows = module.agent_rows(16, 8, vocab=1000, seed=1, scale=1.0)
    assert [row.group_id for row in rows] == ["g0"] * 8 + ["g1"] * 8
    assert all(200 <= len(row.prompt_token_ids) <= 1500 for row in rows)
    assert all(100 <= len(row.response_token_ids) <= 2048 for row in rows)
    assert all(0 < token < 1000 for row in rows for token in row.prompt_token_ids + row.response_token_ids)
    assert any(0 in row.response_mask for row in rows)  # tool output inside some trajectories
    assert all(any(row.response_mask) for row in rows)
    assert module.agent_rows(16, 8, vocab=1000, seed=1, scale=1.0) == rows  # seeded


def test_a_call_gets_its_extra_info_as_verl_reads_it() -> None:
    from verl.utils import tensordict_utils as tu

    module = script()
    rows = module.agent_rows(2, 2, vocab=50, seed=0, scale=0.02)
    fields = build_trajectory_batch(rows, step=0).fields()
    fields = module.with_info(fields, {"temperature": 0.7, "epochs": 1})
    assert tu.get(fields, key="temperature") == 0.7
    assert tu.get(fields, key="epochs") == 1


def test_the_ray_stub_answers_imports_and_decorators_only() -> None:
    """In a fresh interpreter (the stub would shadow a real Ray): verl-style imports and decorators pass."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import ray_import_stub, ray\n"
        "from ray.util.placement_group import placement_group\n"
        "@ray.remote\n"
        "class Worker: pass\n"
        "assert Worker.__name__ == 'Worker' and not ray.is_initialized()\n"
        "print('stub ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(BENCHMARKS)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "stub ok" in done.stdout
