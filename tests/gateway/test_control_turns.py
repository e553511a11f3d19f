"""The pause, resume and state routes answer in the event-loop turn they start in.

On a busy gateway each turn of the event loop is a round of proxy work (every answer's tokens are read when
the call is captured), so each turn a control request gives up adds that round to the trainer's pause
(issue 27 item 4). Counted in turns, never in seconds: a callback that schedules itself with `call_soon` runs
once per turn. In-process, through the gateway's ASGI callable, without sockets.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from asyncrl.gateway.app import Gateway, build_gateway
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.run_settings import standalone_defaults

KEY = "k" * 32


@dataclass
class TurnCounter:
    """Counts the loop's turns from `start()` until `stop()`."""

    turns: int = 0
    running: bool = False

    def start(self) -> None:
        self.running = True
        asyncio.get_running_loop().call_soon(self._tick)

    def stop(self) -> int:
        self.running = False
        return self.turns

    def _tick(self) -> None:
        if self.running:
            self.turns += 1
            asyncio.get_running_loop().call_soon(self._tick)


@dataclass
class Answer:
    messages: list[dict[str, Any]] = field(default_factory=list)
    sent: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])


async def request(
    gateway: Gateway,
    method: str,
    path: str,
    body: bytes = b"",
    query: bytes = b"",
    answer: Answer | None = None,
) -> Answer:
    """One request with the gateway key; returns when the answer's last byte was sent."""
    answer = answer or Answer()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        answer.messages.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            answer.sent.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [
            (b"authorization", f"Bearer {KEY}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8090),
    }
    await gateway.asgi(scope, receive, send)
    return answer


def new_gateway() -> Gateway:
    return build_gateway(GatewayConfig(run=standalone_defaults(model="m"), key=KEY))


def test_pause_state_and_resume_are_answered_without_giving_up_the_loop() -> None:
    async def scenario() -> list[tuple[str, int, int]]:
        gateway = new_gateway()
        counted = []
        for method, path, body, query in [
            ("POST", "/proxy/pause", b'{"reason": "update", "abort": true}', b"wait=60"),
            ("GET", "/proxy/state", b"", b""),
            ("POST", "/proxy/resume", b'{"model_version": 3}', b""),
        ]:
            counter = TurnCounter()
            counter.start()
            answer = await request(gateway, method, path, body, query)
            counted.append((path, answer.status, counter.stop()))
        return counted

    # Before: a thread hop for the access check and Starlette's middleware task, 12 to over 100 turns each.
    assert asyncio.run(scenario()) == [
        ("/proxy/pause", 200, 0),
        ("/proxy/state", 200, 0),
        ("/proxy/resume", 200, 0),
    ]


def test_a_pause_that_waits_for_the_drain_answers_on_the_turn_after_the_last_call_left() -> None:
    async def scenario() -> int:
        gateway = new_gateway()
        gateway.pause.enter()  # a model call in flight
        answer = Answer()
        pausing = asyncio.ensure_future(request(gateway, "POST", "/proxy/pause", b"{}", b"wait=60", answer))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not answer.sent.is_set(), "the pause must wait for the call in flight"
        gateway.pause.leave()  # the call ends
        turns = 0
        while not answer.sent.is_set():
            await asyncio.sleep(0)  # one turn of the loop
            turns += 1
        await pausing
        assert answer.status == 200
        return turns

    assert asyncio.run(scenario()) == 1  # through `wait_for` and Starlette's middleware: 6


def test_management_requests_are_counted_by_route_and_status() -> None:
    async def scenario() -> Gateway:
        gateway = new_gateway()
        await request(gateway, "POST", "/proxy/pause", b'{"reason": "update"}')
        await request(gateway, "POST", "/proxy/pause", b'{"reason": 1}')  # not a string: 422
        await request(gateway, "GET", "/proxy/state")
        return gateway

    registry = asyncio.run(scenario()).metrics.registry

    def count(route: str, code: str) -> float | None:
        return registry.get_sample_value("asyncrl_gateway_requests_total", {"route": route, "code": code})

    assert (count("/proxy/pause", "200"), count("/proxy/pause", "422"), count("/proxy/state", "200")) == (
        1,
        1,
        1,
    )
