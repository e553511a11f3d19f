"""Hostile input over real HTTP: whatever one agent (or anyone who reaches the port) sends is refused at the
door with a clear 4xx, and the run goes on: the trainer's events read and a normal model call still work."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncrl.gateway.admission import EVENT_ENVELOPE_BYTES
from tests.gateway.conftest import RunningGateway, create_rollouts, launch_gateway, start_rollouts

CHAT = {"model": "anything", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
JSON = {"content-type": "application/json"}
BODY_LIMIT = 256 * 1024
EVENT_BYTES_LIMIT = 8 * 1024


@pytest.fixture(scope="module")
def guarded(upstream_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    """One gateway for the module, with the limits lowered by their flags so the attacks stay small."""
    running = launch_gateway(
        [upstream_url],
        tmp_path_factory.mktemp("guarded"),
        f"--max-body-bytes={BODY_LIMIT}",
        f"--max-event-bytes={EVENT_BYTES_LIMIT}",
    )
    yield running
    running.process.stop()


def _events_path(rollout_id: str, attempt_id: str = "a1") -> str:
    return f"/api/rollouts/{rollout_id}/attempt/{attempt_id}/events"


def assert_run_unaffected(gateway: RunningGateway, rollout_id: str) -> dict[str, Any]:
    """The trainer's read of the rollout works and the agent's next model call is answered."""
    with gateway.agent(rollout_id) as agent:
        assert agent.post(gateway.proxy_path(rollout_id), json=CHAT).status_code == 200
    with gateway.management() as admin:
        read = admin.get(f"/api/rollouts/{rollout_id}/events")
    assert read.status_code == 200, read.text
    document: dict[str, Any] = json.loads(read.content, parse_constant=pytest.fail)
    return document


def _chunks(total: int, size: int = 64 * 1024) -> Iterator[bytes]:
    """A body without Content-Length: httpx sends it chunked."""
    sent = 0
    while sent < total:
        yield b"x" * min(size, total - sent)
        sent += size


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _answer_without_sending_the_body(gateway: RunningGateway, method: str, path: str, token: str) -> bytes:
    """Send only the headers of a chunked request and return what the gateway answers meanwhile."""
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        headers = f"{method} {path} HTTP/1.1\r\nhost: {host}\r\ntransfer-encoding: chunked\r\n"
        if token:
            headers += f"authorization: Bearer {token}\r\n"
        connection.sendall((headers + "\r\n").encode())
        answer = b""
        while b"\r\n\r\n" not in answer:
            received = connection.recv(65536)  # times out (the test fails) if the gateway waits for a body
            if not received:
                break
            answer += received
        return answer


def test_a_wrong_or_missing_token_is_answered_before_any_body_byte_arrives(guarded: RunningGateway) -> None:
    with guarded.management() as admin:
        create_rollouts(admin, "door-r1")
    other_rollouts_token = guarded.agent("door-r2").headers["authorization"].removeprefix("Bearer ")
    for method, path, token, status in [
        ("POST", "/api/rollouts", "", b"401"),
        ("POST", "/proxy/pause", "wrong", b"403"),
        ("POST", _events_path("door-r1"), "", b"401"),
        ("POST", _events_path("door-r1"), other_rollouts_token, b"403"),
        ("POST", "/api/rollouts", other_rollouts_token, b"403"),
        ("POST", guarded.proxy_path("door-r1"), "", b"401"),
        ("POST", guarded.proxy_path("door-r1"), other_rollouts_token, b"403"),
    ]:
        answer = _answer_without_sending_the_body(guarded, method, path, token)
        assert answer.startswith(b"HTTP/1.1 " + status), (method, path, answer)


def test_unparseable_bodies_without_a_token_get_401_not_400(guarded: RunningGateway) -> None:
    for path in ["/api/rollouts", "/api/rollouts/claim", _events_path("door-r1"), guarded.proxy_path("r")]:
        response = httpx.post(guarded.url + path, content=b"[" * 100_000, headers=JSON)
        assert response.status_code == 401, (path, response.text)
        assert response.headers["www-authenticate"] == "Bearer"


def test_large_chunked_bodies_without_a_token_are_refused_and_do_not_grow_the_gateway(
    guarded: RunningGateway,
) -> None:
    pid = guarded.process.process.pid
    assert (
        httpx.post(guarded.url + "/api/rollouts", content=_chunks(1024 * 1024), headers=JSON).status_code
        == 401
    )
    before = _rss_bytes(pid)
    for path in ["/api/rollouts", _events_path("door-r1")]:
        started = time.monotonic()
        response = httpx.post(guarded.url + path, content=_chunks(48 * 1024 * 1024), headers=JSON, timeout=60)
        assert response.status_code == 401, response.text
        assert time.monotonic() - started < 30
    grown = _rss_bytes(pid) - before
    assert grown < 8 * 1024 * 1024, f"the gateway grew by {grown / 2**20:.1f} MiB reading refused bodies"
    metrics = httpx.get(guarded.url + "/metrics").text
    assert 'asyncrl_gateway_rejections_total{reason="unauthenticated"}' in metrics


def test_chunked_bodies_over_the_limit_with_a_valid_token_get_413_naming_the_limit(
    guarded: RunningGateway,
) -> None:
    start_rollouts(guarded, "big-r1")
    event_limit = EVENT_BYTES_LIMIT + EVENT_ENVELOPE_BYTES  # an event's body: no more than it may store
    with guarded.management() as admin, guarded.agent("big-r1") as agent:
        for client, path, limit, setting in [
            (admin, "/api/rollouts", BODY_LIMIT, "--max-body-bytes"),
            (agent, _events_path("big-r1"), event_limit, "--max-event-bytes"),
            (agent, guarded.proxy_path("big-r1"), BODY_LIMIT, "--max-body-bytes"),
        ]:
            response = client.post(path, content=_chunks(limit + 1), headers=JSON)
            assert response.status_code == 413, (path, response.text)
            assert response.json()["limit_bytes"] == limit
            assert response.json()["setting"] == setting
        # Just under the limit is read and judged on its content.
        under = agent.post(_events_path("big-r1"), content=_chunks(event_limit), headers=JSON)
        assert under.status_code == 400
    assert_run_unaffected(guarded, "big-r1")


def _nested(depth: int) -> object:
    value: object = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def test_deep_json_gets_422_naming_the_field_and_the_run_goes_on(guarded: RunningGateway) -> None:
    start_rollouts(guarded, "deep-r1")
    with guarded.management() as admin, guarded.agent("deep-r1") as agent:
        note = agent.post(_events_path("deep-r1"), json={"event_type": "note", "data": {"d": _nested(300)}})
        assert note.status_code == 422, note.text
        assert note.json()["field"].startswith("data.d.0.0")
        assert (note.json()["limit"], note.json()["setting"]) == (64, "--max-json-depth")

        bomb = agent.post(guarded.proxy_path("deep-r1"), content=b"[" * 100_000)
        assert bomb.status_code == 422, bomb.text
        deep_call = agent.post(guarded.proxy_path("deep-r1"), json={**CHAT, "tools": _nested(100)})
        assert deep_call.status_code == 422
        assert deep_call.json()["field"].startswith("tools.0.0")

        rollout = {"rollout_id": "deep-r2", "group_id": "g", "step": 0, "input": {"q": _nested(100)}}
        created = admin.post("/api/rollouts", json=[rollout])
        assert created.status_code == 422
        assert created.json()["field"].startswith("0.input.q.0")
        assert admin.get("/api/rollouts/deep-r2").status_code == 404

        fine = agent.post(_events_path("deep-r1"), json={"event_type": "note", "data": {"d": _nested(10)}})
        assert fine.status_code == 201
    document = assert_run_unaffected(guarded, "deep-r1")
    assert [event["event_type"] for event in document["events"]] == ["note"]


def test_a_lone_surrogate_escape_gets_a_400_that_says_so(guarded: RunningGateway) -> None:
    """Issue 37: `"\\ud800"` got a 400 whose detail read "Input data was truncated" (msgspec's words)."""
    start_rollouts(guarded, "surrogate-r1")
    with guarded.agent("surrogate-r1") as agent:
        call = agent.post(
            guarded.proxy_path("surrogate-r1"),
            content=b'{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
            headers={"content-type": "application/json"},
        )
        assert call.status_code == 400, call.text
        assert "\\ud800 without its pair" in call.json()["detail"], call.text
        assert "truncated" not in call.json()["detail"]
        paired = agent.post(  # a surrogate pair is a character: the call goes through
            guarded.proxy_path("surrogate-r1"),
            content=b'{"model": "m", "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}',
            headers={"content-type": "application/json"},
        )
        assert paired.status_code == 200, paired.text
    assert_run_unaffected(guarded, "surrogate-r1")


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_rewards_and_model_call_parameters_are_refused(
    guarded: RunningGateway, literal: str
) -> None:
    rollout_id = f"nan-{literal.lower().replace('-', 'minus')}"
    start_rollouts(guarded, rollout_id)
    with guarded.agent(rollout_id) as agent:
        reward = agent.post(
            _events_path(rollout_id),
            content=f'{{"event_type": "reward", "data": {{"value": {literal}}}}}',
            headers=JSON,
        )
        assert reward.status_code == 422, reward.text
        assert reward.json()["field"] == "data.value"
        call = agent.post(
            guarded.proxy_path(rollout_id),
            content=json.dumps(CHAT)[:-1] + f', "temperature": {literal}}}',
            headers=JSON,
        )
        assert call.status_code == 422
        assert call.json()["field"] == "temperature"
    document = assert_run_unaffected(guarded, rollout_id)
    assert document["rollout"]["reward"] is None


def test_a_400_digit_reward_gets_422_naming_data_value(guarded: RunningGateway) -> None:
    start_rollouts(guarded, "huge-r1")
    with guarded.agent("huge-r1") as agent:
        response = agent.post(
            _events_path("huge-r1"),
            content=b'{"event_type": "reward", "data": {"value": 1' + b"0" * 400 + b"}}",
            headers=JSON,
        )
        assert response.status_code == 422, response.text
        assert response.json()["field"] == "data.value"
        assert "finite number" in response.json()["error"]
    document = assert_run_unaffected(guarded, "huge-r1")
    assert document["rollout"]["reward"] is None
    assert document["events"] == []


def test_rewards_are_refused_after_the_rollout_ended_and_from_attempts_it_never_had(
    guarded: RunningGateway,
) -> None:
    start_rollouts(guarded, "late-r1")
    with guarded.management() as admin, guarded.agent("late-r1") as agent:
        reward = {"event_type": "reward", "data": {"value": 0.25}}
        stranger = agent.post(_events_path("late-r1", attempt_id="a7"), json=reward)
        assert stranger.status_code == 404, stranger.text
        assert "has no attempt 'a7'" in stranger.json()["error"]
        stray_call = agent.post(
            guarded.proxy_path("late-r1").replace("/attempt/a1/", "/attempt/a7/"), json=CHAT
        )
        assert stray_call.status_code == 404

        assert agent.post(_events_path("late-r1"), json=reward).status_code == 201
        assert_run_unaffected(guarded, "late-r1")
        admin.post("/api/rollouts/late-r1/transition", json={"state": "succeeded"})

        late = agent.post(_events_path("late-r1"), json={"event_type": "reward", "data": {"value": 1.0}})
        assert late.status_code == 409, late.text
        assert "already finished" in late.json()["error"]
        assert agent.post(_events_path("late-r1"), json={"event_type": "note"}).status_code == 409

        document = admin.get("/api/rollouts/late-r1/events").json()
        assert document["rollout"]["reward"] == 0.25
        assert [event["event_type"] for event in document["events"]] == ["reward"]
        feed = admin.get("/api/completions", params={"after": 0, "wait": 0}).json()["entries"]
        assert [entry["reward"] for entry in feed if entry["rollout_id"] == "late-r1"] == [0.25]


def test_a_reward_posted_before_the_rollout_ran_counts_only_if_its_attempt_is_the_one_that_ran(
    guarded: RunningGateway,
) -> None:
    with guarded.management() as admin:
        create_rollouts(admin, "early-r1", "early-r2")
        for rollout_id, attempt_id in [("early-r1", "a1"), ("early-r2", "a9")]:
            with guarded.agent(rollout_id) as agent:  # a fast agent, before the operator saw it running
                posted = agent.post(
                    _events_path(rollout_id, attempt_id), json={"event_type": "reward", "data": {"value": 1}}
                )
                assert posted.status_code == 201
            transition = {"state": "running", "attempt_id": "a1"}
            admin.post(f"/api/rollouts/{rollout_id}/transition", json=transition)
        assert admin.get("/api/rollouts/early-r1").json()["reward"] == 1.0
        assert admin.get("/api/rollouts/early-r2").json()["reward"] is None


def test_event_data_per_rollout_is_bounded(guarded: RunningGateway) -> None:
    start_rollouts(guarded, "chatty-r1")
    note = {"event_type": "note", "data": {"text": "x" * 1000}}
    with guarded.agent("chatty-r1") as agent:
        statuses = [agent.post(_events_path("chatty-r1"), json=note).status_code for _ in range(12)]
    accepted = EVENT_BYTES_LIMIT // len(json.dumps(note["data"]))
    assert statuses == [201] * accepted + [413] * (12 - accepted)
    document = assert_run_unaffected(guarded, "chatty-r1")
    assert len(document["events"]) == accepted


def test_gateway_help_names_the_limits_and_their_defaults(tmp_path: Path) -> None:
    import subprocess
    import sys

    shown = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "gateway", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--max-body-bytes", "--max-json-depth", "--max-event-bytes"):
        assert flag in shown
    assert "default 8388608" in shown
    assert "default 64" in shown


def test_limits_out_of_range_are_refused_at_start(upstream_url: str, tmp_path: Path) -> None:
    with pytest.raises(
        RuntimeError, match=r"invalid configuration: --max-json-depth: .*less than or equal to 256"
    ):
        launch_gateway([upstream_url], tmp_path, "--max-json-depth=5000")
