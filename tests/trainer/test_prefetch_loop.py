"""The step loop prepares each step's rows before pausing: a real gateway process, real agents over HTTP.

A paused gateway sees no events request at all (the rows were fetched in batches as groups completed), and
the batches trained are whole groups, never one twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.gateway_api.client import EventsBatch, GatewayClient
from asyncrl.gateway_api.events import EventsDocument
from asyncrl.gateway_api.models import PauseView
from asyncrl.testing.controlplane import free_port
from asyncrl.trainer.data import PromptSource
from asyncrl.trainer.loop import StepLoop
from asyncrl.trainer.metrics import JsonLinesSink, MetricsSinks
from tests.trainer.test_restarts import (
    KEY,
    ROWS,
    TRAIN_BATCH,
    RecordingBackend,
    _gateway,
    _run_with_agents,
    _settings,
    _upstream,
)

STEPS = 4


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    url, server = _upstream(tmp_path)
    yield url
    server.stop()


class CountingClient(GatewayClient):
    """Counts events reads, split by whether the gateway was paused at the time."""

    def __init__(self, base_url: str, key: str) -> None:
        super().__init__(base_url, key)
        self.paused = False
        self.single_reads = {"paused": 0, "running": 0}
        self.batch_reads = {"paused": 0, "running": 0}

    def _when(self) -> str:
        return "paused" if self.paused else "running"

    async def pause(self, **kwargs: Any) -> Any:
        result = await super().pause(**kwargs)
        self.paused = True
        return result

    async def resume(self, *, model_version: int | None = None) -> PauseView:
        self.paused = False
        return await super().resume(model_version=model_version)

    async def rollout_events(self, rollout_id: str) -> EventsDocument:
        self.single_reads[self._when()] += 1
        return await super().rollout_events(rollout_id)

    async def rollout_events_batch(self, rollout_ids: Any, *, max_bytes: int | None = None) -> EventsBatch:
        self.batch_reads[self._when()] += 1
        return await super().rollout_events_batch(rollout_ids, max_bytes=max_bytes)


def _run(tmp_path: Path, upstream: str) -> tuple[CountingClient, RecordingBackend, list[dict[str, Any]]]:
    port = free_port()
    gateway_url = f"http://127.0.0.1:{port}"
    gateway = _gateway(port, tmp_path)
    backend = RecordingBackend(upstream)
    metrics_path = tmp_path / "metrics.jsonl"

    async def main() -> CountingClient:
        client = CountingClient(gateway_url, KEY)
        async with client:
            settings = dataclasses.replace(
                _settings(steps=STEPS, checkpoint_dir=None), events_batch_rollouts=3
            )
            loop = StepLoop(
                settings=settings,
                gateway=client,
                backend=backend,
                prompts=PromptSource(ROWS, shuffle=False, seed=0),
                sinks=MetricsSinks([JsonLinesSink(metrics_path)]),
            )
            result = await _run_with_agents(loop, gateway_url)
            assert result.next_step == STEPS
        return client

    try:
        client = asyncio.run(main())
    finally:
        gateway.stop()
    metrics = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    return client, backend, metrics


def _assert_whole_groups_trained_once(backend: RecordingBackend) -> None:
    assert [step for step, _ in backend.updates] == list(range(STEPS))
    assert all(len(groups) == TRAIN_BATCH for _, groups in backend.updates)
    trained = [group for _, groups in backend.updates for group in groups]
    assert len(trained) == len(set(trained)), "a group was trained twice"
    assert len(backend.trained_rollouts) == len(set(backend.trained_rollouts))
    assert len(backend.trained_rollouts) == STEPS * TRAIN_BATCH * 2  # every sibling made a call: rows for all


@pytest.mark.slow
def test_the_paused_gateway_sees_no_events_request(tmp_path: Path, upstream: str) -> None:
    client, backend, metrics = _run(tmp_path, upstream)

    _assert_whole_groups_trained_once(backend)
    assert client.single_reads == {"paused": 0, "running": 0}
    assert client.batch_reads["paused"] == 0
    for line in metrics:
        assert line["training/prefetch/rollouts_fetched_at_pause"] == 0
        assert line["timing/pause_to_update_seconds"] >= 0
    prepared = int(sum(line["training/prefetch/rollouts_prepared_ahead"] for line in metrics))
    assert prepared >= STEPS * TRAIN_BATCH * 2
    # Batches of at most 3 rollouts, fewer requests than rollouts. A batch may hold groups of two steps (it
    # takes whatever groups have completed), so the bound is over the whole run, not per step.
    assert -(-prepared // 3) <= client.batch_reads["running"] < STEPS * TRAIN_BATCH * 2
