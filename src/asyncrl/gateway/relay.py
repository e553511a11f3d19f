"""The I/O of a streamed model call: open the upstream's event stream, then relay it event by event.

Split in two because a pause treats the halves differently. Until the first event has arrived nothing has
been sent to the agent, so a pause with abort may cancel `open_stream` and the call is re-issued (or 429'd)
like any other. From the first byte on, the agent holds part of an answer that cannot be taken back: `pump`
is never aborted, a pause waits for it (the drain). Each event is relayed as soon as it is complete, never
the whole answer at once, and folded into a `StreamAssembly` for the capture.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from asyncrl.gateway.admission import Refused
from asyncrl.gateway.streaming import (
    DONE,
    SSE_CONTENT_TYPE,
    SseEvents,
    StreamAssembly,
    StreamBroken,
    error_event,
    is_usage_chunk,
    sse_event,
)

logger = logging.getLogger(__name__)

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
MAX_EVENT_BYTES = 16 * 1024 * 1024  # one chunk of an upstream's stream; vLLM's are a few hundred bytes


class StreamOutcome(enum.StrEnum):
    """How a relayed stream ended (the label of the streamed-calls metric)."""

    COMPLETED = "completed"  # [DONE] reached: captured like a non-streamed call
    ABANDONED = "abandoned"  # the agent went away: cancelled upstream, captured as aborted
    FAILED = "failed"  # the upstream's stream broke: the agent got an error event, nothing captured


@dataclass
class Answered:
    """The upstream answered without a stream (an error status, or a JSON body): relayed as it is."""

    status: int
    content_type: str
    body: bytes


@dataclass
class OpenStream:
    """An upstream event stream whose first event has arrived; the connection is still open."""

    url: str
    response: aiohttp.ClientResponse
    events: SseEvents
    first: list[bytes]
    opened_at: float

    def close(self) -> None:
        """Drop the connection: the upstream (vLLM) sees the disconnect and aborts the generation."""
        self.response.close()


async def open_stream(
    session: aiohttp.ClientSession,
    *,
    acquire: Callable[[], str],
    release: Callable[[str], None],
    endpoint: str,
    body: bytes,
    attempts: int,
    timeout_seconds: float,
) -> OpenStream | Answered:
    """POST the streamed request and wait for its first event (connection errors retried as `_forward`).

    On success the upstream stays acquired until the caller calls `release(url)`; on any exception or
    cancellation the connection is closed and the upstream released here.
    """
    last_error = ""
    for attempt in range(attempts):
        url = acquire()
        response: aiohttp.ClientResponse | None = None
        try:
            response = await session.post(
                f"{url}/v1/{endpoint}", data=body, headers={"content-type": "application/json"}
            )
            content_type = response.headers.get("content-type", "application/json")
            if response.status != 200 or not content_type.startswith(SSE_CONTENT_TYPE):
                payload = await response.read()
                response.release()
                release(url)
                warn_if_not_found(url, endpoint, response.status)
                return Answered(response.status, content_type, payload)
            events = SseEvents(max_event_bytes=MAX_EVENT_BYTES)
            first: list[bytes] = []
            while not first:
                data = await response.content.readany()
                if not data:
                    break  # closed before any event: `pump` reports the cut
                first = events.feed(data)
            return OpenStream(url, response, events, first, opened_at=time.monotonic())
        except aiohttp.ClientConnectionError as error:
            _drop(response, url, release)
            last_error = str(error)
            if attempt == 0 and isinstance(error, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError):
                continue  # a pooled connection the server closed: retry at once
            if attempt + 1 < attempts:
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
        except TimeoutError as error:
            _drop(response, url, release)
            raise Refused(504, "upstream timeout", detail=f"no answer within {timeout_seconds}s") from error
        except StreamBroken as error:
            _drop(response, url, release)
            raise Refused(502, "upstream stream broken", detail=str(error)) from error
        except BaseException:
            _drop(response, url, release)
            raise
    logger.warning("upstream unavailable after %d attempts: %s", attempts, last_error)
    raise Refused(502, "upstream unavailable", detail=last_error, attempts=attempts)


_warned_not_found: set[tuple[str, str]] = set()


def warn_if_not_found(url: str, endpoint: str, status: int) -> None:
    """Log, once per upstream and endpoint, a 404 that means a wrong upstream URL, not a wrong agent call.

    vLLM answers a path it does not serve with a bare `{"detail":"Not Found"}`, which the agent gets as it
    is; the operator of the gateway gets the hint here.
    """
    if status != 404 or (url, endpoint) in _warned_not_found:
        return
    _warned_not_found.add((url, endpoint))
    logger.warning(
        "upstream %s answered 404 to POST %s/v1/%s: it does not serve that path; register the server's "
        "root or its OpenAI base URL (http://host:port or http://host:port/v1), and check it serves /v1/%s",
        url,
        url,
        endpoint,
        endpoint,
    )


def _drop(response: aiohttp.ClientResponse | None, url: str, release: Callable[[str], None]) -> None:
    if response is not None:
        response.close()
    release(url)


async def pump(
    stream: OpenStream,
    *,
    send: Send,
    assembly: StreamAssembly,
    agent_wants_usage: bool,
    before_done: Callable[[], None] | None = None,
) -> StreamOutcome:
    """Relay the stream to the agent until [DONE] (COMPLETED) or a break (FAILED: an error event is sent).

    The usage chunk is relayed only when the agent asked for it (the gateway always asks, for the capture).
    `before_done` is called once, synchronously, when the upstream's [DONE] arrives and before it is sent on:
    the call is captured there, so an agent that ends its rollout as soon as it reads [DONE] cannot have the
    rollout end without its last call. Not called for a broken stream (its [DONE] follows an error event).
    Cancelling it (the agent went away) propagates; the caller closes the connection.
    """
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),
            ],
        }
    )

    async def relay(payloads: list[bytes]) -> None:
        for payload in payloads:
            was_done = assembly.done
            chunk = assembly.add(payload)
            if chunk is not None and not agent_wants_usage and is_usage_chunk(chunk):
                continue
            if assembly.done and not was_done and before_done is not None:
                before_done()
            await send({"type": "http.response.body", "body": sse_event(payload), "more_body": True})

    outcome = StreamOutcome.COMPLETED
    try:
        await relay(stream.first)
        while not assembly.done:
            data = await stream.response.content.readany()
            if not data:
                raise StreamBroken("the upstream's stream ended before [DONE]")
            await relay(stream.events.feed(data))
    except (StreamBroken, aiohttp.ClientError, TimeoutError) as error:
        outcome = StreamOutcome.FAILED
        assembly.broken = True  # before the error event: an agent that leaves on it did not abandon a stream
        reason = str(error)
        if isinstance(error, TimeoutError):
            reason = "the upstream's stream ended before [DONE]: the upstream timeout was reached"
        elif not isinstance(error, StreamBroken):
            reason = f"the upstream's stream ended before [DONE]: {error}"
        logger.warning("a streamed model call broke after %d chunks: %s", assembly.chunks, reason)
        await send({"type": "http.response.body", "body": error_event(reason), "more_body": True})
        await send({"type": "http.response.body", "body": sse_event(DONE.encode()), "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return outcome
