"""Checkpoints: weights, optimizer state and step come back exactly; a checkpoint is never half written."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.trainer.backends.reference import ReferenceBackend, ReferenceBackendConfig
from asyncrl.trainer.backends.reference import checkpoint as checkpoint_module
from tests.trainer.backends.support import post, random_rows, serving, with_policy_log_probs

ROWS = random_rows(groups=2, per_group=4, prompt_tokens=16, response_tokens=16)


def trained_backend(steps: int, seed: int = 0) -> ReferenceBackend:
    backend = ReferenceBackend(ReferenceBackendConfig.model_validate({"model": {"seed": seed}}))
    for step in range(steps):
        backend.update_blocking(with_policy_log_probs(backend, ROWS), step=step)
    return backend


def assert_same_state(first: ReferenceBackend, second: ReferenceBackend) -> None:
    for name, tensor in first.model.state_dict().items():
        torch.testing.assert_close(second.model.state_dict()[name], tensor, rtol=0, atol=0)
    first_optimizer, second_optimizer = first.optimizer.state_dict(), second.optimizer.state_dict()
    assert first_optimizer["param_groups"] == second_optimizer["param_groups"]
    for index, state in first_optimizer["state"].items():
        for key, value in state.items():
            torch.testing.assert_close(second_optimizer["state"][index][key], value, rtol=0, atol=0)


def test_a_checkpoint_restores_weights_optimizer_and_step_and_serves_them(tmp_path: Path) -> None:
    original = trained_backend(steps=2)
    path = tmp_path / "step-2"
    restored = ReferenceBackend(ReferenceBackendConfig.model_validate({"model": {"seed": 99}}))

    async def scenario() -> tuple[int, Any]:
        await original.save_checkpoint(path, step=2)
        async with serving(restored) as session:
            step = await restored.load_checkpoint(path)
            _, _, health = await post(session, "/v1/completions", {"prompt": "a", "max_tokens": 1})
            return step, health

    step, answer = asyncio.run(scenario())

    assert step == 2
    assert restored.model_version == answer["model_version"] == 2
    assert_same_state(original, restored)
    # With the optimizer's moments restored, the next update is the same on both.
    rows = with_policy_log_probs(original, ROWS)
    original.update_blocking(rows, step=2)
    restored.update_blocking(rows, step=2)
    assert_same_state(original, restored)


def test_saving_again_replaces_the_checkpoint_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    backend = trained_backend(steps=1)
    path = tmp_path / "latest"
    asyncio.run(backend.save_checkpoint(path, step=1))
    backend.update_blocking(with_policy_log_probs(backend, ROWS), step=1)
    asyncio.run(backend.save_checkpoint(path, step=2))

    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["latest"]
    assert asyncio.run(ReferenceBackend().load_checkpoint(path)) == 2


def test_a_save_that_fails_midway_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = trained_backend(steps=1)
    path = tmp_path / "latest"
    asyncio.run(backend.save_checkpoint(path, step=1))
    real_save = torch.save

    def fail_on_optimizer(obj: Any, target: Any, *args: Any, **kwargs: Any) -> None:
        if Path(target).name == checkpoint_module.OPTIMIZER_FILE:
            raise OSError("disk full")
        real_save(obj, target, *args, **kwargs)

    monkeypatch.setattr(torch, "save", fail_on_optimizer)
    with pytest.raises(OSError, match="disk full"):
        asyncio.run(backend.save_checkpoint(path, step=2))

    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["latest"]
    assert asyncio.run(ReferenceBackend().load_checkpoint(path)) == 1


def test_a_checkpoint_of_another_model_shape_or_a_missing_one_is_refused(tmp_path: Path) -> None:
    asyncio.run(trained_backend(steps=0).save_checkpoint(tmp_path / "small", step=0))
    wider = ReferenceBackend(ReferenceBackendConfig.model_validate({"model": {"hidden_size": 128}}))

    with pytest.raises(ValueError, match="is for model"):
        asyncio.run(wider.load_checkpoint(tmp_path / "small"))
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        asyncio.run(wider.load_checkpoint(tmp_path / "nowhere"))
