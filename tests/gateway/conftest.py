"""Gateway fixtures: a real upstream process and a real `asyncrl gateway` process on loopback."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from asyncrl.gateway_api.tokens import agent_token
from asyncrl.testing.controlplane import free_port
from asyncrl.testing.processes import ServerProcess, start_server

KEY = "test-gateway-key-0123456789"


@dataclass
class RunningGateway:
    url: str
    key: str
    process: ServerProcess

    def management(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {self.key}"}, timeout=30)

    def agent(self, rollout_id: str) -> httpx.Client:
        token = agent_token(self.key, rollout_id)
        return httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {token}"}, timeout=30)

    def proxy_path(self, rollout_id: str, endpoint: str = "chat/completions", mode: str = "train") -> str:
        return f"/proxy/rollout/{rollout_id}/attempt/a1/mode/{mode}/openai/v1/{endpoint}"


def launch_upstream(log_dir: Path) -> tuple[str, ServerProcess]:
    """A fake OpenAI-compatible server (asyncrl.fake_upstream) on a free port: (base URL, process)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(
        [sys.executable, "-m", "asyncrl.fake_upstream", "--port", str(port)],
        ready_url=f"{url}/stats",
        log_path=log_dir / "upstream.log",
    )
    return url, server


@pytest.fixture(scope="session")
def upstream_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, server = launch_upstream(tmp_path_factory.mktemp("upstream"))
    yield url
    server.stop()


def launch_gateway(upstreams: list[str], log_dir: Path, *extra: str) -> RunningGateway:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "asyncrl.cli", "gateway", "--port", str(port), "--model", "served-model"]
    for upstream in upstreams:
        argv += ["--upstream", upstream]
    env = {**os.environ, "ASYNCRL_GATEWAY_KEY": KEY}
    process = start_server(
        [*argv, *extra], ready_url=f"{url}/readyz", log_path=log_dir / "gateway.log", env=env
    )
    return RunningGateway(url=url, key=KEY, process=process)


@pytest.fixture
def gateway(upstream_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    running = launch_gateway([upstream_url], tmp_path)
    yield running
    running.process.stop()
    assert KEY not in running.process.log(), "the gateway key must never be logged"


@pytest.fixture
def full_capture_gateway(upstream_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """A gateway with `--capture=full`: the events document shows each call's request and response JSON."""
    running = launch_gateway([upstream_url], tmp_path, "--capture=full")
    yield running
    running.process.stop()


@pytest.fixture
def reject_gateway(upstream_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """A gateway in Reject mode: Agent Lightning's 429 contract while paused."""
    running = launch_gateway([upstream_url], tmp_path, "--pause-mode", "reject")
    yield running
    running.process.stop()
    assert KEY not in running.process.log(), "the gateway key must never be logged"


def create_rollouts(client: httpx.Client, *rollout_ids: str, group_id: str = "g1", **fields: object) -> None:
    body = [
        {"rollout_id": rid, "group_id": group_id, "step": 0, "input": {"q": rid}, **fields}
        for rid in rollout_ids
    ]
    response = client.post("/api/rollouts", json=body)
    assert response.status_code == 201, response.text


def start_rollouts(gateway: RunningGateway, *rollout_ids: str) -> None:
    """Create the rollouts and mark each running at attempt a1, as the operator does for its agents."""
    with gateway.management() as admin:
        create_rollouts(admin, *rollout_ids)
        for rollout_id in rollout_ids:
            transition = {"state": "running", "attempt_id": "a1"}
            assert admin.post(f"/api/rollouts/{rollout_id}/transition", json=transition).status_code == 200
