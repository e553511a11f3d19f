"""A small OpenAI-compatible server for trying an agent, and for tests and benchmarks: real HTTP,
deterministic answers.

It answers /v1/chat/completions and /v1/completions in vLLM's shape, so the gateway's capture path sees what
it sees in production: with `return_token_ids`, a chat completion carries `prompt_token_ids` at the top
level and a text completion inside each choice (vLLM's `CompletionResponseChoice`); `token_ids` are always
per choice; fields vLLM leaves empty are present as null. It records the sampling settings of the last
request (`GET /stats`), so tests can see what the gateway forwarded. Test knobs ride in
the request body: `fake_delay_seconds` (sleep before answering), `fake_status` (answer with that status) and
`fake_answer` (the answer's text, instead of one that counts calls).
`/stats` counts calls and the `disconnects` of clients that left while a call slept.

With `stream: true` it streams as vLLM does (`stream_chunks`): chat chunks start with a role delta carrying
the top-level `prompt_token_ids`, then one chunk per token (its text, `token_ids` and `logprobs`), the last
with `finish_reason`; text completions carry `prompt_token_ids` in the first choice chunk; a usage chunk
without choices follows when `stream_options.include_usage` asks; then `data: [DONE]`. Stream knobs:
`fake_chunk_delay_seconds` (between chunks), `fake_stream_cut_after` (drop the connection after that many
chunks) and `fake_stream_malformed_after` (send a chunk that is not JSON after that many). `/stats` counts
`streams_completed` and `streams_cancelled` (the client left mid-stream).
Run it with `python -m asyncrl.fake_upstream --port P`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from typing import Any

from aiohttp import web


def _tokens(text: str) -> list[int]:
    return [int(hashlib.blake2s(word.encode(), digest_size=2).hexdigest(), 16) for word in text.split()]


def _prompt_text(body: dict[str, Any]) -> str:
    if "messages" in body:
        return " ".join(str(message.get("content", "")) for message in body["messages"])
    return str(body.get("prompt", ""))


def completion(body: dict[str, Any], *, chat: bool, calls: int) -> dict[str, Any]:
    prompt = _prompt_text(body)
    answer = str(body.get("fake_answer") or f"echo {len(prompt.split())} words call {calls}")
    token_ids = _tokens(answer)
    logprobs = [-0.1 * (index + 1) for index in range(len(token_ids))]
    with_ids = bool(body.get("return_token_ids"))
    prompt_ids = _tokens(prompt) if with_ids else None
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["message"] = {"role": "assistant", "content": answer, "tool_calls": []}
        choice["logprobs"] = None
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": word, "logprob": value, "bytes": list(word.encode()), "top_logprobs": []}
                    for word, value in zip(answer.split(), logprobs, strict=True)
                ]
            }
    else:
        choice["text"] = answer
        choice["logprobs"] = None
        if body.get("logprobs") is not None:
            words = answer.split()
            choice["logprobs"] = {
                "text_offset": [sum(len(w) for w in words[:i]) for i in range(len(words))],
                "token_logprobs": logprobs,
                "tokens": words,
                "top_logprobs": [{word: value} for word, value in zip(words, logprobs, strict=True)],
            }
    choice.update(finish_reason="stop", stop_reason=None, token_ids=token_ids if with_ids else None)
    if not chat:
        choice.update(prompt_logprobs=None, prompt_token_ids=prompt_ids)
    prompt_tokens = len(prompt.split())
    response: dict[str, Any] = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{calls}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": body.get("model", "unknown"),
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(token_ids),
            "total_tokens": prompt_tokens + len(token_ids),
        },
    }
    if chat:
        response.update(prompt_logprobs=None, prompt_token_ids=prompt_ids)
    return response


def stream_chunks(body: dict[str, Any], *, chat: bool, calls: int) -> list[dict[str, Any]]:
    """The chunks vLLM streams for the answer `completion()` gives (without the final `[DONE]`)."""
    whole = completion(body, chat=chat, calls=calls)
    choice = whole["choices"][0]
    words = (choice["message"]["content"] if chat else choice["text"]).split()
    envelope = {
        "id": whole["id"],
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": whole["created"],
        "model": whole["model"],
    }
    chunks: list[dict[str, Any]] = []
    if chat:  # vLLM's first chat chunk: the role, and the prompt's token ids (null unless asked for)
        first = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None}
        first["finish_reason"] = None
        chunks.append({**envelope, "choices": [first], "prompt_token_ids": whole["prompt_token_ids"]})
    token_ids = choice["token_ids"]
    for position, word in enumerate(words):
        piece = word if position == 0 else f" {word}"
        last = position == len(words) - 1
        part: dict[str, Any] = {"index": 0}
        if chat:
            part["delta"] = {"content": piece}
            content = choice["logprobs"]["content"][position : position + 1] if choice["logprobs"] else None
            part["logprobs"] = {"content": content} if content is not None else None
        else:
            part["text"] = piece
            logprobs = choice["logprobs"]
            part["logprobs"] = (
                None
                if logprobs is None
                else {key: logprobs[key][position : position + 1] for key in logprobs}
            )
        part["finish_reason"] = choice["finish_reason"] if last else None
        if last or not chat:
            part["stop_reason"] = None
        if not chat:
            part["prompt_token_ids"] = choice["prompt_token_ids"] if position == 0 else None
        part["token_ids"] = token_ids[position : position + 1] if token_ids is not None else None
        chunk: dict[str, Any] = {**envelope, "choices": [part]}
        if not chat:
            chunk["usage"] = None
        chunks.append(chunk)
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        chunks.append({**envelope, "choices": [], "usage": whole["usage"]})
    return chunks


def build_app(default_delay_seconds: float = 0.0) -> web.Application:
    state: dict[str, Any] = {
        "calls": 0,
        "last_model": None,
        "last_sampling": None,
        "last_stream_options": None,
        "disconnects": 0,
        "streams_completed": 0,
        "streams_cancelled": 0,
    }

    async def stream(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        chat = request.path.endswith("chat/completions")
        chunks = stream_chunks(body, chat=chat, calls=int(state["calls"] or 0))
        delay = float(body.get("fake_chunk_delay_seconds", 0.0))
        cut_after = body.get("fake_stream_cut_after")
        malformed_after = body.get("fake_stream_malformed_after")
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        try:
            for sent, chunk in enumerate(chunks):
                if cut_after is not None and sent >= int(cut_after):
                    assert request.transport is not None
                    request.transport.close()  # mid-stream, no [DONE]
                    return response
                if malformed_after is not None and sent >= int(malformed_after):
                    await response.write(b'data: {"choices": [\n\n')
                    break
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                if delay > 0:
                    await asyncio.sleep(delay)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            state["streams_cancelled"] = int(state["streams_cancelled"] or 0) + 1
            raise
        state["streams_completed"] = int(state["streams_completed"] or 0) + 1
        return response

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state["calls"] = int(state["calls"] or 0) + 1
        state["last_model"] = body.get("model")
        state["last_sampling"] = {name: body.get(name) for name in ("temperature", "top_p", "top_k")}
        delay = float(body.get("fake_delay_seconds", default_delay_seconds))
        if delay > 0:
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:  # the client went away mid-call (e.g. an aborting gateway)
                state["disconnects"] = int(state["disconnects"] or 0) + 1
                raise
        if "fake_status" in body:
            return web.json_response({"error": "fake failure"}, status=int(body["fake_status"]))
        if body.get("stream"):
            state["last_stream_options"] = body.get("stream_options")
            return await stream(request, body)
        chat = request.path.endswith("chat/completions")
        return web.json_response(completion(body, chat=chat, calls=int(state["calls"] or 0)))

    async def stats(_request: web.Request) -> web.Response:
        return web.Response(text=json.dumps(state), content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_post("/v1/completions", handle)
    app.router.add_get("/stats", stats)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay-seconds", type=float, default=0.0)
    args = parser.parse_args()
    web.run_app(
        build_app(args.delay_seconds),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
        handler_cancellation=True,  # a disconnect cancels the handler, so `disconnects` counts it
    )


if __name__ == "__main__":
    main()
