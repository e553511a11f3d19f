"""The reference server's `stream: true` over real HTTP: vLLM's chunks, adding up to the plain answer."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
from typing import Any

import pytest

from asyncrl.gateway.streaming import SseEvents, StreamAssembly
from asyncrl.trainer.backends.reference import ReferenceBackend, ReferenceBackendConfig
from asyncrl.trainer.backends.reference.config import ServerConfig
from tests.trainer.backends.support import post, serving

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def plain_and_streamed(path: str, body: dict[str, Any]) -> tuple[dict[str, Any], list[bytes], str]:
    """The plain answer, the streamed events' payloads and the stream's content type, same seed."""
    backend = ReferenceBackend()

    async def scenario() -> tuple[dict[str, Any], list[bytes], str]:
        async with serving(backend) as session:
            _status, _headers, plain = await post(session, path, body)
            streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
            async with session.post(path, json=streamed) as response:
                assert response.status == 200
                events = SseEvents(max_event_bytes=1 << 20)
                payloads = [
                    payload async for data in response.content.iter_any() for payload in events.feed(data)
                ]
                return plain, payloads, response.headers["content-type"]

    return asyncio.run(scenario())


def without_ids(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key not in {"id", "created"}}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"messages": MESSAGES, "logprobs": True, "top_logprobs": 2}),
        (COMPLETIONS, {"prompt": "abc", "logprobs": 2}),
        (COMPLETIONS, {"prompt": "abc", "logprobs": 0, "n": 2}),
    ],
)
def test_streamed_chunks_assemble_into_the_plain_answer_of_the_same_seed(
    path: str, body: dict[str, Any]
) -> None:
    body = {**body, "return_token_ids": True, "max_tokens": 16, "seed": 5}
    plain, payloads, content_type = plain_and_streamed(path, body)
    assert content_type.startswith("text/event-stream")
    assert payloads[-1] == b"[DONE]"
    chunks = [json.loads(payload) for payload in payloads[:-1]]
    chat = path == CHAT
    assembly = StreamAssembly(chat=chat)
    for payload in payloads:
        assembly.add(payload)
    assert assembly.done
    assert without_ids(assembly.response()) == without_ids(plain)
    # vLLM's shapes: chat opens with a role delta carrying the prompt ids at the top level; then one
    # token per chunk; each choice's last token chunk carries the finish reason; usage comes last, alone.
    token_chunks = [chunk for chunk in chunks if chunk["choices"] and chunk["choices"][0].get("token_ids")]
    assert all(len(chunk["choices"][0]["token_ids"]) == 1 for chunk in token_chunks)
    assert len(token_chunks) == sum(len(choice["token_ids"]) for choice in plain["choices"])
    if chat:
        first = chunks[0]
        assert first["object"] == "chat.completion.chunk"
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert first["prompt_token_ids"] == plain["prompt_token_ids"]
    else:
        assert chunks[0]["object"] == "text_completion"
        assert chunks[0]["choices"][0]["prompt_token_ids"] == plain["choices"][0]["prompt_token_ids"]
        assert set(chunks[0]["choices"][0]) == {
            "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"
        }  # fmt: skip
    finishing = [chunk for chunk in token_chunks if chunk["choices"][0]["finish_reason"] is not None]
    assert len(finishing) == len(plain["choices"])
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == plain["usage"]


def test_a_stop_string_is_never_streamed_past() -> None:
    body = {"prompt": "abc", "max_tokens": 24, "temperature": 0, "return_token_ids": True}
    probe, _payloads, _type = plain_and_streamed(COMPLETIONS, body)
    text = probe["choices"][0]["text"]
    if len(text) < 8:
        pytest.skip("the untrained model's greedy answer is too short to hold a stop string")
    stop = text[5:7]
    plain, payloads, _type = plain_and_streamed(COMPLETIONS, {**body, "stop": [stop]})
    streamed_text = "".join(
        chunk["choices"][0]["text"] for chunk in map(json.loads, payloads[:-1]) if chunk["choices"]
    )
    assert streamed_text == plain["choices"][0]["text"]
    assert stop not in streamed_text


def test_a_client_that_leaves_mid_stream_leaves_no_unretrieved_future_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sampling thread stops with `_ClientLeft` when its client has gone; that exception must be
    retrieved, or asyncio logs "Future exception was never retrieved" (local mode's trainer.log, issue 24)."""
    config = ReferenceBackendConfig(server=ServerConfig(worker_threads=1))  # one generation at a time
    backend = ReferenceBackend(config)
    long_stream = {"prompt": "abc", "max_tokens": 900, "ignore_eos": True, "stream": True}

    async def scenario() -> None:
        async with serving(backend) as session:
            response = await session.post(COMPLETIONS, json=long_stream)
            assert response.status == 200
            assert await response.content.readany()  # the first tokens: the generation is under way
            response.connection.transport.abort()  # type: ignore[union-attr]  # the client leaves at once
            response.release()
            # The one worker thread takes the next request only once the abandoned generation has stopped;
            # its future is done (and its callbacks have run) before this answer comes back.
            status, _headers, _body = await post(session, COMPLETIONS, {"prompt": "abc", "max_tokens": 1})
            assert status == 200
            gc.collect()  # a future that nobody references any more reports an unretrieved exception now

    with caplog.at_level(logging.INFO):
        asyncio.run(scenario())
    messages = [record.getMessage() for record in caplog.records]
    assert any("a streaming client left" in message for message in messages), messages  # it left mid-stream
    assert not [message for message in messages if "exception was never retrieved" in message]
