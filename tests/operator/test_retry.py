"""Retries of the operator's Kubernetes calls against a real HTTP server: 503 then 201 is one Job created;
a 4xx is final and reads as one line; an API server that is not there is retried until the deadline."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pydantic
import pytest

from asyncrl.operator.kube import Kube
from asyncrl.operator.retry import (
    Backoff,
    GaveUp,
    kube_error_is_transient,
    one_line_reason,
    retry_transient,
)
from asyncrl.testing.controlplane import free_port

FAST = Backoff(first_seconds=0.05, max_seconds=0.2)
JOB = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "j1", "namespace": "ns"},
    "spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "python"}]}}},
}


class _ApiServer(ThreadingHTTPServer):
    """Answers job creations from a script of (status, Status message) pairs, then 201."""

    def __init__(self, port: int, script: list[tuple[int, str]]) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.script = list(script)
        self.posts: list[dict[str, Any]] = []


class _Handler(BaseHTTPRequestHandler):
    server: _ApiServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.posts.append(body)
        if self.server.script:
            status, message = self.server.script.pop(0)
            reply: dict[str, Any] = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "message": message,
                "reason": {503: "ServiceUnavailable", 422: "Invalid", 429: "TooManyRequests"}.get(status, ""),
                "code": status,
            }
        else:
            status, reply = 201, body
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("x-secret-looking-header", "should-never-reach-a-reason")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def _serve(script: list[tuple[int, str]]) -> Iterator[tuple[_ApiServer, Kube]]:
    from kubernetes import client

    server = _ApiServer(free_port(), script)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    with client.ApiClient(configuration) as api:
        yield server, Kube(api)
    server.shutdown()
    server.server_close()


@pytest.fixture
def flaky() -> Iterator[tuple[_ApiServer, Kube]]:
    yield from _serve([(503, "etcd leader changed"), (429, "too many requests, try again")])


@pytest.fixture
def refusing() -> Iterator[tuple[_ApiServer, Kube]]:
    yield from _serve([(422, 'Job.batch "j1" is invalid: spec.template.spec.containers: Required value')])


def _create(kube: Kube, **options: Any) -> bool:
    return asyncio.run(
        retry_transient(
            lambda: kube.create_job(JOB), is_transient=kube_error_is_transient, what="test", **options
        )
    )


def test_transient_answers_are_retried_until_the_job_is_created(flaky: tuple[_ApiServer, Kube]) -> None:
    server, kube = flaky
    assert _create(kube, backoff=FAST) is True
    assert len(server.posts) == 3  # 503, 429, then 201: the same body each time
    assert all(post == server.posts[0] for post in server.posts)


def test_a_rejection_is_final_and_reads_as_one_line_without_headers(
    refusing: tuple[_ApiServer, Kube],
) -> None:
    server, kube = refusing
    from kubernetes.client.exceptions import ApiException

    with pytest.raises(ApiException) as caught:
        _create(kube, backoff=FAST)
    assert len(server.posts) == 1  # never retried
    reason = one_line_reason(caught.value)
    assert reason == (
        'Invalid (422): Job.batch "j1" is invalid: spec.template.spec.containers: Required value'
    )
    assert "\n" not in reason
    assert "x-secret-looking-header" not in reason


def test_an_absent_api_server_is_retried_until_the_deadline_then_gives_up() -> None:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"  # nobody listens
    configuration.retries = 0
    with client.ApiClient(configuration) as api, pytest.raises(GaveUp) as caught:
        _create(Kube(api), backoff=FAST, deadline_seconds=0.5)
    assert caught.value.attempts >= 3
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith("still failing after")


def test_backoff_grows_to_its_cap_and_is_what_stamina_waits() -> None:
    backoff = Backoff(first_seconds=1, max_seconds=8, factor=2, jitter_seconds=0.25)
    assert [backoff.nominal_seconds(attempt) for attempt in range(1, 7)] == [1, 2, 4, 8, 8, 8]
    assert backoff.nominal_seconds(10_000) == 8  # no overflow however long an outage lasts
    assert backoff.stamina_waits() == {
        "wait_initial": 1,
        "wait_max": 8,
        "wait_exp_base": 2,
        "wait_jitter": 0.25,
    }


def test_each_retry_is_one_log_line_with_its_reason_and_one_on_retry_call(
    flaky: tuple[_ApiServer, Kube], caplog: pytest.LogCaptureFixture
) -> None:
    server, kube = flaky
    seen: list[BaseException] = []
    with caplog.at_level(logging.INFO, logger="asyncrl.operator.retry"):
        assert _create(kube, backoff=FAST, on_retry=seen.append) is True
    lines = [record.getMessage() for record in caplog.records if record.name == "asyncrl.operator.retry"]
    assert len(lines) == len(seen) == 2  # 503 and 429 retried; the 201 ends it
    assert lines[0].startswith("test failed (attempt 1), retrying in about 0.1 s: ServiceUnavailable (503)")
    assert "TooManyRequests (429)" in lines[1]
    assert all("\n" not in line for line in lines)
    assert len(server.posts) == 3


def test_a_body_the_client_refuses_before_sending_is_a_rejection_named_by_its_field() -> None:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{free_port()}"
    broken = {
        **JOB,
        "spec": {
            "template": {
                "spec": {"containers": [{"name": "agent", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
            }
        },
    }
    with client.ApiClient(configuration) as api, pytest.raises(pydantic.ValidationError) as caught:
        asyncio.run(
            retry_transient(
                lambda: Kube(api).create_job(broken), is_transient=kube_error_is_transient, what="test"
            )
        )
    assert not kube_error_is_transient(caught.value)
    reason = one_line_reason(caught.value)
    assert "nvidia.com/gpu" in reason
    assert "\n" not in reason
