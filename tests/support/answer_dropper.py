"""A real TCP proxy on 127.0.0.1 that loses chosen HTTP answers: the server sends them, the client never
reads them (its connection is reset as the answer arrives).

What a reset connection or a client timeout does to a request the server already carried out, made to happen
on purpose. Requests and answers pass byte for byte; the proxy only parses the answers to the requests it
watches (HTTP/1.1 with a Content-Length, as the gateway answers), and runs its own event loop in a thread, so
sync and asyncio tests use it alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

METHODS = (b"GET ", b"POST ", b"PUT ", b"DELETE ", b"HEAD ", b"PATCH ")


@dataclass
class AnswerDropper:
    """Drops the first `drops` answers to requests starting with `request_prefix` (`b"POST /path"`) whose
    bytes contain `marker`; `dropped` holds those answers, `passed` the watched answers that went through.
    A dropped answer resets the client's connection, or with `swallow` is never sent: the client times out.
    With `lose_requests` the requests themselves are lost instead, in order: after `skip` matching requests
    (prefix, and `marker` in their first bytes) went through, the next `drops` reset the client's connection
    before the server sees them, as a reset on the way there does; `dropped` holds them."""

    upstream_port: int
    request_prefix: bytes
    marker: bytes
    drops: int = 1
    swallow: bool = False
    lose_requests: bool = False
    skip: int = 0
    port: int = 0
    _seen: int = 0
    dropped: list[bytes] = field(default_factory=list)
    passed: list[bytes] = field(default_factory=list)
    _connections: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def serve(self, started: threading.Event, stop: asyncio.Event) -> None:
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        async with server:
            await stop.wait()
            for task in self._connections:
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)

    async def _connection(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        this = asyncio.current_task()
        assert this is not None
        self._connections.add(this)
        try:
            await self._relay(client_reader, client_writer)
        finally:
            self._connections.discard(this)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        watched: asyncio.Queue[bool] = asyncio.Queue()  # one per request: is its answer watched?

        async def requests() -> None:
            while chunk := await client_reader.read(65536):
                if chunk.startswith(METHODS):  # a request's first bytes (clients write the head at once)
                    ours = chunk.startswith(self.request_prefix)
                    if ours and self.lose_requests and self.marker in chunk:
                        self._seen += 1
                        if self._seen > self.skip and len(self.dropped) < self.drops:
                            self.dropped.append(chunk)
                            client_writer.transport.abort()  # the server never sees it
                            return
                    watched.put_nowait(ours and not self.lose_requests)
                upstream_writer.write(chunk)
                await upstream_writer.drain()
            upstream_writer.close()

        async def answers() -> None:
            while True:
                head = await upstream_reader.readuntil(b"\r\n\r\n")
                body = await upstream_reader.readexactly(_content_length(head))
                answer = head + body
                if await watched.get():
                    if len(self.dropped) < self.drops and self.marker in answer:
                        self.dropped.append(answer)
                        if self.swallow:  # until the client gives up and closes its connection
                            await asyncio.get_running_loop().create_future()
                        client_writer.transport.abort()  # the client sees a reset, not the answer
                        return
                    self.passed.append(answer)
                client_writer.write(answer)
                await client_writer.drain()

        tasks = [asyncio.ensure_future(requests()), asyncio.ensure_future(answers())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for writer in (client_writer, upstream_writer):
                with contextlib.suppress(Exception):
                    writer.transport.abort()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    raise ValueError(f"the proxy only passes answers with a Content-Length: {head[:200]!r}")


@contextmanager
def dropping_answers(
    upstream_url: str,
    *,
    request_prefix: bytes,
    marker: bytes,
    drops: int = 1,
    swallow: bool = False,
    lose_requests: bool = False,
    skip: int = 0,
) -> Iterator[AnswerDropper]:
    """An `AnswerDropper` in front of `upstream_url` (http://127.0.0.1:PORT), serving until the block ends."""
    port = int(upstream_url.rstrip("/").rsplit(":", 1)[1])
    proxy = AnswerDropper(
        port,
        request_prefix=request_prefix,
        marker=marker,
        drops=drops,
        swallow=swallow,
        lose_requests=lose_requests,
        skip=skip,
    )
    loop = asyncio.new_event_loop()
    started, stop = threading.Event(), asyncio.Event()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(proxy.serve(started, stop)), name="answer-dropper", daemon=True
    )
    thread.start()
    if not started.wait(timeout=30):
        raise RuntimeError("the answer-dropping proxy did not start")
    try:
        yield proxy
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
