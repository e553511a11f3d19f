"""The step loop across restarts, against a real gateway process: what each restart keeps and what it redoes.

The trainer's backend is a recording stand-in (no torch), so these runs take seconds; everything else is
real: the `asyncrl gateway` process (SIGKILLed and started again on the same port), a fake OpenAI upstream
process whose answers the gateway captures, and agents that claim rollouts, call the model through the proxy
and post rewards over HTTP. The slow local-mode suites (tests/trainer/test_local_faults.py) do the same with
the real trainer process and the reference model.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncrl.agent import AgentEnvironment
from asyncrl.api.types.spec import AsyncSpec
from asyncrl.gateway_api.client import GatewayClient, GatewayError
from asyncrl.gateway_api.models import PauseView, WindowSummary
from asyncrl.rollouts import RolloutState
from asyncrl.testing.controlplane import free_port
from asyncrl.testing.processes import ServerProcess, start_server
from asyncrl.trainer.adapter import AdapterConfig
from asyncrl.trainer.backends import UpdateMetrics
from asyncrl.trainer.data import PromptSource
from asyncrl.trainer.loop import LoopSettings, RunResult, StepLoop
from asyncrl.trainer.metrics import JsonLinesSink, MetricsSinks
from asyncrl.trainer.rows import TrainingRow

KEY = "restart-test-key-0123456789"
MODEL = "served-model"
TRAIN_BATCH = 2
ROWS = [{"prompt": f"p{index}"} for index in range(40)]
DEADLINE_SECONDS = 180.0  # generous: CI shares two cores


# -- real processes --------------------------------------------------------------------------------


def _upstream(log_dir: Path) -> tuple[str, ServerProcess]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(
        [sys.executable, "-m", "asyncrl.fake_upstream", "--port", str(port)],
        ready_url=f"{url}/stats",
        log_path=log_dir / "upstream.log",
    )
    return url, server


def _gateway(port: int, log_dir: Path) -> ServerProcess:
    """A gateway without upstreams (the trainer registers them), always on `port`, as local mode runs it."""
    return start_server(
        [sys.executable, "-m", "asyncrl.cli", "gateway", f"--port={port}", f"--model={MODEL}"],
        ready_url=f"http://127.0.0.1:{port}/readyz",
        log_path=log_dir / f"gateway-{time.monotonic_ns()}.log",
        env={**os.environ, "ASYNCRL_GATEWAY_KEY": KEY},
        timeout_seconds=60,
    )


def _kill(server: ServerProcess) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()


@pytest.fixture
def upstream_url(tmp_path: Path) -> Iterator[str]:
    url, server = _upstream(tmp_path)
    yield url
    server.stop()


# -- the stand-ins --------------------------------------------------------------------------------


@dataclass
class RecordingBackend:
    """Trains nothing; records which groups and rollouts each update was given, and checkpoints its step."""

    upstream_url: str
    version: int = 0
    updates: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)  # (step, group ids)
    trained_rollouts: list[str] = field(default_factory=list)
    during_update: Callable[[int], None] | None = None

    @property
    def serve_urls(self) -> tuple[str, ...]:
        return (self.upstream_url,)

    @property
    def served_model(self) -> str:
        return MODEL

    @property
    def model_version(self) -> int:
        return self.version

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def sleep(self) -> None:
        pass

    async def wake(self) -> None:
        pass

    async def update(self, rows: Sequence[TrainingRow], *, step: int) -> UpdateMetrics:
        if self.during_update is not None:
            self.during_update(step)
        self.updates.append((step, tuple(sorted({row.group_id for row in rows}))))
        self.trained_rollouts += sorted({row.rollout_id for row in rows})
        self.version = step + 1
        return UpdateMetrics(
            step=step,
            model_version=self.version,
            loss=0.0,
            grad_norm=0.0,
            reward_mean=0.0,
            reward_std=0.0,
            rows=len(rows),
            trained_tokens=1,
            total_tokens=1,
            seconds=0.0,
            tokens_per_second=0.0,
            clip_fraction=0.0,
            ppo_kl=0.0,
        )

    async def save_checkpoint(self, path: Path, *, step: int) -> None:
        path.mkdir(parents=True, exist_ok=True)
        (path / "state.json").write_text(json.dumps({"step": step}))

    async def load_checkpoint(self, path: Path) -> int:
        self.version = int(json.loads((path / "state.json").read_text())["step"])
        return self.version


async def _agents(gateway_url: str, stop: asyncio.Event) -> None:
    """Local agents: claim rollouts, make one model call through the proxy, post a reward, report success.

    They survive the gateway dying under them as local mode's do: a failed call ends that rollout's agent.
    """

    async def one(rollout_id: str) -> None:
        env = AgentEnvironment.for_rollout(
            gateway_url=gateway_url, gateway_key=KEY, rollout_id=rollout_id, attempt_id="a1"
        )
        with contextlib.suppress(httpx.HTTPError, GatewayError, OSError):  # its gateway died
            async with GatewayClient(gateway_url, KEY) as manager:
                await manager.transition(rollout_id, RolloutState.RUNNING, attempt_id="a1")
                await asyncio.sleep(random.uniform(0.0, 0.4))  # uneven durations make carry-over happen
                async with httpx.AsyncClient(
                    headers={"authorization": f"Bearer {env.key}"}, timeout=30
                ) as http:
                    for _ in range(50):  # a paused gateway answers 429; wait it out
                        answer = await http.post(
                            f"{env.openai_base_url}/chat/completions",
                            json={"model": MODEL, "messages": [{"role": "user", "content": rollout_id}]},
                        )
                        if answer.status_code != 429:
                            break
                        await asyncio.sleep(0.2)
                    answer.raise_for_status()
                    event = {"event_type": "reward", "data": {"value": random.random()}}
                    (await http.post(env.event_url, json=event)).raise_for_status()
                await manager.transition(rollout_id, RolloutState.SUCCEEDED, attempt_id="a1")

    tasks: set[asyncio.Task[None]] = set()
    async with GatewayClient(gateway_url, KEY) as gateway:
        while not stop.is_set():
            try:
                claimed = await gateway.claim(limit=64, wait_seconds=1, lease_seconds=600)
            except httpx.HTTPError:
                await asyncio.sleep(0.2)  # the gateway is restarting
                continue
            for rollout in claimed:
                task = asyncio.create_task(one(rollout.rollout_id))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    for task in list(tasks):
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _settings(*, steps: int, checkpoint_dir: Path | None, every: int = 1) -> LoopSettings:
    return LoopSettings(
        window=AsyncSpec(enabled=True, window_size=4, refill_during_collection=False).window_config(
            train_batch_size=TRAIN_BATCH, samples_per_prompt=2
        ),
        adapter=AdapterConfig(),
        rollout_timeout_seconds=60,
        total_steps=steps,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every_steps=every,
        retry_after_seconds=1,
        drain_timeout_seconds=30,
        gateway_wait_seconds=60,
    )


async def _run_with_agents(
    loop: StepLoop, gateway_url: str, *also: Callable[[], Awaitable[None]]
) -> RunResult:
    stop = asyncio.Event()
    agents = asyncio.create_task(_agents(gateway_url, stop))
    helpers = [asyncio.create_task(helper()) for helper in also]
    try:
        return await asyncio.wait_for(loop.run(), timeout=DEADLINE_SECONDS)
    finally:
        stop.set()
        for helper in helpers:
            helper.cancel()
        await asyncio.gather(agents, *helpers, return_exceptions=True)


async def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _logged_steps(path: Path) -> list[int]:
    return [int(json.loads(line)["step"]) for line in path.read_text().splitlines()]


# -- the suites --------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_gateway_killed_mid_run_is_adopted_and_the_run_finishes_with_every_step(
    tmp_path: Path, upstream_url: str
) -> None:
    port = free_port()
    gateway_url = f"http://127.0.0.1:{port}"
    gateways = [_gateway(port, tmp_path)]
    backend = RecordingBackend(upstream_url)
    lost: dict[str, set[str]] = {}  # when -> group ids in the window that the killed gateway held

    def kill(when: str, loop: StepLoop) -> None:
        lost[when] = {group.group_id for group in loop.window.active_groups}
        _kill(gateways[-1])

    def restart() -> None:
        gateways.append(_gateway(port, tmp_path))

    class KilledWhileCollectingStep3(GatewayClient):
        """The gateway dies as step 3 or later asks for completions (a step whose carried groups suffice asks
        for none, so not always step 3 on a loaded machine): the trainer sees connections refused."""

        loop: StepLoop | None = None
        restarting: asyncio.Task[None] | None = None

        async def completions(self, **kwargs: Any) -> Any:
            if self.loop is not None and self.loop.window.current_step >= 3 and self.restarting is None:
                kill("collect", self.loop)
                self.restarting = asyncio.create_task(asyncio.to_thread(restart))
            return await super().completions(**kwargs)

    async def main() -> RunResult:
        async with KilledWhileCollectingStep3(gateway_url, KEY) as client:
            loop = StepLoop(
                settings=_settings(steps=6, checkpoint_dir=None),
                gateway=client,
                backend=backend,
                prompts=PromptSource(ROWS, shuffle=False, seed=0),
                sinks=MetricsSinks([JsonLinesSink(tmp_path / "metrics.jsonl")]),
            )
            client.loop = loop
            # During step 1's update no call is in flight: the next sync sees the new instance id.
            backend.during_update = lambda step: (kill("update", loop), restart()) if step == 1 else None
            result = await _run_with_agents(loop, gateway_url)
            assert client.restarting is not None, "no step from 3 on asked for completions"
            await client.restarting
            upstreams = await client.upstreams()
            assert upstreams.upstreams == [upstream_url]  # registered again with the new gateway
            return result

    try:
        result = asyncio.run(main())
    finally:
        for gateway in gateways:
            gateway.stop()

    assert len(gateways) == 3
    assert (result.first_step, result.next_step, result.steps_run) == (0, 6, 6)
    assert _logged_steps(tmp_path / "metrics.jsonl") == [0, 1, 2, 3, 4, 5]
    assert [step for step, _ in backend.updates] == [0, 1, 2, 3, 4, 5]
    trained_groups = [group for _, groups in backend.updates for group in groups]
    assert all(len(groups) == TRAIN_BATCH for _, groups in backend.updates)
    assert len(trained_groups) == len(set(trained_groups)), "a group was trained twice"
    assert len(backend.trained_rollouts) == len(set(backend.trained_rollouts)), "a rollout was trained twice"
    # What the killed gateways held was redrawn under new ids, never trained under the old ones.
    trained_after_update_kill = {group for step, groups in backend.updates if step >= 2 for group in groups}
    assert lost["update"]
    assert not lost["update"] & trained_after_update_kill
    trained_after_collect_kill = {group for step, groups in backend.updates if step >= 3 for group in groups}
    assert lost["collect"]
    assert not lost["collect"] & trained_after_collect_kill


class _Killed(BaseException):
    """Stands in for SIGKILL: nothing catches it, no cleanup of the loop runs."""


@pytest.mark.slow
def test_a_restarted_trainer_redoes_lost_steps_and_never_trains_a_checkpointed_batch_again(
    tmp_path: Path, upstream_url: str
) -> None:
    port = free_port()
    gateway_url = f"http://127.0.0.1:{port}"
    gateway = _gateway(port, tmp_path)
    checkpoints, metrics = tmp_path / "checkpoints", tmp_path / "metrics.jsonl"
    first, second = RecordingBackend(upstream_url), RecordingBackend(upstream_url)

    class DiesAfterCheckpointOfStep3(GatewayClient):
        """The first trainer dies after step 3's checkpoint is saved, before its batch leaves the gateway."""

        async def resume(self, *, model_version: int | None = None) -> PauseView:
            if model_version == 4:
                raise _Killed
            return await super().resume(model_version=model_version)

    class DiesDuringStep5(GatewayClient):
        """The second trainer dies while step 5 collects: step 4's update (no checkpoint) is lost."""

        async def pause(self, **kwargs: Any) -> Any:
            if second.version == 5:
                raise _Killed
            return await super().pause(**kwargs)

    def loop(client: GatewayClient, backend: RecordingBackend) -> StepLoop:
        return StepLoop(
            settings=_settings(steps=8, checkpoint_dir=checkpoints, every=2),
            gateway=client,
            backend=backend,
            prompts=PromptSource(ROWS, shuffle=False, seed=0),
            sinks=MetricsSinks([JsonLinesSink(metrics)]),
        )

    async def run(client: GatewayClient, backend: RecordingBackend) -> RunResult | None:
        async with client:
            with contextlib.suppress(_Killed):
                return await _run_with_agents(loop(client, backend), gateway_url)
        return None

    try:
        assert asyncio.run(run(DiesAfterCheckpointOfStep3(gateway_url, KEY), first)) is None
        assert _logged_steps(metrics) == [0, 1, 2, 3]
        assert asyncio.run(run(DiesDuringStep5(gateway_url, KEY), second)) is None
        assert _logged_steps(metrics) == [0, 1, 2, 3, 4]
        third = RecordingBackend(upstream_url)
        result = asyncio.run(run(GatewayClient(gateway_url, KEY), third))

        async def last_summary() -> WindowSummary | None:
            async with GatewayClient(gateway_url, KEY) as client:
                return await client.summary()

        last = asyncio.run(last_summary())
    finally:
        gateway.stop()

    # Every update the gateway received is numbered: steps 0-2, then 4 (the second trainer), then 4-7. The
    # last is the third trainer's 4th update, which local mode tells from a first (issue 37 item 4).
    assert last is not None
    assert (last.step, last.steps_in_process, last.posted) == (7, 4, 8)

    assert result is not None
    assert (result.first_step, result.next_step, result.steps_run) == (4, 8, 4)  # step 4 is redone
    assert "resumed at step 4" in result.describe()
    assert _logged_steps(metrics) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [step for step, _ in second.updates] == [4]
    assert [step for step, _ in third.updates] == [4, 5, 6, 7]
    trained = [
        group for backend in (first, second, third) for _, groups in backend.updates for group in groups
    ]
    assert len(trained) == len(set(trained)), "a group was trained again (step 3's after its checkpoint?)"
