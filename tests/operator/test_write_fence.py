"""The write fence (operator/write_fence.py): after the operator begins to stop, none of its writes reaches
the API server, and the Lease is released only once the writes already on their way have ended."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from asyncrl.operator.write_fence import FenceClosed, WriteFence
from tests.support.kube import api_client_for


def _config_map(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}}


@pytest.mark.controlplane
def test_a_closed_fence_refuses_writes_on_the_real_api_server_and_still_reads(
    control_plane: Any, api_client: Any, namespace: str
) -> None:
    with api_client_for(control_plane) as fenced_client:
        fence = WriteFence.install(fenced_client)
        core = client.CoreV1Api(fenced_client)
        core.create_namespaced_config_map(namespace, _config_map("before"))
        assert fence.close(timeout=5) == 0
        with pytest.raises(FenceClosed, match="operator stopping"):
            core.create_namespaced_config_map(namespace, _config_map("after"))
        with pytest.raises(FenceClosed):
            core.delete_namespaced_config_map("before", namespace)
        assert core.read_namespaced_config_map("before", namespace).data == {"a": "b"}  # reads go on
    names = {
        item.metadata.name
        for item in client.CoreV1Api(api_client).list_namespaced_config_map(namespace).items
    }
    assert "before" in names
    assert "after" not in names


class _SlowServer(http.server.ThreadingHTTPServer):
    """Answers a POST only once `release` is set: a write on its way when the operator stops."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.order: list[str] = []
        super().__init__(("127.0.0.1", 0), _SlowHandler)


class _SlowHandler(http.server.BaseHTTPRequestHandler):
    server: _SlowServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.server.release.wait(60)
        self.server.order.append("answered")
        payload = json.dumps(json.loads(body)).encode()
        self.send_response(201)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def slow_server() -> Iterator[_SlowServer]:
    server = _SlowServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    thread.join(10)


def test_close_waits_for_a_write_already_on_its_way(slow_server: _SlowServer) -> None:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{slow_server.server_address[1]}"
    with client.ApiClient(configuration) as api:
        fence = WriteFence.install(api)
        core = client.CoreV1Api(api)
        writer = threading.Thread(target=core.create_namespaced_config_map, args=("ns", _config_map("slow")))
        writer.start()
        deadline = threading.Event()
        while fence.in_flight == 0 and not deadline.wait(0.01):
            assert writer.is_alive(), "the write ended before it was seen in flight"
        left: list[int] = []
        closer = threading.Thread(target=lambda: left.append(fence.close(timeout=60)))
        closer.start()
        slow_server.release.set()
        closer.join(90)
        writer.join(90)
        slow_server.order.append("closed")  # after close() returned
    assert left == [0]
    assert slow_server.order == ["answered", "closed"]


def test_close_gives_up_after_its_timeout_and_says_how_many_writes_were_left(
    slow_server: _SlowServer,
) -> None:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{slow_server.server_address[1]}"
    with client.ApiClient(configuration) as api:
        fence = WriteFence.install(api)
        writer = threading.Thread(
            target=client.CoreV1Api(api).create_namespaced_config_map, args=("ns", _config_map("slow"))
        )
        writer.start()
        deadline = threading.Event()
        while fence.in_flight == 0 and not deadline.wait(0.01):
            pass
        assert fence.close(timeout=0.2) == 1  # the server holds it: still in flight
        slow_server.release.set()
        writer.join(90)
    assert fence.in_flight == 0
