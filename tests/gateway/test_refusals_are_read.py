"""A request refused before its body is read (413 by its declared length, 429 for its agent's byte budget)
lets its client finish sending and read the answer (issue 37, "Also"), over real TCP against a real gateway.

The answer ends the connection while the client is still sending a body the gateway did not read. Closing a
socket with unread input makes the kernel answer the rest with a reset, so a client that sends its whole
body before it reads, and gives up on a failed send (aiohttp, plain sockets), gets a broken pipe and never
sees the 413 or the 429's Retry-After: a flood saw 19,128 resets against 3,193 readable 429s. (httpx reads
an early answer after a failed send, so it does not show this.) The gateway now half-closes after the
answer and reads what is still coming, for a bounded time, before it closes.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from asyncrl.gateway.connections import LINGER_MAX_BYTES
from asyncrl.gateway_api.tokens import agent_token
from tests.gateway.conftest import RunningGateway, launch_gateway, start_rollouts

MAX_BODY = 3 * 1024 * 1024
RATE = 64 * 1024  # an agent's bytes per second: a second 2 MB body waits about 16 s for its budget
BODY = 2 * 1024 * 1024  # far more than a socket's buffers hold: most of it arrives after the answer
TRIES = 12


@pytest.fixture
def budgeted(upstream_url: str, tmp_path: Path) -> Iterator[RunningGateway]:
    running = launch_gateway(
        [upstream_url],
        tmp_path,
        f"--max-body-bytes={MAX_BODY}",
        f"--agent-bytes-per-second={RATE}",
        f"--agent-burst-bytes={MAX_BODY}",
    )
    yield running
    running.process.stop()


def _send_then_read(gateway: RunningGateway, rollout_id: str, length: int) -> str:
    """One call on a new connection as a strict client makes it: the headers and the whole body, then the
    answer. Its status line, or the error that ended it."""
    address = urlsplit(gateway.url)
    token = agent_token(gateway.key, rollout_id)
    with socket.create_connection((address.hostname, address.port), timeout=30) as connection:
        try:
            connection.sendall(
                (
                    f"POST {gateway.proxy_path(rollout_id)} HTTP/1.1\r\nhost: gateway\r\n"
                    f"authorization: Bearer {token}\r\ncontent-type: application/json\r\n"
                    f"content-length: {length}\r\n\r\n"
                ).encode()
            )
            connection.sendall(b" " * length)
            return _read_response(connection).split(b"\r\n", 1)[0].decode()
        except OSError as error:
            return f"{type(error).__name__}: {error}"


def _read_response(connection: socket.socket) -> bytes:
    """One HTTP response (headers and a Content-Length body), read as it arrives."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        data = connection.recv(65536)
        if not data:
            raise ConnectionAbortedError(f"the connection ended before the answer's headers: {answer!r}")
        answer += data
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        data = connection.recv(65536)
        if not data:
            raise ConnectionAbortedError(f"the connection ended inside the answer's body: {answer!r}")
        body += data
    return head + b"\r\n\r\n" + body


def test_a_body_refused_by_its_declared_length_gets_its_413_not_a_broken_pipe(
    budgeted: RunningGateway,
) -> None:
    start_rollouts(budgeted, "r1")
    seen = [_send_then_read(budgeted, "r1", 2 * BODY) for _ in range(TRIES)]
    assert all(status.startswith("HTTP/1.1 413 ") for status in seen), seen


def test_a_call_over_its_byte_budget_gets_its_429_not_a_broken_pipe(budgeted: RunningGateway) -> None:
    start_rollouts(budgeted, "r1")
    seen = [_send_then_read(budgeted, "r1", BODY) for _ in range(TRIES)]
    # The first is paid for (and refused as no JSON), the rest wait for the budget: 429 with Retry-After.
    assert seen[0].startswith("HTTP/1.1 400 "), seen
    assert all(status.startswith("HTTP/1.1 429 ") for status in seen[1:]), seen


def test_a_client_that_keeps_sending_a_refused_body_is_cut_off_after_the_linger(
    budgeted: RunningGateway,
) -> None:
    """The read-and-drop is bounded: a client streaming a 100 GB body it declared is answered 413 and then cut
    off (LINGER_MAX_BYTES or LINGER_SECONDS), and the close is counted with the reason `linger`."""
    start_rollouts(budgeted, "r1")
    address = urlsplit(budgeted.url)
    token = agent_token(budgeted.key, "r1")
    sent = 0
    with socket.create_connection((address.hostname, address.port), timeout=60) as connection:
        connection.sendall(
            (
                f"POST {budgeted.proxy_path('r1')} HTTP/1.1\r\nhost: gateway\r\n"
                f"authorization: Bearer {token}\r\ncontent-length: {100 * 1024**3}\r\n\r\n"
            ).encode()
        )
        chunk = b" " * 65536
        cut_off: OSError | None = None
        try:
            while sent < 100 * 1024**3:
                connection.sendall(chunk)
                sent += len(chunk)
        except OSError as error:  # broken pipe or reset once the gateway has had enough
            cut_off = error
        assert cut_off is not None
        assert _read_response(connection).startswith(b"HTTP/1.1 413 ")
    assert sent < 4 * LINGER_MAX_BYTES, sent
    metrics = httpx.get(f"{budgeted.url}/metrics", timeout=30).text
    assert re.search(r'asyncrl_gateway_connections_closed_total\{reason="linger"\} 1\.0', metrics), metrics
