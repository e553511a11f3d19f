"""The verl backend waits for its inference server's model name (`served_model_name`), against a real loopback
HTTP server that answers 503, then an empty model list, then the model: each answer is one counted request."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from asyncrl.testing.controlplane import free_port
from asyncrl.trainer.backends.verl.backend import served_model_name


class _Server(ThreadingHTTPServer):
    def __init__(self, script: list[tuple[int, dict[str, Any]]]) -> None:
        super().__init__(("127.0.0.1", free_port()), _Handler)
        self.script = list(script)
        self.gets = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        self.server.gets += 1
        status, reply = self.server.script.pop(0) if len(self.server.script) > 1 else self.server.script[0]
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def _serving(script: list[tuple[int, dict[str, Any]]]) -> Iterator[_Server]:
    server = _Server(script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_a_starting_server_is_asked_again_until_it_names_its_model() -> None:
    script = [(503, {"error": "starting"}), (200, {"data": []}), (200, {"data": [{"id": "/models/tiny"}]})]
    for server in _serving(script):
        assert asyncio.run(served_model_name(server.url, poll_seconds=0.05)) == "/models/tiny"
        assert server.gets == 3


def test_a_server_that_never_names_a_model_fails_after_its_attempts_with_the_last_reason() -> None:
    for server in _serving([(200, {"data": []})]):
        with pytest.raises(RuntimeError, match=r"named no model after 3 tries: no model listed yet"):
            asyncio.run(served_model_name(server.url, attempts=3, poll_seconds=0.05))
        assert server.gets == 3
