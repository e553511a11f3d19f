"""A checkpoint holds one FSDP shard per GPU: a resume after `gpus` (or nodes) changed is refused, naming both
sizes and the fix; the same size, or an old checkpoint that does not record it, resumes.

The loop runs against a real gateway with a recording backend (no model is needed to see whether it loads);
the trainer's preflight reads the same files before any GPU work.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.api import load_run
from asyncrl.gateway_api.client import GatewayClient
from asyncrl.trainer.checkpoints import LoopState, latest_checkpoint, save_checkpoint
from asyncrl.trainer.loop import LoopSettings
from asyncrl.trainer.preflight import check_checkpoint_resume
from asyncrl.trainer.recovery import resume_decision, sharded_world_size
from tests.gateway.conftest import RunningGateway, launch_gateway
from tests.support.kube import run_manifest
from tests.trainer.backends.verl_support import verl_manifest
from tests.trainer.test_loop_checkpoints import RecordingBackend, loop_on


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[RunningGateway]:
    running = launch_gateway([], tmp_path)
    yield running
    running.process.stop()


def saved_with(checkpoints: Path, backend: RecordingBackend, *, world_size: int | None) -> None:
    """A checkpoint of step 3, as a trainer of `world_size` GPUs saved it (None: before it was recorded)."""
    asyncio.run(
        save_checkpoint(
            checkpoints, backend, LoopState(step=3, data_epoch=0, data_offset=1, world_size=world_size)
        )
    )
    if world_size is None:  # an older trainer wrote no such key at all
        (marker,) = checkpoints.glob("step-*.json")
        fields = json.loads(marker.read_text())
        del fields["world_size"]
        marker.write_text(json.dumps(fields))
    backend.calls.clear()


def recover(
    gateway: RunningGateway, backend: RecordingBackend, checkpoints: Path, *, world_size: int
) -> None:
    async def scenario() -> None:
        async with GatewayClient(gateway.url, gateway.key) as client:
            await loop_on(client, backend, checkpoints, every=1, world_size=world_size).recover()

    asyncio.run(scenario())


def test_a_checkpoint_saved_with_two_gpus_is_refused_by_a_run_of_one_naming_both(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    backend = RecordingBackend(gateway.url, gateway.key)
    checkpoints = tmp_path / "checkpoints"
    saved_with(checkpoints, backend, world_size=2)
    with pytest.raises(SystemExit) as refused:
        recover(gateway, backend, checkpoints, world_size=1)
    message = str(refused.value.code)
    assert "step-000003 was saved with 2 GPU(s)" in message
    assert "this run has 1" in message
    assert "set spec.trainer.gpus (or nodes and gpusPerNode) back to 2" in message
    assert "fresh checkpoint directory" in message
    assert backend.calls == []  # nothing was loaded


def test_a_checkpoint_saved_with_the_same_gpus_resumes(gateway: RunningGateway, tmp_path: Path) -> None:
    backend = RecordingBackend(gateway.url, gateway.key)
    checkpoints = tmp_path / "checkpoints"
    saved_with(checkpoints, backend, world_size=2)
    recover(gateway, backend, checkpoints, world_size=2)
    assert backend.calls == [("load", 3, True)]


def test_an_old_checkpoint_without_the_world_size_resumes(gateway: RunningGateway, tmp_path: Path) -> None:
    backend = RecordingBackend(gateway.url, gateway.key)
    checkpoints = tmp_path / "checkpoints"
    saved_with(checkpoints, backend, world_size=None)
    assert "world_size" not in next(checkpoints.glob("step-*.json")).read_text()
    recover(gateway, backend, checkpoints, world_size=1)
    assert backend.calls == [("load", 3, True)]


def test_the_loop_records_its_world_size_in_the_checkpoint(gateway: RunningGateway, tmp_path: Path) -> None:
    backend = RecordingBackend(gateway.url, gateway.key)
    checkpoints = tmp_path / "checkpoints"

    async def scenario() -> None:
        async with GatewayClient(gateway.url, gateway.key) as client:
            loop = loop_on(client, backend, checkpoints, every=1, world_size=4)
            loop.step = 1
            await loop._save_checkpoint(consumed=())

    asyncio.run(scenario())
    found = latest_checkpoint(checkpoints)
    assert found is not None
    assert found[1] == LoopState(step=1, data_epoch=0, data_offset=0, world_size=4)


class DirectoryBackend:
    """Writes the backend's checkpoint directory, nothing else: the preflight reads only the loop state."""

    async def save_checkpoint(self, path: Path, *, step: int) -> None:
        path.mkdir(parents=True, exist_ok=True)


def test_the_preflight_refuses_the_resume_before_any_gpu_work(tmp_path: Path) -> None:
    checkpoints = tmp_path / "checkpoints"
    state = LoopState(step=7, data_epoch=0, data_offset=0, world_size=2)
    asyncio.run(save_checkpoint(checkpoints, DirectoryBackend(), state))  # type: ignore[arg-type]
    refused = check_checkpoint_resume(checkpoints, world_size=1)
    assert not refused.ok
    assert "step-000007 was saved with 2 GPU(s)" in refused.line()
    assert "this run has 1" in refused.line()
    assert "fix: set spec.trainer.gpus (or nodes and gpusPerNode) back to 2 GPU(s)" in refused.line()
    assert check_checkpoint_resume(checkpoints, world_size=2).ok
    assert check_checkpoint_resume(tmp_path / "empty", world_size=1).ok


def test_the_world_size_is_nodes_times_gpus_per_node_for_verl_and_unrecorded_for_reference() -> None:
    rows = {"samplesPerPrompt": 16}  # one prompt's 16 rows divide over the data-parallel ranks
    assert sharded_world_size(load_run(verl_manifest(trainer={"gpus": 4}, rollout=rows)).spec) == 4
    shared = {"claimName": "shared-checkpoints"}
    multi = verl_manifest(trainer={"nodes": 2, "gpusPerNode": 8, "checkpoint": shared}, rollout=rows)
    assert sharded_world_size(load_run(multi).spec) == 16
    assert sharded_world_size(load_run(run_manifest("reference")).spec) is None


def test_the_loop_of_a_verl_run_records_its_gpus() -> None:
    rows = {"samplesPerPrompt": 4}
    spec = load_run(verl_manifest(trainer={"gpus": 4}, rollout=rows)).spec
    assert LoopSettings.of_run(spec, checkpoint_dir=Path("/ckpt")).world_size == 4


@pytest.mark.parametrize(
    ("saved", "now", "refused"),
    [(2, 1, True), (1, 8, True), (2, 2, False), (None, 4, False), (4, None, False)],
)
def test_only_a_known_different_world_size_is_refused(
    saved: int | None, now: int | None, refused: bool
) -> None:
    decision = resume_decision(checkpoint="step-000001", saved_world_size=saved, world_size=now)
    assert decision.refused is refused
    if saved is None:
        assert "does not record the GPUs it was saved with" in decision.detail
