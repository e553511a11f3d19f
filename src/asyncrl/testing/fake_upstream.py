"""A small OpenAI-compatible server for tests and benchmarks: real HTTP, deterministic answers.

It answers /v1/chat/completions and /v1/completions in vLLM's shape, so the gateway's capture path sees what
it sees in production: with `return_token_ids`, a chat completion carries `prompt_token_ids` at the top
level and a text completion inside each choice (vLLM's `CompletionResponseChoice`); `token_ids` are always
per choice; fields vLLM leaves empty are present as null. It records the sampling settings of the last
request (`GET /stats`), so tests can see what the gateway forwarded. Test knobs ride in
the request body: `fake_delay_seconds` (sleep before answering) and `fake_status` (answer with that status).
`/stats` counts calls and the `disconnects` of clients that left while a call slept.
Run it with `python -m asyncrl.testing.fake_upstream --port P`.
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
    answer = f"echo {len(prompt.split())} words call {calls}"
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


def build_app(default_delay_seconds: float = 0.0) -> web.Application:
    state: dict[str, Any] = {"calls": 0, "last_model": None, "last_sampling": None, "disconnects": 0}

    async def handle(request: web.Request) -> web.Response:
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
