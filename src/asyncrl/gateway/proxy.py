"""The model-call proxy: the gateway's hot path, as a lean ASGI handler beside the FastAPI routes.

Every agent model call passes through here, so per-request work is kept small: no framework routing or
pydantic validation, one JSON decode/encode to set the model name, the response relayed as bytes and captured
as bytes (parsed later, off the hot path), and aiohttp as the upstream client (an order of magnitude faster
than httpx's async pool at this concurrency; see the field notes). The wire contract is Agent Lightning's:
paths, 429 + Retry-After + X-Agl-Paused while paused, and the same error body, in `Reject` mode; in `Hold`
mode (the default) a call that arrives while paused waits in the gateway (`held_calls.py`) and is forwarded at
the resume. Until the first upstream is registered (started without --upstream, then PUT /api/upstreams),
model calls are held too (Hold) or get 503 + Retry-After (Reject). A pause with abort cancels the upstream
calls in flight: nothing of them is captured, and Hold re-issues them after the resume.
The limits every request meets (token before body, byte limit, JSON depth) are `admission.py`'s, shared with
the management routes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from asyncrl.gateway.access import Caller, route_access
from asyncrl.gateway.admission import (
    CLIENT_GONE,
    BodyLimit,
    ClientGone,
    Refused,
    admit_connection,
    authorize,
    enter_share,
    parse_json,
    read_charged_body,
)
from asyncrl.gateway.budgets import AgentBudgets
from asyncrl.gateway.capture import capture_call, request_overrides
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.held_calls import HeldCalls
from asyncrl.gateway.metrics import GatewayMetrics
from asyncrl.gateway.pause_policy import pause_policy
from asyncrl.gateway.pause_state import PauseState, header_seconds
from asyncrl.gateway.relay import Answered, StreamOutcome, open_stream, pump, warn_if_not_found
from asyncrl.gateway.sampling import SamplingRefused, apply_rollout_sampling
from asyncrl.gateway.store import CapturedCall, CaptureFull, RolloutStore, UnknownAttempt, check_attempt
from asyncrl.gateway.streaming import StreamAssembly, include_usage
from asyncrl.gateway_api.paths import parse_proxy_path

UPSTREAM_KEEP_ALIVE_SECONDS = 3.0  # below vLLM's 5 s keep-alive: see ProxyHandler.start
logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

ROUTE = "proxy"
_ENCODER = msgspec.json.Encoder()  # the forwarded body: one C encode, as admission parsed it (one C decode)


class Upstreams:
    """The inference servers, chosen by fewest calls in flight; the set can be replaced at run time.

    `urls` is swapped whole (one event loop, so no lock). A server removed while calls are in flight keeps its
    count until the last of them is released, so counts stay exact even when it is registered again.
    """

    def __init__(self, urls: tuple[str, ...]) -> None:
        self.urls: tuple[str, ...] = tuple(urls)
        self._inflight: dict[str, int] = dict.fromkeys(self.urls, 0)

    def acquire(self) -> str:
        url = min(self.urls, key=self._inflight.__getitem__)
        self._inflight[url] += 1
        return url

    def release(self, url: str) -> None:
        left = self._inflight[url] - 1
        if left == 0 and url not in self.urls:
            del self._inflight[url]  # removed from the set, and its last call is over
        else:
            self._inflight[url] = left

    def replace(self, urls: tuple[str, ...]) -> None:
        inflight = {url: count for url, count in self._inflight.items() if count}
        for url in urls:
            inflight.setdefault(url, 0)
        self._inflight = inflight
        self.urls = tuple(urls)

    def inflight(self, url: str) -> int:
        return self._inflight.get(url, 0)


class ProxyHandler:
    def __init__(
        self,
        *,
        config: GatewayConfig,
        pause: PauseState,
        store: RolloutStore,
        metrics: GatewayMetrics,
        budgets: AgentBudgets | None = None,
    ) -> None:
        self.config = config
        self.budgets = budgets if budgets is not None else AgentBudgets(config.agent_budget)
        self.body_limit = BodyLimit(config.max_body_bytes, "--max-body-bytes")
        self.key = config.key.get_secret_value()
        self.pause = pause
        self.store = store
        self.metrics = metrics
        self.upstreams = Upstreams(config.upstreams)
        self.model = config.run.model  # replaced by set_upstreams(); config is frozen
        self.session: aiohttp.ClientSession | None = None
        # Empty in Reject mode; kept so that a resume or a shutdown releases "every held call" in both modes.
        run = config.run
        self.held = HeldCalls(capacity=run.max_held_calls, timeout_seconds=run.hold_timeout_seconds)
        metrics.held.set_function(lambda: len(self.held))
        self.pause_policy = pause_policy(run.pause_mode, held=self.held, metrics=metrics)

    async def start(self) -> None:
        # aiohttp, not the httpx the rest of the project uses: every agent's model call passes here, and at
        # 64 concurrent calls httpx did 1/22 of aiohttp's rate at 14-24x the CPU per call
        # (benchmarks/proxy_clients.py; figures in docs/benchmarks.md, issue 26).
        # Idle upstream connections are dropped before vLLM's server closes them (its keep-alive timeout,
        # VLLM_HTTP_TIMEOUT_KEEP_ALIVE, is 5 s; aiohttp's own default, 15 s, would reuse connections vLLM is
        # closing, and an agent's call sent on one gets a reset it cannot safely retry).
        connector = aiohttp.TCPConnector(
            limit=0, ttl_dns_cache=300, keepalive_timeout=UPSTREAM_KEEP_ALIVE_SECONDS
        )
        timeout = aiohttp.ClientTimeout(total=self.config.upstream_timeout_seconds)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=True)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def set_upstreams(self, urls: tuple[str, ...], *, model: str | None = None) -> None:
        """Replace the upstream set (checked, non-empty) and, when given, the model name forwarded to it."""
        previous = self.upstreams.urls
        self.upstreams.replace(urls)
        if model is not None:
            self.model = model
        self.release_held()  # calls held until the first upstream was known
        logger.info(
            "upstreams registered: %s (model %s); were: %s",
            ", ".join(urls),
            self.model,
            ", ".join(previous) or "none",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.monotonic()
        status = 500
        try:
            status = await self._handle(scope, receive, send)
        except ClientGone:
            status = CLIENT_GONE
        except Refused as reject:
            status = reject.status
            if reject.rejection_reason is not None:
                self.metrics.rejections.labels(reject.rejection_reason).inc()
            await send_json(send, reject.status, reject.body, reject.headers)
        finally:
            self.metrics.requests.labels(ROUTE, str(status)).inc()
            self.metrics.proxy_latency.observe(time.monotonic() - started)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> int:
        parsed = parse_proxy_path(scope["path"])
        if parsed is None:
            raise Refused(
                404,
                "not found",
                detail="use /proxy/rollout/{rollout_id}/attempt/{attempt_id}/mode/{train|val}/openai/v1/"
                "{chat/completions|completions}",
            )
        rollout_id, attempt_id, mode, endpoint = parsed
        if scope["method"] != "POST":
            raise Refused(405, "method not allowed", headers={"allow": "POST"})
        headers = _headers(scope)
        access = route_access(scope["method"], scope["path"])  # the gateway key or this rollout's token
        caller = authorize(self.key, headers.get("authorization"), access)
        admit_connection(scope, caller)
        self._check_rollout(rollout_id, attempt_id)
        agent = rollout_id if caller is Caller.AGENT else None  # the gateway key's calls have no budget
        enter_share(self.budgets, agent)
        try:
            raw = await read_charged_body(
                receive,
                budgets=self.budgets,
                rollout_id=agent,
                limit=self.body_limit,
                declared_length=headers.get("content-length"),
                timeout_seconds=self.config.body_timeout_seconds,
            )
            body = parse_json(
                raw, max_depth=self.config.max_json_depth, count_parsed=self.metrics.parsed_body_bytes.inc
            )
            return await self._handle_call(body, receive, send, rollout_id, attempt_id, mode, endpoint)
        finally:
            if agent is not None:
                self.budgets.leave(agent)

    async def _handle_call(
        self,
        body: Any,
        receive: Receive,
        send: Send,
        rollout_id: str,
        attempt_id: str,
        mode: str,
        endpoint: str,
    ) -> int:
        """A model call past admission's checks: sampling rules, then forwarded (held while paused)."""
        if not isinstance(body, dict):
            raise Refused(400, "request body must be a JSON object")
        streamed = _streamed(body)
        try:
            sampling = apply_rollout_sampling(
                body,
                policy=self.config.run.sampling_params,
                rollout=self.config.run.rollout_sampling,
                train=mode == "train",
            )
        except SamplingRefused as error:
            raise Refused(400, "sampling settings refused", detail=str(error)) from error
        body = sampling.body
        if sampling.asked is not None:
            self.metrics.sampling_overridden.inc()

        forwarded = request_overrides(
            body,
            endpoint=endpoint,
            model=self.model,
            capture=self.config.capture_token_ids and mode == "train",
        )
        if streamed:
            forwarded["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
            call = _Call(
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                endpoint=endpoint,
                request_bytes=_ENCODER.encode(forwarded),
                agent_sampling=sampling.asked,
                agent_wants_usage=include_usage(body),
            )
            return await self._handle_stream(call, receive, send)
        request_bytes = _ENCODER.encode(forwarded)
        while True:
            if self.pause.paused or not self.upstreams.urls:
                await self.pause_policy.wait_until_open(receive, self._refusal)  # Reject raises at once
                # Released. The rollout may have ended meanwhile (cancelled as stale, timed out): do not
                # generate for it. Then check the pause again (a new one may have begun before this ran).
                self._check_rollout(rollout_id, attempt_id)
                continue
            # No await between this check and enter(): a call either sees the pause or is counted in flight.
            self.pause.enter()
            self.metrics.inflight.inc()
            try:
                model_version = self.pause.model_version
                call_started = time.time()
                answer = await self._forward_unless_aborted(endpoint, request_bytes)
                if answer is not None:
                    status, content_type, response = answer
                    self._record(
                        rollout_id,
                        *capture_call(
                            mode=self.config.run.capture,
                            attempt_id=attempt_id,
                            endpoint=endpoint,
                            status=status,
                            latency_seconds=time.time() - call_started,
                            model_version=model_version,
                            request_body=request_bytes,
                            response_body=response,
                            started_at=call_started,
                            agent_sampling=sampling.asked,
                        ),
                    )
            finally:
                self.metrics.inflight.dec()
                self.pause.leave()
            if answer is not None:
                break
            # Aborted by a pause: nothing was captured. The loop meets the pause policy: Hold re-issues it
            # after the resume, Reject answers like a call that arrived during the pause.
            self.metrics.aborted.inc()
        await _send_bytes(send, status, response, content_type)
        return status

    async def _handle_stream(self, call: _Call, receive: Receive, send: Send) -> int:
        """A `stream: true` call: held or refused while paused like any other, then relayed event by event.

        Abort reaches it only until the first event arrived (nothing sent yet: it is re-issued or 429'd);
        afterwards it stays in flight until its stream ends, so a pause drains it.
        """
        while True:
            if self.pause.paused or not self.upstreams.urls:
                await self.pause_policy.wait_until_open(receive, self._refusal)
                self._check_rollout(call.rollout_id, call.attempt_id)
                continue
            self.pause.enter()
            self.metrics.inflight.inc()
            try:
                status = await self._stream_once(call, receive, send)
            finally:
                self.metrics.inflight.dec()
                self.pause.leave()
            if status is not None:
                return status
            self.metrics.aborted.inc()  # aborted by a pause before its first byte: nothing was captured

    async def _stream_once(self, call: _Call, receive: Receive, send: Send) -> int | None:
        """One upstream attempt: the status relayed, or None when a pause aborted it before its first byte."""
        assert self.session is not None, "ProxyHandler.start() was not called"
        model_version = self.pause.model_version
        started_at, started = time.time(), time.monotonic()
        gone = asyncio.ensure_future(receive())  # the body is read: the next message is the disconnect
        tasks: list[asyncio.Future[Any]] = [gone]
        try:
            opening = asyncio.ensure_future(
                open_stream(
                    self.session,
                    acquire=self.upstreams.acquire,
                    release=self.upstreams.release,
                    endpoint=call.endpoint,
                    body=call.request_bytes,
                    attempts=self.config.upstream_connect_attempts,
                    timeout_seconds=self.config.upstream_timeout_seconds,
                )
            )
            tasks.append(opening)
            self.pause.forwards.add(opening)
            try:
                await asyncio.wait({opening, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                self.pause.forwards.discard(opening)
            if not opening.done():
                raise ClientGone()  # left before the first event; `finally` closes the upstream call
            if opening.cancelled():
                return None  # a pause with abort (a shutdown cancels this handler, raising above)
            opened = opening.result()
            if isinstance(opened, Answered):  # an error status, or no stream: relayed like a plain call
                self._capture(call, opened.status, opened.body, started_at, model_version)
                await _send_bytes(send, opened.status, opened.body, opened.content_type)
                return opened.status
            self.metrics.stream_first_chunk.observe(opened.opened_at - started)
            assembly = StreamAssembly(chat=call.endpoint == "chat/completions")

            def capture_completed() -> None:
                # Before the agent is sent [DONE]: an agent that reports its reward on reading it must not
                # end its rollout before this call is in the store (the trainer would train without it).
                response = json.dumps(assembly.response()).encode()
                self._capture(call, 200, response, started_at, model_version, aborted=False)

            relaying = asyncio.ensure_future(
                pump(
                    opened,
                    send=send,
                    assembly=assembly,
                    agent_wants_usage=call.agent_wants_usage,
                    before_done=capture_completed,
                )
            )
            tasks.append(relaying)
            try:
                await asyncio.wait({relaying, gone}, return_when=asyncio.FIRST_COMPLETED)
                if relaying.done():
                    outcome = relaying.result()
                else:
                    relaying.cancel()
                    # An agent that leaves on the error event of a broken stream did not abandon it, nor one
                    # that leaves on (or while being sent) the [DONE] of a complete one: that is captured.
                    if assembly.broken:
                        outcome = StreamOutcome.FAILED
                    elif assembly.done:
                        outcome = StreamOutcome.COMPLETED
                    else:
                        outcome = StreamOutcome.ABANDONED
            finally:
                opened.close()
                self.upstreams.release(opened.url)
            self.metrics.streamed_calls.labels(outcome.value).inc()
            if outcome is StreamOutcome.FAILED:
                return 200  # the status line was sent; the agent got an error event, nothing is captured
            if outcome is StreamOutcome.COMPLETED:
                return 200  # captured by `capture_completed`, before [DONE] was sent on
            response = json.dumps(assembly.response()).encode()
            self._capture(call, CLIENT_GONE, response, started_at, model_version, aborted=True)
            return CLIENT_GONE
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()

    def _capture(
        self,
        call: _Call,
        status: int,
        response: bytes,
        started_at: float,
        model_version: int | None,
        *,
        aborted: bool = False,
    ) -> None:
        self._record(
            call.rollout_id,
            *capture_call(
                mode=self.config.run.capture,
                attempt_id=call.attempt_id,
                endpoint=call.endpoint,
                status=status,
                latency_seconds=time.time() - started_at,
                model_version=model_version,
                request_body=call.request_bytes,
                response_body=response,
                started_at=started_at,
                agent_sampling=call.agent_sampling,
                aborted=aborted,
            ),
        )

    def _record(self, rollout_id: str, *choices: CapturedCall) -> None:
        for call in choices:
            limit = self.store.record_call(rollout_id, call)
            if limit is not None:  # kept without its tokens: it was in flight when the limit was reached
                self.metrics.capture_limit_hits.labels(limit, "not_captured").inc()
                logger.warning(
                    "a model call of rollout %s was not captured: %s limit reached", rollout_id, limit
                )

    def _check_rollout(self, rollout_id: str, attempt_id: str) -> None:
        """The rollout exists, has not ended, and `attempt_id` is its attempt; else the refusal."""
        rollout = self.store.find(rollout_id)
        if rollout is None:
            raise Refused(404, "unknown rollout", rollout_id=rollout_id)
        if rollout.state.is_terminal:
            raise Refused(
                409,
                "rollout already finished",
                rejection_reason="rollout_finished",
                rollout_id=rollout_id,
                state=rollout.state.value,
            )
        try:
            check_attempt(rollout, attempt_id)
        except UnknownAttempt as error:
            raise Refused(
                404, str(error), rejection_reason="unknown_attempt", rollout_id=rollout_id
            ) from error
        try:
            self.store.check_capture_room(rollout_id)
        except CaptureFull as full:
            self.metrics.capture_limit_hits.labels(full.limit, "refused").inc()
            seconds = self.config.run.retry_after_seconds
            retry = {"retry-after": header_seconds(seconds)} if full.limit == "store" else None
            raise Refused(
                full.status,
                str(full),
                rejection_reason=f"capture_{full.limit}_full",
                headers=retry,
                limit=full.limit,
                rollout_id=rollout_id,
            ) from full

    def release_held(self) -> int:
        """Forward the held calls, in arrival order, if the gateway is open (resumed, an upstream known)."""
        if self.pause.paused or not self.upstreams.urls:
            return 0
        return self.held.release_all()

    def _refusal(self) -> Refused:
        """What a call that cannot be forwarded now gets in Reject mode (and a held call past its bounds)."""
        if self.pause.paused:
            self.metrics.rejected_paused.inc()
            seconds = self.pause.retry_after_seconds
            return Refused(
                429,
                "gateway paused",
                headers={
                    "retry-after": header_seconds(seconds),
                    "x-agl-paused": "true",
                    "retry-after-ms": str(round(seconds * 1000)),
                },
                reason=self.pause.reason,
            )
        return _no_upstream(self.config.run.retry_after_seconds)

    async def _forward_unless_aborted(self, endpoint: str, body: bytes) -> tuple[int, str, bytes] | None:
        """`_forward`, registered so a pause with abort can cancel it; None when it was aborted."""
        forward = asyncio.ensure_future(self._forward(endpoint, body))
        self.pause.forwards.add(forward)
        try:
            return await forward
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this handler itself is being cancelled (shutdown): not an abort
            return None
        finally:
            self.pause.forwards.discard(forward)

    async def _forward(self, endpoint: str, body: bytes) -> tuple[int, str, bytes]:
        assert self.session is not None, "ProxyHandler.start() was not called"
        attempts = self.config.upstream_connect_attempts
        last_error = ""
        for attempt in range(attempts):
            if not self.upstreams.urls:  # cannot happen once registered (the set is never emptied); be safe
                raise _no_upstream(self.config.run.retry_after_seconds)
            url = self.upstreams.acquire()
            try:
                async with self.session.post(
                    f"{url}/v1/{endpoint}", data=body, headers={"content-type": "application/json"}
                ) as response:
                    payload = await response.read()
                    warn_if_not_found(url, endpoint, response.status)
                    return response.status, response.headers.get("content-type", "application/json"), payload
            except aiohttp.ClientConnectionError as error:
                if (
                    isinstance(error, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError)
                    and attempt == 0
                ):
                    last_error = str(error)  # a pooled connection the server closed: retry at once
                    continue
                last_error = str(error)
                if attempt + 1 < attempts:
                    await asyncio.sleep(min(2.0, 0.1 * 2**attempt))
            except TimeoutError as error:
                raise Refused(
                    504,
                    "upstream timeout",
                    detail=f"no answer within {self.config.upstream_timeout_seconds}s",
                ) from error
            finally:
                self.upstreams.release(url)
        logger.warning("upstream unavailable after %d attempts: %s", attempts, last_error)
        raise Refused(502, "upstream unavailable", detail=last_error, attempts=attempts)


@dataclass(frozen=True)
class _Call:
    """A streamed call, ready to forward."""

    rollout_id: str
    attempt_id: str
    endpoint: str
    request_bytes: bytes
    agent_sampling: dict[str, Any] | None
    agent_wants_usage: bool


def _streamed(body: dict[str, Any]) -> bool:
    """Whether the call asks for a stream; a malformed `stream` or `stream_options` is refused (400)."""
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise Refused(400, "stream must be true or false", field="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise Refused(
            400, 'stream_options must be an object, e.g. {"include_usage": true}', field="stream_options"
        )
    if options is not None and not stream:
        raise Refused(400, "stream_options is only allowed with stream: true", field="stream_options")
    return bool(stream)


def _no_upstream(retry_after_seconds: float) -> Refused:
    return Refused(
        503,
        "no upstream registered",
        headers={
            "retry-after": header_seconds(retry_after_seconds),
            "retry-after-ms": str(round(retry_after_seconds * 1000)),
        },
        detail="no inference server is registered yet; the trainer registers them with PUT /api/upstreams "
        "once they are up (or start the gateway with --upstream)",
    )


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}


async def _send_bytes(
    send: Send, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
) -> None:
    raw_headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    raw_headers += [(name.encode(), value.encode()) for name, value in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, payload: dict[str, Any], headers: dict[str, str]) -> None:
    await _send_bytes(send, status, json.dumps(payload).encode(), "application/json", headers)
