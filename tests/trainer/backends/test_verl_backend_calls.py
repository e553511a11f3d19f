"""VerlBackend's own logic around verl, with a recording stand-in for verl's GPU trainer.

A stand-in is used because verl's trainer needs GPUs (FSDP workers, vLLM replicas) and TransferQueue needs
its Ray actors; neither runs here. What is checked is asyncrl's part: the order of verl's calls around an
update, a checkpoint save and a load (the same order as verl's colocate_async hooks), what goes into
TransferQueue and is always cleared, the served version, and the checkpoint layout. The verl names and
parameters used are checked against the real verl in test_verl_api.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import transfer_queue

from asyncrl.trainer.backends.verl.backend import FORMAT, VerlBackend
from tests.trainer.backends.test_verl_batch import agent_rows
from tests.trainer.test_adapter import TRAJECTORY


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []


class StandInCheckpointManager:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def abort_replicas(self) -> None:
        self.recorder.calls.append(("abort_replicas",))

    def sleep_replicas(self) -> None:
        self.recorder.calls.append(("sleep_replicas",))

    def update_weights(self, global_steps: int) -> None:
        self.recorder.calls.append(("update_weights", global_steps))

    def resume_generation_replicas(self) -> None:
        self.recorder.calls.append(("resume_generation_replicas",))


class StandInActorGroup:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def save_checkpoint(self, local_path: str, hdfs_path: str | None, global_step: int) -> None:
        Path(local_path).mkdir(parents=True)
        (Path(local_path) / "model.pt").write_text("weights")
        self.recorder.calls.append(("save_checkpoint", global_step))

    def load_checkpoint(self, local_path: str, del_local_after_load: bool) -> None:
        assert (Path(local_path) / "model.pt").read_text() == "weights"
        self.recorder.calls.append(("load_checkpoint",))


class StandInTrainer:
    def __init__(self, recorder: Recorder, *, fail: bool = False) -> None:
        self.recorder = recorder
        self.fail = fail
        self.checkpoint_manager = StandInCheckpointManager(recorder)
        self.actor_rollout_wg = StandInActorGroup(recorder)

    def train_on(self, batch: Any, *, step: int) -> dict[str, Any]:
        self.recorder.calls.append(("train_on", tuple(batch.keys), step))
        if self.fail:
            raise RuntimeError("CUDA out of memory (stand-in)")
        return {"actor/pg_loss": 0.5, "actor/grad_norm": 2.0}


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    recorder = Recorder()
    monkeypatch.setattr(
        transfer_queue,
        "kv_batch_put",
        lambda **kw: recorder.calls.append(("kv_batch_put", tuple(kw["keys"]), kw["partition_id"])),
    )
    monkeypatch.setattr(
        transfer_queue,
        "kv_clear",
        lambda **kw: recorder.calls.append(("kv_clear", tuple(kw["keys"]), kw["partition_id"])),
    )
    monkeypatch.setattr(transfer_queue, "kv_list", lambda **kw: {kw["partition_id"]: {}})
    return recorder


def started_backend(recorder: Recorder, **kwargs: Any) -> VerlBackend:
    backend = VerlBackend(config=None)
    backend._trainer = StandInTrainer(recorder, **kwargs)
    return backend


def test_a_step_sleeps_trains_and_wakes_in_verls_colocate_async_order(recorder: Recorder) -> None:
    backend = started_backend(recorder)
    rows = agent_rows(TRAJECTORY)

    async def one_step() -> Any:
        await backend.sleep()
        try:
            return await backend.update(rows, step=4)
        finally:
            await backend.wake()

    metrics = asyncio.run(one_step())
    keys = tuple(f"{group}_{i}_0" for group in ("g_a", "g_b") for i in range(3))
    assert recorder.calls == [
        ("abort_replicas",),
        ("sleep_replicas",),
        ("kv_batch_put", keys, "train"),
        ("train_on", keys, 4),
        ("kv_clear", keys, "train"),
        ("update_weights", 5),
        ("resume_generation_replicas",),
    ]
    assert backend.model_version == 5
    assert (metrics.loss, metrics.grad_norm, metrics.model_version) == (0.5, 2.0, 5)


def test_a_failed_update_still_clears_its_records_and_keeps_the_served_version(recorder: Recorder) -> None:
    backend = started_backend(recorder, fail=True)
    with pytest.raises(RuntimeError, match="out of memory"):
        asyncio.run(backend.update(agent_rows(TRAJECTORY), step=0))
    assert recorder.calls[-1][0] == "kv_clear"
    assert backend.model_version == 0


def test_checkpoints_are_saved_with_vllm_asleep_atomically_and_load_back(
    recorder: Recorder, tmp_path: Path
) -> None:
    backend = started_backend(recorder)
    path = tmp_path / "step-000003"
    asyncio.run(backend.save_checkpoint(path, step=3))
    assert recorder.calls == [
        ("abort_replicas",),
        ("sleep_replicas",),
        ("save_checkpoint", 3),
        ("update_weights", 0),
        ("resume_generation_replicas",),
    ]
    assert json.loads((path / "checkpoint.json").read_text()) == {"format": FORMAT, "step": 3}
    assert [p.name for p in tmp_path.iterdir()] == ["step-000003"]  # no staging directory left

    recorder.calls.clear()
    assert asyncio.run(backend.load_checkpoint(path)) == 3
    assert backend.model_version == 3
    assert recorder.calls == [
        ("abort_replicas",),
        ("sleep_replicas",),
        ("load_checkpoint",),
        ("update_weights", 3),
        ("resume_generation_replicas",),
    ]


def test_loading_a_directory_that_is_not_a_verl_checkpoint_is_refused(
    recorder: Recorder, tmp_path: Path
) -> None:
    backend = started_backend(recorder)
    with pytest.raises(FileNotFoundError, match=r"checkpoint.json is missing"):
        asyncio.run(backend.load_checkpoint(tmp_path))
    (tmp_path / "checkpoint.json").write_text(
        json.dumps({"format": "asyncrl-reference-checkpoint/1", "step": 2})
    )
    with pytest.raises(ValueError, match="expected 'asyncrl-verl-checkpoint/1'"):
        asyncio.run(backend.load_checkpoint(tmp_path))
    assert recorder.calls == []
