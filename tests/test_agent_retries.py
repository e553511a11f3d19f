"""The agent helper's retries and the toy agent's streamed calls, against a real loopback HTTP server that
fails a scripted number of times and then answers: which answers are retried, Retry-After, the deadline."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from examples.toy_agent.agent import stream_chat

from asyncrl.agent import AgentEnvironment, RetryableAnswer, chat, report_reward
from asyncrl.testing.controlplane import free_port

ANSWER = {"choices": [{"message": {"role": "assistant", "content": "ab"}}]}
STREAM = [
    b": a comment line, which readers ignore\n\n",
    b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n',
    b'data:{"choices": [{"delta": {"content": "a"}}]}\r\n\r\n',  # no space after the colon, CRLF lines
    b'data: {"choices": [{"delta": {"content": "b"}}]}\n\n',
    b"data: [DONE]\n\n",
]


class _Server(ThreadingHTTPServer):
    """Answers each POST from a script of (status, Retry-After or None), then 200 (JSON, or SSE when the
    request streams); `script_forever` repeats the first entry for good."""

    def __init__(self, script: list[tuple[int, str | None]], *, forever: bool = False) -> None:
        super().__init__(("127.0.0.1", free_port()), _Handler)
        self.script = list(script)
        self.forever = forever
        self.posts: list[tuple[float, dict[str, Any]]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.posts.append((time.monotonic(), body))
        if self.server.script:
            status, retry_after = self.server.script[0]
            if not self.server.forever:
                self.server.script.pop(0)
            data = json.dumps({"error": {"message": f"scripted {status}"}}).encode()
            self.send_response(status)
            if retry_after is not None:
                self.send_header("retry-after", retry_after)
            self._send(data, "application/json")
        elif body.get("stream"):
            self._send(b"".join(STREAM), "text/event-stream; charset=utf-8", status=200)
        else:
            self._send(json.dumps(ANSWER).encode(), "application/json", status=200)

    def _send(self, data: bytes, content_type: str, *, status: int | None = None) -> None:
        if status is not None:
            self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def _serving(script: list[tuple[int, str | None]], *, forever: bool = False) -> Iterator[_Server]:
    server = _Server(script, forever=forever)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _env(server: _Server) -> AgentEnvironment:
    return AgentEnvironment(f"{server.url}/v1", f"{server.url}/events", "token")


@pytest.fixture
def flaky() -> Iterator[_Server]:
    yield from _serving([(503, "0"), (502, None), (429, "0.3")])


def test_transient_answers_are_retried_until_the_call_is_answered(flaky: _Server) -> None:
    answer = chat([{"role": "user", "content": "hi"}], _env(flaky))
    assert answer == ANSWER
    assert len(flaky.posts) == 4  # 503, 502, 429, then 200: the same body each time
    assert all(body == flaky.posts[0][1] for _, body in flaky.posts)
    waited_after_429 = flaky.posts[3][0] - flaky.posts[2][0]
    assert waited_after_429 >= 0.3  # Retry-After honoured


def test_a_rejection_is_not_retried() -> None:
    for server in _serving([(400, None)]):
        with pytest.raises(httpx.HTTPStatusError) as caught:
            report_reward(1.0, _env(server))
        assert caught.value.response.status_code == 400
        assert not isinstance(caught.value, RetryableAnswer)
        assert len(server.posts) == 1


def test_a_gateway_that_keeps_refusing_is_given_up_after_the_deadline_with_its_last_answer() -> None:
    for server in _serving([(503, "0.1")], forever=True):
        with pytest.raises(httpx.HTTPStatusError) as caught:
            chat([{"role": "user", "content": "hi"}], _env(server), deadline_seconds=0.5)
        assert caught.value.response.status_code == 503
        # Counted, not timed: stamina stops once its next wait would pass the deadline (CI: 0.495 s of 0.5).
        assert len(server.posts) >= 3


def test_a_gateway_that_is_not_there_is_retried_until_the_deadline() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens
    env = AgentEnvironment(f"{url}/v1", f"{url}/events", "token")
    with pytest.raises(TimeoutError, match="did not succeed within 1s"):
        report_reward(1.0, env, deadline_seconds=1.0)


def test_a_gateway_that_drops_each_connection_is_tried_again_before_the_deadline_ends_it() -> None:
    """Counted, not timed: stamina gives up once its next wait would pass the deadline (after 0.6-1 s of a
    1 s deadline), so the elapsed time says nothing; the number of connections it made does."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def drop_each() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = listener.accept()
                accepted.append(1)
                connection.close()  # before any answer: a transport error, which is retried

    thread = threading.Thread(target=drop_each, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with pytest.raises(TimeoutError, match="did not succeed within 1s"):
            report_reward(1.0, AgentEnvironment(f"{url}/v1", f"{url}/events", "token"), deadline_seconds=1.0)
    finally:
        listener.close()
    assert len(accepted) >= 2, accepted


def test_the_toy_agents_stream_waits_out_a_pause_and_reads_every_event() -> None:
    for server in _serving([(429, "0.2")]):
        text = stream_chat([{"role": "user", "content": "hi"}], _env(server), max_tokens=4)
        assert text == "ab"
        assert len(server.posts) == 2
        assert server.posts[1][1]["stream"] is True


def test_the_toy_agents_stream_reports_an_error_the_stream_carries() -> None:
    original = list(STREAM)
    STREAM[2:4] = [b'data: {"error": {"message": "upstream died"}}\n\n']
    try:
        for server in _serving([]):
            with pytest.raises(RuntimeError, match="failed mid-stream"):
                stream_chat([{"role": "user", "content": "hi"}], _env(server))
            assert len(server.posts) == 1  # an error inside a stream is not retried
    finally:
        STREAM[:] = original
