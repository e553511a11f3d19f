"""One agent token cannot take the gateway's event loop (issue 24 item 3), over real HTTP on loopback.

A 5.7 MB event body of 1.9 million `{}` cost 1.6 s of the loop: it was read whole, parsed at the door, parsed
again by FastAPI, validated, and sized with json.dumps, before the 1 MiB event limit answered 413. Now an
event body larger than its rollout may store is refused while it arrives, and each agent token has a budget
of requests in flight and body bytes per second.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from asyncrl.gateway_api.tokens import agent_token
from tests.gateway.conftest import RunningGateway, launch_gateway, start_rollouts

CHAT = {"model": "anything", "messages": [{"role": "user", "content": "hi"}]}
ATTACK_BYTES = 5_700_000  # the body: 1.9 million `{}`
DEADLINE_SECONDS = 60.0


@pytest.fixture
def budgeted(upstream_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    """A gateway whose agents may each have two requests in flight."""
    running = launch_gateway([upstream_url], tmp_path, "--agent-max-requests=2")
    yield running
    running.process.stop()


def _parsed_bytes(gateway: RunningGateway) -> float:
    metrics = httpx.get(gateway.url + "/metrics").text
    line = next(
        line for line in metrics.splitlines() if line.startswith("asyncrl_gateway_parsed_body_bytes_total")
    )
    return float(line.split()[-1])


def _answer_to_a_body_never_finished(gateway: RunningGateway, head: bytes, first_part: bytes) -> bytes:
    """Send a request's head and the start of its body, never the rest; return what the gateway answers
    (empty if it closed without one, or nothing came within the deadline). The answer is read while the
    body is being sent: a gateway that refuses early closes with bytes still on the way, and the reset that
    then reaches this side would drop an answer not read before it (seen in CI on a loaded machine)."""
    host, port = gateway.url.removeprefix("http://").split(":")
    received = bytearray()
    with socket.create_connection((host, int(port)), timeout=DEADLINE_SECONDS) as conn:

        def read() -> None:
            deadline = time.monotonic() + DEADLINE_SECONDS
            try:
                while time.monotonic() < deadline:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    received.extend(chunk)
                    head_end = received.find(b"\r\n\r\n")
                    if head_end >= 0 and b"}" in received[head_end:]:  # the head and the JSON error body
                        return
            except (TimeoutError, ConnectionResetError):
                return

        reader = threading.Thread(target=read)
        reader.start()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # refused and closed mid-body
            conn.sendall(head + first_part)
        reader.join(timeout=DEADLINE_SECONDS + 5)
    return bytes(received)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_an_event_body_larger_than_its_rollout_may_store_is_refused_before_it_has_all_arrived(
    gateway: RunningGateway, framing: str
) -> None:
    """The 413 comes while the body is still on its way: it was neither waited for whole nor parsed. (The
    previous gateway waited for all 5.7 MB, below --max-body-bytes, then parsed them: no answer here.)"""
    start_rollouts(gateway, "flood-r1")
    parsed_before = _parsed_bytes(gateway)
    token = agent_token(gateway.key, "flood-r1")
    chunked = framing == "chunked"
    length = "transfer-encoding: chunked" if chunked else f"content-length: {ATTACK_BYTES}"
    head = (
        f"POST /api/rollouts/flood-r1/attempt/a1/events HTTP/1.1\r\nhost: gateway\r\n"
        f"authorization: Bearer {token}\r\ncontent-type: application/json\r\n{length}\r\n\r\n"
    ).encode()
    body = b'{"event_type":"note","data":{"d":[' + b",".join([b"{}"] * 700_000)  # 2.1 MB, more follows
    first_part = b"%x\r\n%s\r\n" % (len(body), body) if chunked else body
    answer = _answer_to_a_body_never_finished(gateway, head, first_part)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:300]
    assert b'"setting":"--max-event-bytes"' in answer.replace(b" ", b"")
    assert _parsed_bytes(gateway) == parsed_before  # nothing of it reached a parser
    with gateway.agent("flood-r1") as agent:  # the agent's ordinary event still goes through
        note = {"event_type": "note", "data": {"d": [{}] * 10}}
        posted = agent.post("/api/rollouts/flood-r1/attempt/a1/events", json=note)
    assert posted.status_code == 201, posted.text
    assert _parsed_bytes(gateway) > parsed_before


def test_a_model_call_of_millions_of_tiny_values_is_refused_for_its_cost_without_being_parsed(
    gateway: RunningGateway,
) -> None:
    """5.7 MB is within --max-body-bytes, but 3.8 million values cost the agent more than its whole budget:
    413 before any parse. (The previous gateway parsed it, encoded it again and forwarded it.)"""
    start_rollouts(gateway, "values-r1")
    parsed_before = _parsed_bytes(gateway)
    body = b'{"messages":[' + b",".join([b"{}"] * 1_900_000) + b"]}"
    with gateway.agent("values-r1") as agent:
        refused = agent.post(gateway.proxy_path("values-r1"), content=body)
        assert refused.status_code == 413, refused.text
        assert refused.json()["setting"] == "--agent-burst-bytes"
        assert _parsed_bytes(gateway) == parsed_before
        assert agent.post(gateway.proxy_path("values-r1"), json=CHAT).status_code == 200


def test_a_wide_body_nested_too_deep_is_refused_without_being_parsed(gateway: RunningGateway) -> None:
    start_rollouts(gateway, "deep-r1")
    parsed_before = _parsed_bytes(gateway)
    deep = b"[" * 70 + b"]" * 70
    body = b'{"event_type":"note","data":{"d":[' + b",".join([b"{}"] * 100_000) + b"," + deep + b"]}}"
    with gateway.agent("deep-r1") as agent:
        refused = agent.post("/api/rollouts/deep-r1/attempt/a1/events", content=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["setting"] == "--max-json-depth"
    assert _parsed_bytes(gateway) == parsed_before


def test_an_agent_over_its_requests_in_flight_gets_429_with_retry_after_while_another_is_served(
    budgeted: RunningGateway,
) -> None:
    """Two model calls of one agent are held by a pause (in flight); its third is refused at once with
    Retry-After, while another rollout's agent is served. (The previous gateway held the third too.)"""
    start_rollouts(budgeted, "busy-r1", "calm-r1")
    statuses: dict[str, int] = {}

    def call(name: str, rollout_id: str) -> None:
        with budgeted.agent(rollout_id) as agent:
            agent.timeout = httpx.Timeout(DEADLINE_SECONDS * 2)
            statuses[name] = agent.post(budgeted.proxy_path(rollout_id), json=CHAT).status_code

    with budgeted.management() as admin:
        assert admin.post("/proxy/pause", json={"reason": "budget test"}).status_code == 200
        held = [threading.Thread(target=call, args=(f"held-{n}", "busy-r1")) for n in range(2)]
        for thread in held:
            thread.start()
        deadline = time.monotonic() + DEADLINE_SECONDS
        while admin.get("/api/stats").json().get("held", 0) < 2:
            assert time.monotonic() < deadline, "the two calls were never held"
            time.sleep(0.05)
        with budgeted.agent("busy-r1") as agent:
            agent.timeout = httpx.Timeout(DEADLINE_SECONDS)
            third = agent.post(budgeted.proxy_path("busy-r1"), json=CHAT)
        assert third.status_code == 429, third.text
        assert float(third.headers["retry-after"]) > 0
        assert third.json()["setting"] == "--agent-max-requests"
        with budgeted.agent("calm-r1") as other:
            assert other.get("/api/rollouts/calm-r1").status_code == 200
        calm = threading.Thread(target=call, args=("calm", "calm-r1"))
        calm.start()
        while admin.get("/api/stats").json().get("held", 0) < 3:
            assert time.monotonic() < deadline, "the other agent's call was not taken"
            time.sleep(0.05)
        assert admin.post("/proxy/resume", json={"model_version": 1}).status_code == 200
    for thread in [*held, calm]:
        thread.join(DEADLINE_SECONDS)
    assert statuses == {"held-0": 200, "held-1": 200, "calm": 200}
