"""The reference server's `stream: true` over real HTTP: vLLM's chunks, adding up to the plain answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from asyncrl.gateway.streaming import SseEvents, StreamAssembly
from asyncrl.trainer.backends.reference import ReferenceBackend
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
