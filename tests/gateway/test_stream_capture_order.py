"""A completed streamed call is in the store before the agent can read its `data: [DONE]`.

An agent that reports its reward (ending its rollout) as soon as it reads [DONE] must not end a rollout that
lacks its last call: the trainer would train on the rollout without it. In-process, without sockets on the
agent's side: the gateway's ASGI callable with a `send` that looks at the store when [DONE] passes it, and the
fake upstream (`asyncrl.fake_upstream`, vLLM's stream shape) served by aiohttp in the same event loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from asyncrl.fake_upstream import build_app
from asyncrl.gateway.app import Gateway, build_gateway
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.run_settings import standalone_defaults
from asyncrl.gateway.store import CapturedCall
from asyncrl.gateway_api.models import RolloutCreate
from asyncrl.gateway_api.tokens import agent_token

KEY = "k" * 32
ANSWER = "alpha beta gamma delta"
DONE_EVENT = b"data: [DONE]\n\n"
DEADLINE_SECONDS = 30.0


@asynccontextmanager
async def running_gateway() -> AsyncIterator[Gateway]:
    """A gateway (not listening) whose upstream is the fake upstream on a loopback port; rollout r1 exists."""
    runner = web.AppRunner(build_app())
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        config = GatewayConfig(
            run=standalone_defaults(model="m"), key=KEY, upstreams=(f"http://127.0.0.1:{port}",)
        )
        gateway = build_gateway(config)
        await gateway.proxy.start()
        try:
            gateway.store.create([RolloutCreate(rollout_id="r1", group_id="g1", step=0)])
            yield gateway
        finally:
            await gateway.proxy.close()
    finally:
        await runner.cleanup()


@dataclass
class Agent:
    """The agent's side of one streamed call: what it was sent, and whether (and when) it leaves."""

    on_done: Callable[[], Awaitable[None]]
    messages: list[dict[str, Any]] = field(default_factory=list)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    delivered: bool = False

    async def receive(self) -> dict[str, Any]:
        if not self.delivered:
            self.delivered = True
            body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "fake_answer": ANSWER}
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if message["type"] == "http.response.body" and message["body"] == DONE_EVENT:
            await self.on_done()


async def stream_call(gateway: Gateway, agent: Agent, endpoint: str = "chat/completions") -> None:
    path = f"/proxy/rollout/r1/attempt/a1/mode/train/openai/v1/{endpoint}"
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {agent_token(KEY, 'r1')}".encode()),
            (b"content-type", b"application/json"),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8090),
    }
    await asyncio.wait_for(gateway.asgi(scope, agent.receive, agent.send), DEADLINE_SECONDS)


def captured(gateway: Gateway) -> list[CapturedCall]:
    return list(gateway.store.get("r1").calls)


def streamed_calls(gateway: Gateway, outcome: str) -> float | None:
    return gateway.metrics.registry.get_sample_value(
        "asyncrl_gateway_streamed_calls_total", {"outcome": outcome}
    )


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_a_completed_stream_is_captured_before_the_agent_is_sent_its_done_event(endpoint: str) -> None:
    async def scenario() -> tuple[list[list[CapturedCall]], Agent, list[CapturedCall], float | None]:
        seen_at_done: list[list[CapturedCall]] = []
        async with running_gateway() as gateway:

            async def on_done() -> None:  # the agent reads [DONE], then would report its reward at once
                seen_at_done.append(captured(gateway))

            agent = Agent(on_done)
            await stream_call(gateway, agent, endpoint)
            return seen_at_done, agent, captured(gateway), streamed_calls(gateway, "completed")

    seen_at_done, agent, calls, completed = asyncio.run(scenario())
    assert len(seen_at_done) == 1, "the agent is sent [DONE] once"
    (at_done,) = seen_at_done
    assert len(at_done) == 1, "the call must be captured before the agent can read [DONE]"
    (call,) = calls
    assert call is at_done[0]  # captured once, not again after the stream ended
    assert call.status == 200
    assert call.aborted is False
    assert len(call.response_token_ids or []) == len(ANSWER.split())
    assert agent.messages[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert completed == 1


def test_an_agent_that_leaves_while_its_done_event_is_sent_keeps_its_call_captured_once() -> None:
    async def scenario() -> tuple[list[CapturedCall], float | None, float | None]:
        async with running_gateway() as gateway:
            never = asyncio.Event()

            async def on_done() -> None:  # the connection drops while [DONE] is being written
                agent.gone.set()
                await never.wait()

            agent = Agent(on_done)
            await stream_call(gateway, agent)
            return (
                captured(gateway),
                streamed_calls(gateway, "completed"),
                streamed_calls(gateway, "abandoned"),
            )

    calls, completed, abandoned = asyncio.run(scenario())
    (call,) = calls
    assert call.status == 200  # the upstream completed it: trained on, not dropped as an aborted call
    assert call.aborted is False
    assert completed == 1
    assert not abandoned
