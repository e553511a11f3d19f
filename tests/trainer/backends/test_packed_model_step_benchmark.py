"""benchmarks/packed_model_step.py, the next GPU session's first measurement, run on CPU at a tiny size.

On a GPU it says where a packed training step's time goes; here it is run to keep it working, and to show
that its verdict can fail: packed rows whose position ids do not restart attend to each other.
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from tests.support.benchmark_scripts import load_benchmark

TINY = ["--device=cpu", "--model=tiny", "--tokens=512", "--repeats=1"]
pytestmark = pytest.mark.slow


def script() -> ModuleType:
    return load_benchmark("packed_model_step")


def test_it_times_each_path_and_the_packed_rows_keep_their_own_logits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert script().main(TINY) == 0
    output = capsys.readouterr().out
    for path in ("packed sdpa", "rows alone", "packed eager", "vocabulary"):
        assert path in output
    assert "vs rows alone: max gap" in output
    assert ": MET" in output


def test_the_verdict_fails_when_rows_see_each_other(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    module = script()
    packed_inputs = module.packed_inputs

    def one_sequence(
        lengths: list[int], vocab: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ids, _ = packed_inputs(lengths, vocab, device)
        return ids, torch.arange(ids.shape[1], device=device)[None]  # no restart: one long causal row

    monkeypatch.setattr(module, "packed_inputs", one_sequence)
    assert module.main(TINY) == 1
    assert "NOT MET" in capsys.readouterr().out
