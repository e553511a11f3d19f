"""The step loop's checkpoints with a real gateway: loaded while the gateway is paused, saved once a step.

A recording backend stands in for the model (no model is needed to see when the loop loads and saves); it
asks the gateway whether it is paused at the moment of each call, as a sleeping vLLM would need it to be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncrl.api.types.spec import AsyncSpec
from asyncrl.gateway_api.client import GatewayClient, GatewayError
from asyncrl.trainer.adapter import AdapterConfig
from asyncrl.trainer.backends import UpdateMetrics
from asyncrl.trainer.checkpoints import LoopState, save_checkpoint
from asyncrl.trainer.data import PromptSource
from asyncrl.trainer.loop import RESUME_RETRY_FIRST_SECONDS, LoopSettings, StepLoop
from asyncrl.trainer.metrics import MetricsSinks
from asyncrl.trainer.rows import TrainingRow
from tests.gateway.conftest import RunningGateway, launch_gateway


class RecordingBackend:
    serve_urls: tuple[str, ...] = ()
    served_model = "m"

    def __init__(self, gateway_url: str, key: str) -> None:
        self.calls: list[tuple[str, int, bool]] = []
        self.model_version = 0
        self._state = httpx.Client(base_url=gateway_url, headers={"authorization": f"Bearer {key}"})

    def _paused(self) -> bool:
        return bool(self._state.get("/proxy/state").json()["paused"])

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def sleep(self) -> None: ...
    async def wake(self) -> None: ...

    async def update(self, rows: list[TrainingRow], *, step: int) -> UpdateMetrics:
        raise AssertionError("not used here")

    async def save_checkpoint(self, path: Path, *, step: int) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.calls.append(("save", step, self._paused()))

    async def load_checkpoint(self, path: Path) -> int:
        step = int(path.name.rsplit("-", 1)[-1])
        self.calls.append(("load", step, self._paused()))
        self.model_version = step
        return step


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[RunningGateway]:
    running = launch_gateway([], tmp_path)
    yield running
    running.process.stop()


def loop_on(
    gateway: GatewayClient, backend: Any, checkpoint_dir: Path, *, every: int, world_size: int | None = None
) -> StepLoop:
    settings = LoopSettings(
        window=AsyncSpec().window_config(train_batch_size=1, samples_per_prompt=2),
        adapter=AdapterConfig(),
        rollout_timeout_seconds=60,
        total_steps=4,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every_steps=every,
        world_size=world_size,
    )
    prompts = PromptSource([{"q": "a"}], shuffle=False, seed=0)
    return StepLoop(
        settings=settings, gateway=gateway, backend=backend, prompts=prompts, sinks=MetricsSinks([])
    )


def test_a_restart_loads_its_checkpoint_with_the_gateway_paused(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    backend = RecordingBackend(gateway.url, gateway.key)
    checkpoints = tmp_path / "checkpoints"

    async def scenario() -> None:
        await save_checkpoint(checkpoints, backend, LoopState(step=3, data_epoch=0, data_offset=1))
        backend.calls.clear()
        async with GatewayClient(gateway.url, gateway.key) as client:
            await client.resume(model_version=0)  # serving, as a gateway that outlived its trainer can be
            await loop_on(client, backend, checkpoints, every=1).recover()

    asyncio.run(scenario())
    assert backend.calls == [("load", 3, True)]


class UpstreamsRecordingClient(GatewayClient):
    """The real client, noting whether the gateway was paused when the model servers were registered."""

    registered_while_paused: list[bool]

    async def set_upstreams(self, urls: Any, *, model: str | None = None) -> Any:
        self.registered_while_paused.append((await self.state()).paused)
        return await super().set_upstreams(urls, model=model)


@pytest.mark.parametrize("with_checkpoint", [True, False])
def test_a_restarted_trainer_registers_its_fresh_servers_only_while_the_gateway_is_paused(
    gateway: RunningGateway, tmp_path: Path, with_checkpoint: bool
) -> None:
    """A gateway that outlived its trainer serves at the old trainer's version 3, and the fresh servers hold
    the base weights until the checkpoint is loaded (or for good, without one). Before, they were registered
    with the gateway open, so agents' calls in that window were answered by the base weights and captured as
    version 3."""
    backend = RecordingBackend(gateway.url, gateway.key)
    backend.serve_urls = ("http://127.0.0.1:9",)
    checkpoints = tmp_path / "checkpoints"

    async def scenario() -> None:
        if with_checkpoint:
            await save_checkpoint(checkpoints, backend, LoopState(step=3, data_epoch=0, data_offset=1))
            backend.calls.clear()
        async with UpstreamsRecordingClient(gateway.url, gateway.key) as client:
            client.registered_while_paused = []
            await client.resume(model_version=3)  # the old trainer's last version, still serving
            await loop_on(client, backend, checkpoints, every=1).start_serving()
            assert client.registered_while_paused == [True]
            state = await client.state()
            assert not state.paused
            assert state.model_version == (3 if with_checkpoint else 0)  # what the servers now hold

    asyncio.run(scenario())
    assert backend.calls == ([("load", 3, True)] if with_checkpoint else [])


def test_a_new_runs_trainer_registers_its_servers_without_pausing_the_gateway(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    """At version 0 the gateway labels the base weights rightly: a new run's start stays as it was."""
    backend = RecordingBackend(gateway.url, gateway.key)
    backend.serve_urls = ("http://127.0.0.1:9",)

    async def scenario() -> None:
        async with UpstreamsRecordingClient(gateway.url, gateway.key) as client:
            client.registered_while_paused = []
            await loop_on(client, backend, tmp_path / "checkpoints", every=1).start_serving()
            assert client.registered_while_paused == [False]
            assert (await client.state()).model_version == 0

    asyncio.run(scenario())


@pytest.mark.parametrize(("every", "saves"), [(2, [("save", 4, True)]), (3, [("save", 4, True)])])
def test_the_last_step_is_saved_once_and_with_the_gateway_paused(
    gateway: RunningGateway, tmp_path: Path, every: int, saves: list[tuple[str, int, bool]]
) -> None:
    backend = RecordingBackend(gateway.url, gateway.key)

    async def scenario() -> None:
        async with GatewayClient(gateway.url, gateway.key) as client:
            loop = loop_on(client, backend, tmp_path / "checkpoints", every=every)
            loop.step = 4
            if loop.step % every == 0:  # the last step saved its checkpoint, as _run_step does
                await client.pause(reason="step 3", retry_after_seconds=1, wait_seconds=5)
                await loop._save_checkpoint(consumed=())
                await client.resume(model_version=4)
            await loop._finish()
            assert not (await client.state()).paused

    asyncio.run(scenario())
    assert backend.calls == saves


class FirstResumeFailsClient(GatewayClient):
    """The real client, whose first resume fails as a gateway busy for a moment answers (503)."""

    failed = 0

    async def resume(self, *, model_version: int | None = None) -> Any:
        if not self.failed:
            self.failed += 1
            raise GatewayError(503, "busy", None)
        return await super().resume(model_version=model_version)


def test_a_step_whose_resume_fails_still_leaves_the_gateway_open(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    """Before, a failed resume was only logged: the gateway stayed paused through the next collection and
    held every agent call until its hold timeout. Now it is sent again, first after RESUME_RETRY_FIRST_SECONDS
    (0.05 s, so within a second on any machine that answers at all)."""
    backend = RecordingBackend(gateway.url, gateway.key)

    async def scenario() -> None:
        async with FirstResumeFailsClient(gateway.url, gateway.key) as client:
            await client.pause(reason="the update", wait_seconds=1)
            await loop_on(client, backend, tmp_path / "checkpoints", every=1)._resume_confirmed(step=0)
            assert client.failed == 1
            assert not (await client.state()).paused

    assert RESUME_RETRY_FIRST_SECONDS <= 0.1
    asyncio.run(scenario())
