"""Streamed model calls: split an upstream's server-sent events, and assemble them into one response.

An agent that sets `stream: true` gets the upstream's chunks as they come; training needs the same call as a
non-streamed one (token ids, log-probs, text, finish reason). `SseEvents` cuts the byte stream into events
(`data:` payloads), and `StreamAssembly` folds vLLM's chunks into the body vLLM would have answered without
streaming, so `capture.parse_call` reads a streamed call exactly like any other. The chunk shapes are vLLM's
(`chat.completion.chunk` with `delta`s; `text_completion` chunks with `text` pieces): `prompt_token_ids` in
the first chunk (top level for chat, in the choice for completions), `token_ids` and `logprobs` per chunk
holding that chunk's tokens only, `finish_reason`/`stop_reason` on a choice's last chunk, an optional usage
chunk with no choices (`stream_options.include_usage`), then `data: [DONE]`. A chunk with an `error` key is
the upstream's own error report.

Everything here is pure (no I/O), so malformed and hostile streams are tested without a server.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"
SSE_CONTENT_TYPE = "text/event-stream"


class StreamBroken(ValueError):
    """The upstream's stream cannot be relayed or assembled (malformed chunk, or an error it reported)."""


def sse_event(payload: bytes) -> bytes:
    """One server-sent event carrying `payload` as its data."""
    return b"data: " + payload + b"\n\n"


def error_event(message: str, *, status: int = 502) -> bytes:
    """The event that ends a broken stream: an OpenAI-style error body (the OpenAI SDK raises APIError)."""
    body = {"error": {"message": message, "type": "UpstreamStreamError", "param": None, "code": status}}
    return sse_event(json.dumps(body).encode())


class SseEvents:
    """Cuts a byte stream into the data payloads of its events (`data:` lines; comments and other fields
    are ignored; several data lines of one event are joined with newlines, as the SSE spec says).

    Not httpx-sse (which the toy agent uses to read its streams): httpx-sse reads events from an
    `httpx.Response`, while the gateway's upstream client is aiohttp (relay.py reads raw chunks with
    `readany`); the relay hands each event's data on as bytes, to the assembly and re-framed to the agent,
    where httpx-sse decodes to text that would be encoded again; this bounds each event's size against a
    broken or hostile upstream (then a 502 or an error event), where httpx-sse buffers without a limit; and
    its line decoder, the only part that could take aiohttp's chunks, is private (`httpx_sse._decoders`)."""

    def __init__(self, *, max_event_bytes: int) -> None:
        self.max_event_bytes = max_event_bytes
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of the events completed by `data`, in order. StreamBroken past the size bound."""
        buffer = self._pending + data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        *complete, self._pending = buffer.split(b"\n\n")
        if len(self._pending) > self.max_event_bytes:
            raise StreamBroken(f"an upstream event exceeds {self.max_event_bytes} bytes")
        payloads = []
        for event in complete:
            lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                payloads.append(b"\n".join(_field_value(line) for line in lines))
        return payloads

    @property
    def leftover(self) -> bytes:
        """Bytes of an event not yet terminated (non-empty when a stream was cut mid-event)."""
        return self._pending


def _field_value(line: bytes) -> bytes:
    value = line[len(b"data:") :]
    return value[1:] if value.startswith(b" ") else value


@dataclass
class _Choice:
    """What one choice's chunks have said so far."""

    index: int
    text: list[str] = field(default_factory=list)
    role: str | None = None
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    chat_logprobs: list[Any] | None = None
    completion_logprobs: dict[str, list[Any] | None] | None = None
    finish_reason: str | None = None
    stop_reason: Any = None


@dataclass
class StreamAssembly:
    """Folds parsed chunks into the non-streamed body; `chat` says which endpoint's shape."""

    chat: bool
    envelope: dict[str, Any] = field(default_factory=dict)  # top-level fields of the first chunk
    prompt_token_ids: list[int] | None = None
    usage: Any = None
    done: bool = False
    broken: bool = False  # the upstream's stream broke: the agent is (being) sent an error event
    chunks: int = 0
    _choices: dict[int, _Choice] = field(default_factory=dict)

    def add(self, payload: bytes) -> dict[str, Any] | None:
        """Take one event's payload: the parsed chunk (None for `[DONE]`); StreamBroken if malformed."""
        if payload.strip() == DONE.encode():
            self.done = True
            return None
        if self.done:
            raise StreamBroken("the upstream sent data after [DONE]")
        try:
            chunk = json.loads(payload)
        except ValueError as error:
            raise StreamBroken(f"the upstream sent a chunk that is not JSON: {payload[:80]!r}") from error
        if not isinstance(chunk, dict):
            raise StreamBroken("the upstream sent a chunk that is not a JSON object")
        if "error" in chunk:
            raise StreamBroken(f"the upstream reported an error mid-stream: {_error_message(chunk)}")
        self.chunks += 1
        self._take(chunk)
        return chunk

    def _take(self, chunk: dict[str, Any]) -> None:
        if not self.envelope:
            skip = {"choices", "usage", "prompt_token_ids", "object"}
            self.envelope = {key: value for key, value in chunk.items() if key not in skip}
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_token_ids = _int_list(chunk["prompt_token_ids"], "prompt_token_ids")
        if chunk.get("usage") is not None:
            self.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list):
            raise StreamBroken("a chunk's choices is not a list")
        for raw in choices:
            if not isinstance(raw, dict) or not isinstance(raw.get("index", 0), int):
                raise StreamBroken("a chunk's choice is not an object with an integer index")
            index = int(raw.get("index", 0))
            choice = self._choices.setdefault(index, _Choice(index=index))
            if self.chat:
                self._take_chat(choice, raw)
            else:
                self._take_completion(choice, raw)
            if raw.get("token_ids") is not None:
                choice.token_ids = (choice.token_ids or []) + _int_list(raw["token_ids"], "token_ids")
            if raw.get("finish_reason") is not None:
                choice.finish_reason = str(raw["finish_reason"])
                choice.stop_reason = raw.get("stop_reason")

    def _take_chat(self, choice: _Choice, raw: dict[str, Any]) -> None:
        delta = raw.get("delta") or {}
        if not isinstance(delta, dict):
            raise StreamBroken("a chat chunk's delta is not an object")
        if delta.get("role") is not None:
            choice.role = str(delta["role"])
        if delta.get("content") is not None:
            choice.text.append(str(delta["content"]))
        for name in ("reasoning", "reasoning_content"):
            if delta.get(name) is not None:
                choice.reasoning.append(str(delta[name]))
        for call in delta.get("tool_calls") or []:
            _merge_tool_call(choice.tool_calls, call)
        logprobs = raw.get("logprobs")
        if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
            choice.chat_logprobs = (choice.chat_logprobs or []) + logprobs["content"]

    def _take_completion(self, choice: _Choice, raw: dict[str, Any]) -> None:
        if raw.get("text") is not None:
            choice.text.append(str(raw["text"]))
        if raw.get("prompt_token_ids") is not None:
            choice.prompt_token_ids = _int_list(raw["prompt_token_ids"], "prompt_token_ids")
        logprobs = raw.get("logprobs")
        if isinstance(logprobs, dict):
            merged = choice.completion_logprobs or {}
            for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                part = logprobs.get(key)
                if isinstance(part, list):
                    merged[key] = (merged.get(key) or []) + part
                elif key in logprobs:
                    merged.setdefault(key, None)  # e.g. top_logprobs with logprobs: 0
            choice.completion_logprobs = merged

    def response(self) -> dict[str, Any]:
        """The body the upstream would have answered without streaming (vLLM's shape)."""
        choices = [self._choice_body(self._choices[index]) for index in sorted(self._choices)]
        body: dict[str, Any] = {
            **self.envelope,
            "object": "chat.completion" if self.chat else "text_completion",
            "choices": choices,
            "usage": self.usage,
        }
        if self.chat:
            body.setdefault("prompt_logprobs", None)
            body["prompt_token_ids"] = self.prompt_token_ids
        return body

    def _choice_body(self, choice: _Choice) -> dict[str, Any]:
        text = "".join(choice.text)
        body: dict[str, Any] = {"index": choice.index}
        if self.chat:
            message: dict[str, Any] = {"role": choice.role or "assistant", "content": text}
            if choice.reasoning:
                message["reasoning"] = "".join(choice.reasoning)
            message["tool_calls"] = [choice.tool_calls[key] for key in sorted(choice.tool_calls)]
            body["message"] = message
            body["logprobs"] = None if choice.chat_logprobs is None else {"content": choice.chat_logprobs}
        else:
            body["text"] = text
            body["logprobs"] = choice.completion_logprobs
        body.update(finish_reason=choice.finish_reason, stop_reason=choice.stop_reason)
        body["token_ids"] = choice.token_ids
        if not self.chat:
            body.update(prompt_logprobs=None, prompt_token_ids=choice.prompt_token_ids)
        return body


def _merge_tool_call(calls: dict[int, dict[str, Any]], delta: Any) -> None:
    """OpenAI's tool-call deltas: an index's first carries id, type and name; arguments come in pieces."""
    if not isinstance(delta, dict) or not isinstance(delta.get("index", 0), int):
        raise StreamBroken("a tool-call delta is not an object with an integer index")
    index = int(delta.get("index", 0))
    empty = {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
    call = calls.setdefault(index, empty)
    if delta.get("id") is not None:
        call["id"] = delta["id"]
    if delta.get("type") is not None:
        call["type"] = delta["type"]
    function = delta.get("function") or {}
    if isinstance(function, dict):
        if function.get("name"):
            call["function"]["name"] += str(function["name"])
        if function.get("arguments"):
            call["function"]["arguments"] += str(function["arguments"])


def _int_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(item, int) for item in value):
        raise StreamBroken(f"a chunk's {name} is not a list of integers")
    return list(value)


def _error_message(chunk: dict[str, Any]) -> str:
    error = chunk.get("error")
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


def include_usage(body: dict[str, Any]) -> bool:
    """Whether the agent asked for the usage chunk (`stream_options.include_usage`)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def is_usage_chunk(chunk: dict[str, Any]) -> bool:
    """The usage-only chunk vLLM sends last when asked (no choices)."""
    return not chunk.get("choices") and chunk.get("usage") is not None
