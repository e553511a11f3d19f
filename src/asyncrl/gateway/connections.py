"""Connections that cannot outstay their welcome, and a cap that always leaves room for the trainer.

uvicorn closes an idle connection only after a response (its keep-alive timeout): a connection that never
completes its headers, sends nothing at all, or keeps trickling the body of a refused request was held
forever (800 of 800 still open after 60 s), and at the file-descriptor limit the trainer's and operator's
new connections were the ones that failed. So each connection here is in one of three phases, with its own
deadline:

- headers: from the connection's opening (or a request's first byte) until its headers are complete, at
  most `header_timeout_seconds` and `max_header_bytes`;
- request: from the headers until the response is complete: no deadline here (a held call may wait many
  minutes); the body has its own timeout at admission (`admission.read_body`, 408);
- idle: between a response and the next request's first byte, `idle_timeout_seconds` (75 s, longer than any
  client's pool keeps a connection: see `tests/gateway/test_keep_alive.py`) for a connection that has shown
  a credential, `unproven_idle_timeout_seconds` for one that has not.

A refused credential (401, 403) ends its connection with the answer (`admission.authorize`), and so do a 413
by declared length and a budget 429, before their bodies are read. Closing a socket with unread input makes
the kernel answer the client's next bytes with a reset, and a client that sends its whole body before it
reads then gets a broken pipe instead of the answer. So a connection closed after an answer while its
request's body is still arriving lingers (`LINGER_SECONDS`, `LINGER_MAX_BYTES`): its write side is shut
(the client sees the end of the answer), and what still arrives is read and dropped until the client closes
or a bound is reached (nginx's lingering close).

The cap: at most `max_connections` are open. A new connection beyond it makes room by closing an open one
that is not in a request and has not shown the gateway key: the one with the least proven caller first,
then the one idle longest. Connections of the gateway key (the trainer, the operator) are never closed for
room, and neither is any connection in the middle of a request, so an unauthenticated client can hold no
slot the trainer needs: it cannot be in a request (admission answers it before its body), and waiting for
headers or idling is what gets closed first. When every open connection is in a request or holds the key
(agents' calls held through a pause can fill the cap), the new connection is kept in a small reserve
(`KEY_RESERVE_CONNECTIONS` above the cap) until its credential is known: the gateway key's request is
served (the trainer's resume always gets through), anyone else's is answered 429 with Retry-After and the
connection closed (`admission.admit_connection`), never a bare reset. Only past the reserve is a new
connection closed at once. The cap is kept below the process's file-descriptor limit (half of it: each
proxied call also holds an upstream connection), so the accept loop never meets EMFILE.

The caller is learned per request (`access.Caller`); admission records it on the connection through the scope.
Implemented as a subclass of uvicorn's httptools protocol (the server's `http` setting), the one uvicorn
uses when httptools is installed, as `uvicorn[standard]` guarantees.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from asyncrl.gateway.access import Caller

logger = logging.getLogger(__name__)

CONNECTION_SCOPE_KEY = "asyncrl.connection"
# File descriptors kept outside the cap's share: the listening socket, logs, the key file, DNS, Python.
RESERVED_FILE_DESCRIPTORS = 64
# Connections allowed above the cap, each only until its request shows a credential: the gateway key's is
# served, another's gets 429. One descriptor each (no upstream), inside RESERVED_FILE_DESCRIPTORS.
KEY_RESERVE_CONNECTIONS = 16
# How long, and how many bytes, a connection closed with its request's body still arriving reads and drops
# before it closes anyway.
LINGER_SECONDS = 5.0
LINGER_MAX_BYTES = 64 * 1024 * 1024


class ConnectionLimits(BaseModel):
    """Connection timeouts and the cap (flags `--header-timeout-seconds` ... `--max-connections`)."""

    model_config = ConfigDict(frozen=True)

    header_timeout_seconds: float = Field(
        default=10.0, gt=0, allow_inf_nan=False, description="A request's headers must be complete by then."
    )
    max_header_bytes: int = Field(
        default=64 * 1024, ge=1024, description="A request's headers may be this large; more gets 431."
    )
    idle_timeout_seconds: float = Field(
        default=75.0,
        gt=0,
        allow_inf_nan=False,
        description="An idle connection that has shown a credential is closed after this (longer than "
        "every client's pool keeps one: httpx 5 s, aiohttp 15 s).",
    )
    unproven_idle_timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        allow_inf_nan=False,
        description="An idle connection that has not shown a credential (health checks, scrapers, anyone) "
        "is closed after this; still longer than clients' pools, so a probe never races the close.",
    )
    max_connections: int = Field(
        default=4096,
        ge=16,
        description="Connections open at once; a new one beyond it closes the least proven idle one. "
        "Lowered to half the file-descriptor limit when that is smaller.",
    )


class CloseReason(Enum):
    HEADER_TIMEOUT = "header_timeout"
    HEADER_TOO_LARGE = "header_too_large"
    IDLE = "idle"
    ROOM = "room"  # closed to make room for a new connection at the cap
    FULL = "full"  # the new connection itself: every open one is in a request or holds the key
    LINGER = "linger"  # a refused request's body kept coming past LINGER_SECONDS or LINGER_MAX_BYTES


def connection_cap(requested: int, file_descriptor_limit: int) -> int:
    """The cap that fits the file-descriptor limit: each proxied call holds two descriptors (agent and
    upstream), and a few are the process's own."""
    return max(1, min(requested, (file_descriptor_limit - RESERVED_FILE_DESCRIPTORS) // 2))


def record_caller(scope: MutableMapping[str, Any], caller: Caller) -> bool:
    """Tell the request's connection who its caller proved to be (admission calls this after `authorize`).
    False: the connection is in the reserve above the cap and the caller is not the gateway key, so the
    request must be refused for capacity."""
    connection: GuardedProtocol | None = scope.get(CONNECTION_SCOPE_KEY)
    if connection is None:
        return True
    connection.proved(caller)
    return connection.admitted()


def header_part(data: bytes, tail: bytes) -> int:
    """How many bytes of `data` belong to a request's headers, given the last bytes already received of
    them (`tail`): up to the end of the headers (a blank line, CRLF or a bare LF) when it is in `data`,
    else all of it. Counted before the parser sees the bytes, so one write of headers and body together is
    limited too."""
    joined = tail + data
    ends = [i + len(mark) for mark in (b"\r\n\r\n", b"\n\n") if (i := joined.find(mark)) >= 0]
    if not ends:
        return len(data)
    return max(0, min(ends) - len(tail))


@dataclass(frozen=True)
class ConnectionGuard:
    """What every connection of one server shares: the limits, the cap, and the closes' counter."""

    limits: ConnectionLimits
    max_connections: int
    on_close: Callable[[CloseReason], None]


class _Phase(Enum):
    HEADERS = "headers"
    REQUEST = "request"
    IDLE = "idle"


class _LingeringTransport:
    """The transport as uvicorn sees it: the same, except that `close()` asks the protocol, which lingers
    when the request's body is still arriving (see the module's docstring)."""

    def __init__(self, raw: asyncio.Transport, protocol: GuardedProtocol) -> None:
        self._raw = raw
        self._protocol = protocol

    def close(self) -> None:
        self._protocol._close_after_answer()

    def is_closing(self) -> bool:
        return self._raw.is_closing() or self._protocol._lingering

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the phases, deadlines and cap above; see `guarded_protocol`."""

    guard: ClassVar[ConnectionGuard]

    caller = Caller.ANYONE
    in_reserve = False  # opened above the cap: only the gateway key's request is served on it
    _phase = _Phase.HEADERS
    _header_bytes = 0
    _header_tail = b""  # the last bytes of the headers so far: an end of headers may span two reads
    _deadline: asyncio.TimerHandle | None = None
    _last_active = 0.0
    _lingering = False
    _lingered_bytes = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw = transport
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        self._start_headers()
        cap = self.guard.max_connections
        if len(self.connections) > cap and self._open_connections() > cap:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # the rest of a refused request: dropped unread
            self._lingered_bytes += len(data)
            if self._lingered_bytes > LINGER_MAX_BYTES:
                self._close(CloseReason.LINGER)
            return
        self._last_active = self.loop.time()
        if self._phase is _Phase.IDLE:  # a new request's first bytes: its headers start here
            self._start_headers()
        if self._phase is _Phase.HEADERS:  # headers not yet complete: count them before they are parsed
            self._header_bytes += header_part(data, self._header_tail)
            self._header_tail = (self._header_tail + data)[-3:]  # reads of one byte keep the last three
            if self._header_bytes > self.guard.limits.max_header_bytes:
                self._refuse_headers()
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[CONNECTION_SCOPE_KEY] = self  # type: ignore[literal-required]
        if self._phase is _Phase.IDLE:
            self._start_headers()

    def on_headers_complete(self) -> None:
        self._phase = _Phase.REQUEST
        self._cancel_deadline()
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # uvicorn armed its keep-alive: nothing pipelined
            self._unset_keepalive_if_required()  # this class's own idle deadline replaces it
            self._phase = _Phase.IDLE
            idle = (
                self.guard.limits.idle_timeout_seconds
                if self.caller > Caller.ANYONE
                else self.guard.limits.unproven_idle_timeout_seconds
            )
            self._arm(idle, CloseReason.IDLE)

    def proved(self, caller: Caller) -> None:
        self.caller = max(self.caller, caller)

    def admitted(self) -> bool:
        """Whether this connection's request may be served: always within the cap; in the reserve, only
        for the gateway key, or once the open connections are back within the cap."""
        if self.in_reserve and (
            self.caller is Caller.KEY or self._open_connections() <= self.guard.max_connections
        ):
            self.in_reserve = False
        return not self.in_reserve

    # -- deadlines ------------------------------------------------------------------------------------------

    def _start_headers(self) -> None:
        self._phase = _Phase.HEADERS
        self._header_bytes = 0
        self._header_tail = b""
        self._last_active = self.loop.time()
        self._arm(self.guard.limits.header_timeout_seconds, CloseReason.HEADER_TIMEOUT)

    def _arm(self, seconds: float, reason: CloseReason) -> None:
        self._cancel_deadline()
        self._deadline = self.loop.call_later(seconds, self._close, reason)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _close(self, reason: CloseReason) -> None:
        self._deadline = None
        if not self._raw.is_closing():
            self.guard.on_close(reason)
            self._raw.close()

    def _refuse_headers(self) -> None:
        self._cancel_deadline()
        self.guard.on_close(CloseReason.HEADER_TOO_LARGE)
        message = b"request headers too large"
        self._raw.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(message), message)
        )
        self._linger()

    # -- closing after an answer ------------------------------------------------------------------------

    def _close_after_answer(self) -> None:
        """uvicorn closes the connection (an answer with `connection: close`, a shutdown, a lost client):
        at once when the request was read to its end, else lingering."""
        if self._lingering or self._raw.is_closing():
            return
        if self.cycle is not None and self.cycle.more_body and not self.cycle.disconnected:
            self._linger()
        else:
            self._raw.close()

    def _linger(self) -> None:
        """End the answer (FIN), then read and drop what the client still sends until it closes (then
        `eof_received`) or LINGER_SECONDS or LINGER_MAX_BYTES pass."""
        self._lingering = True
        if not self._raw.can_write_eof():
            self._raw.close()
            return
        self._raw.write_eof()
        self._raw.resume_reading()
        self._arm(LINGER_SECONDS, CloseReason.LINGER)

    def eof_received(self) -> None:
        if self._lingering:
            self._cancel_deadline()
            self._raw.close()

    # -- the cap --------------------------------------------------------------------------------------------

    def _open_connections(self) -> int:
        """Connections not already closing (a closed one leaves the server's set a moment later)."""
        return sum(1 for other in self.connections if not other.transport.is_closing())

    def _make_room(self) -> None:
        """Close the least proven, longest idle connection not in a request nor the key's; else keep this
        one in the reserve, or close it when the reserve is full too."""
        victim: GuardedProtocol | None = None
        for other in self.connections:
            if other is self or not isinstance(other, GuardedProtocol) or other.transport.is_closing():
                continue
            if other._phase is _Phase.REQUEST or other.caller is Caller.KEY:
                continue
            if victim is None or (other.caller, other._last_active) < (victim.caller, victim._last_active):
                victim = other
        if victim is not None:
            victim._close(CloseReason.ROOM)
        elif self._open_connections() <= self.guard.max_connections + KEY_RESERVE_CONNECTIONS:
            self.in_reserve = True
        else:
            self._close(CloseReason.FULL)


def guarded_protocol(
    limits: ConnectionLimits, *, max_connections: int, on_close: Callable[[CloseReason], None]
) -> type[GuardedProtocol]:
    """The protocol class to give uvicorn (`http=`), with these limits."""
    guard = ConnectionGuard(limits=limits, max_connections=max_connections, on_close=on_close)
    return type("GatewayProtocol", (GuardedProtocol,), {"guard": guard})
