"""Turn captured model calls into what training needs: token ids and per-token log-probs.

The proxy stores each call as raw bytes (cheap on the hot path); parsing happens here, when the trainer
reads a rollout's events. The shapes read are vLLM's OpenAI-compatible responses with `return_token_ids` and
`logprobs`, which the reference model server also produces. vLLM puts the prompt's token ids at the top
level of a chat completion but inside each choice of a text completion; both are read.
"""

from __future__ import annotations

import json
from typing import Any

from asyncrl.gateway.store import CapturedCall


def request_overrides(body: dict[str, Any], *, endpoint: str, model: str, capture: bool) -> dict[str, Any]:
    """The request forwarded upstream: our model name, and token ids/log-probs asked for when capturing."""
    forwarded = dict(body)
    forwarded["model"] = model
    if capture:
        forwarded.setdefault("return_token_ids", True)
        if endpoint == "chat/completions":
            forwarded.setdefault("logprobs", True)
        else:
            forwarded.setdefault("logprobs", 0)
    return forwarded


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _choice_logprobs(choice: dict[str, Any]) -> list[float] | None:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    if isinstance(logprobs.get("content"), list):  # chat completions
        return [float(item["logprob"]) for item in logprobs["content"]]
    if isinstance(logprobs.get("token_logprobs"), list):  # completions
        return [float(value) for value in logprobs["token_logprobs"]]
    return None


def _prompt_token_ids(response: Any, choice: dict[str, Any]) -> Any:
    """At the top level (chat completions), else in the choice (text completions, as vLLM puts them)."""
    top = response.get("prompt_token_ids") if isinstance(response, dict) else None
    return top if top is not None else choice.get("prompt_token_ids")


def parse_call(call: CapturedCall) -> dict[str, Any]:
    """One model call as JSON: request, response, token ids, log-probs, latency, status, model version."""
    request = _json(call.request_body)
    response = _json(call.response_body)
    choice: dict[str, Any] = {}
    if isinstance(response, dict) and response.get("choices"):
        choice = response["choices"][0]
    return {
        "attempt_id": call.attempt_id,
        "endpoint": call.path,
        "status": call.status,
        "latency_seconds": call.latency_seconds,
        "model_version": call.model_version,
        "started_at": call.started_at,
        "request": request,
        "response": response,
        "prompt_token_ids": _prompt_token_ids(response, choice),
        "response_token_ids": choice.get("token_ids"),
        "response_logprobs": _choice_logprobs(choice),
        "agent_sampling": call.agent_sampling,
    }
