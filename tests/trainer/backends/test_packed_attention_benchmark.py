"""benchmarks/packed_attention.py, the GPU smoke's attention check, run on CPU at small sizes.

On a GPU it measures SDPA's memory and time on packed rows; here it is run to keep it working, and to show
that its verdict can fail: with a mask that lets rows see each other, the packed output moves.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

from tests.support.benchmark_scripts import load_benchmark

SMALL = ["--device=cpu", "--lengths=2048,3000", "--heads=2", "--kv-heads=1", "--head-dim=16"]
pytestmark = pytest.mark.slow


def script() -> ModuleType:
    return load_benchmark("packed_attention")


def test_packed_rows_match_rows_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert script().main(SMALL) == 0
    output = capsys.readouterr().out
    assert "target packed SDPA runs and matches unpacked rows at every length: MET" in output
    assert "rows   2" in output or "rows   3" in output  # several rows packed, not one


def test_the_verdict_fails_when_rows_see_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    module = script()

    def one_sequence(lengths: list[int], device: torch.device) -> Any:
        total = sum(lengths)
        return torch.ones(total, total, dtype=torch.bool, device=device).tril()[None, None]

    module.block_causal_mask = one_sequence
    assert module.main(SMALL) == 1
    assert "NOT MET" in capsys.readouterr().out
