"""Turn captured model calls into what training needs: token ids and per-token log-probs.

The proxy stores each call as raw bytes (cheap on the hot path); parsing happens here, when the trainer
reads a rollout's events. The shapes read are vLLM's OpenAI-compatible responses with `return_token_ids` and
`logprobs`, which the reference model server also produces. vLLM puts the prompt's token ids at the top
level of a chat completion but inside each choice of a text completion; both are read. A streamed call is
stored as the body `streaming.StreamAssembly` built from its chunks, so it reads like any other; one the agent
abandoned is `aborted` (status 499, which the trainer's adapter drops as failed).

The events document is the trainer's one read of a rollout, so nothing an agent stored may make it fail:
each call and each event is encoded on its own, and one that cannot be (too deep, NaN, an odd upstream
shape) is replaced by a stub that says so, which the trainer's adapter counts as a call without tokens.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from asyncrl.gateway.store import CapturedCall, Rollout

logger = logging.getLogger(__name__)


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
        "aborted": call.aborted,
    }


def _encoded(value: Any) -> bytes | None:
    """Strict JSON of `value` (no NaN), or None when it cannot be encoded."""
    try:
        return json.dumps(value, allow_nan=False).encode()
    except (ValueError, TypeError, RecursionError):
        return None


def _call_json(call: CapturedCall) -> bytes:
    try:
        encoded = _encoded(parse_call(call))
    except Exception:  # a response shape parse_call does not expect
        logger.warning("a captured call of attempt %s cannot be parsed", call.attempt_id, exc_info=True)
        encoded = None
    if encoded is not None:
        return encoded
    stub = {
        "attempt_id": call.attempt_id,
        "endpoint": call.path,
        "status": call.status,
        "latency_seconds": call.latency_seconds,
        "model_version": call.model_version,
        "started_at": call.started_at,
        "unreadable": "this call's request or response could not be encoded as JSON",
    }
    return json.dumps(stub).encode()


def _event_json(event: dict[str, Any]) -> bytes:
    encoded = _encoded(event)
    if encoded is not None:
        return encoded
    stub = {
        "attempt_id": event.get("attempt_id"),
        "event_type": event.get("event_type"),
        "at": event.get("at"),
        "data": None,
        "unreadable": "this event's data could not be encoded as JSON",
    }
    return json.dumps(stub).encode()


def events_document(rollout: Rollout) -> bytes:
    """`GET /api/rollouts/{rollout_id}/events` as JSON bytes: the rollout's view, its calls, its events."""
    view = rollout.view()
    try:
        encoded_view = _encoded(view.model_dump(mode="json"))
    except Exception:  # a serializer's own depth limit
        encoded_view = None
    if encoded_view is None:  # only the input (the trainer's, checked at the door) can be at fault
        encoded_view = json.dumps(view.model_copy(update={"input": None}).model_dump(mode="json")).encode()
    calls = b",".join(_call_json(call) for call in rollout.calls)
    events = b",".join(_event_json(event) for event in rollout.events)
    return b'{"rollout":%s,"model_calls":[%s],"events":[%s]}' % (encoded_view, calls, events)
