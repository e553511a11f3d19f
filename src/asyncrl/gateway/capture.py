"""What the gateway keeps of each model call, and the events document it writes from that.

A call is read once, when it is captured: its token ids and log-probs are taken from the upstream's answer
and packed into arrays (4 bytes per token id, 8 per log-prob: the float64 the JSON held, so nothing is
rounded), validated with the reader's own types (`gateway_api.events.TokenIds`, `LogProbs`). In `Compact`
capture (the default) the request and response JSON are then dropped: the trainer's adapter reads only token
ids, log-probs and metadata (its trajectory merging compares token ids, never text). `Full` capture keeps
both JSON bodies too, for debugging.

The shapes read are vLLM's OpenAI-compatible responses with `return_token_ids` and `logprobs`, which the
reference model server also produces. vLLM puts the prompt's token ids at the top level of a chat completion
but inside each choice of a text completion; both are read. Every choice is kept, one record each: an agent
that asks for `n > 1` (or sends several prompts to completions) gets n samples of the policy, and each is a
sample to train on. A streamed call is stored as the body
`streaming.StreamAssembly` built from its chunks, so it reads like any other; one the agent abandoned is
`aborted` (status 499, which the trainer's adapter drops as failed).

The events document is the trainer's one read of a rollout, so nothing stored may make it fail: each call
and each event is encoded on its own, and one that cannot be (too deep, NaN, an odd upstream shape) loses
the part at fault and says so in `unreadable`; a call without token ids is one the adapter counts as such.
"""

from __future__ import annotations

import json
import logging
import math
from array import array
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from pydantic_core import from_json

from asyncrl.capturing import CaptureMode
from asyncrl.gateway.answer_tokens import read_answer
from asyncrl.gateway.store import CapturedCall, Rollout
from asyncrl.gateway_api.events import LOG_PROBS, TOKEN_IDS, CallRecord, EventRecord, LogProbs

logger = logging.getLogger(__name__)


def request_overrides(body: dict[str, Any], *, endpoint: str, model: str, capture: bool) -> dict[str, Any]:
    """The request forwarded upstream: our model name, and token ids/log-probs asked for when capturing."""
    forwarded = dict(body)
    forwarded["model"] = model
    if capture:
        # Set, not defaulted: an agent's `logprobs: false` or `return_token_ids: false` would turn the capture
        # of a train-mode call off, and the call would silently give no training row.
        forwarded["return_token_ids"] = True
        if endpoint == "chat/completions":
            forwarded["logprobs"] = True
        else:
            asked = body.get("logprobs")
            wanted_top = isinstance(asked, int) and not isinstance(asked, bool) and asked >= 0
            forwarded["logprobs"] = asked if wanted_top else 0  # the agent's top-k alternatives are kept
    return forwarded


# -- capture: read the answer once, keep arrays -----------------------------------------------------------


def _json(raw: bytes | None) -> Any:
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


def packed_token_ids(values: Sequence[int]) -> Sequence[int]:
    """4 bytes per id (8 for ids past 2**31, kept as they are past 2**63): reads back as the same ints."""
    for typecode in ("i", "q"):
        try:
            return array(typecode, values)
        except OverflowError:
            continue
    return values


_Tokens = tuple[Sequence[int] | None, Sequence[int] | None, "array[float] | None", str | None]


def _packed(raw: Any) -> Sequence[int] | None:
    return None if raw is None else packed_token_ids(TOKEN_IDS.validate_python(raw))


def _choices(response: Any) -> list[Any]:
    """The answer's choices in index order (vLLM sends them so; a stream's assembly sorts them too)."""
    choices = response.get("choices") if isinstance(response, dict) else None
    return list(choices) if isinstance(choices, list) and choices else [{}]


def _tokens(response: Any, choice: Any) -> _Tokens:
    """(prompt ids, response ids, log-probs, what could not be read) of one choice of an answer."""
    problems = []
    try:
        raw_prompt, raw_response = _prompt_token_ids(response, choice), choice.get("token_ids")
    except Exception:  # a shape this reader does not expect: a call without tokens
        return None, None, None, "the response's choices could not be read"
    prompt = response_ids = None
    log_probs: array[float] | None = None
    try:
        prompt, response_ids = _packed(raw_prompt), _packed(raw_response)
    except ValidationError:
        prompt = response_ids = None
        problems.append("token ids that are not integers")
    try:
        values = _choice_logprobs(choice)
        log_probs = None if values is None else array("d", LOG_PROBS.validate_python(values))
    except (ValidationError, ValueError, TypeError, KeyError, OverflowError, AttributeError):
        problems.append("log-probs that are not numbers")
    return prompt, response_ids, log_probs, ("; ".join(problems) or None)


def _answer_json(raw: bytes) -> Any:
    """The upstream's answer parsed with pydantic-core's parser: the same values as `json.loads` (floats
    correctly rounded, big integers, NaN and Infinity accepted), in about half the time on the hot path."""
    try:
        return from_json(raw, allow_inf_nan=True) if raw else None
    except ValueError:
        return None


_Choice = tuple[int, Sequence[int] | None, Sequence[int] | None, "array[float] | None", str | None, bool]


def _fast_choices(response_body: bytes) -> list[_Choice] | None:
    """(index, prompt ids, response ids, log-probs, unreadable, engine-aborted) of each choice of a plain,
    well-formed answer, read by the typed decoder; None for anything else (then `_general_choices`)."""
    read = read_answer(response_body)
    if not read:  # not well-formed, or no choices: the general reader says what the call holds
        return None
    return [
        (
            _index_or_position(choice.index, position),
            None if choice.prompt_token_ids is None else packed_token_ids(choice.prompt_token_ids),
            None if choice.response_token_ids is None else packed_token_ids(choice.response_token_ids),
            None if choice.log_probs is None else array("d", choice.log_probs),
            None,
            choice.finish_reason == "abort",
        )
        for position, choice in enumerate(read)
    ]


def _general_choices(response_body: bytes) -> list[_Choice]:
    """The same for an answer of any shape: what cannot be read is named in `unreadable`."""
    answer = _answer_json(response_body)
    choices: list[_Choice] = []
    for position, choice in enumerate(_choices(answer)):
        prompt, response_ids, log_probs, unreadable = _tokens(answer, choice)
        engine_aborted = isinstance(choice, dict) and choice.get("finish_reason") == "abort"
        index = choice.get("index") if isinstance(choice, dict) else None
        choices.append(
            (_index_or_position(index, position), prompt, response_ids, log_probs, unreadable, engine_aborted)
        )
    return choices


def capture_call(
    *,
    mode: CaptureMode,
    attempt_id: str,
    endpoint: str,
    status: int,
    latency_seconds: float,
    model_version: int | None,
    started_at: float,
    request_body: bytes,
    response_body: bytes,
    agent_sampling: dict[str, Any] | None = None,
    aborted: bool = False,
) -> tuple[CapturedCall, ...]:
    """The call as the store keeps it: one record per choice (`n > 1`, or a completions call with several
    prompts), each with its own prompt ids, generated ids and log-probs as arrays; every choice is a sample
    the policy generated, so each is trained on. In `Full` capture the first record keeps the JSON bodies.
    """
    choices = _fast_choices(response_body)
    if choices is None:
        choices = _general_choices(response_body)
    full = mode is CaptureMode.FULL
    records = []
    for position, (index, prompt, response_ids, log_probs, unreadable, engine_aborted) in enumerate(choices):
        # vLLM answers 200 with `finish_reason: abort` and the tokens so far when its engine aborts a request
        # (verl's abort_all_requests, a server shutting down): an incomplete sample, never a training row.
        if engine_aborted:
            unreadable = "vLLM aborted this choice (finish_reason abort): its tokens are incomplete"
        records.append(
            CapturedCall(
                attempt_id=attempt_id,
                path=endpoint,
                status=status,
                latency_seconds=latency_seconds,
                model_version=model_version,
                started_at=started_at,
                choice_index=index,
                prompt_token_ids=prompt,
                response_token_ids=response_ids,
                response_logprobs=log_probs,
                agent_sampling=agent_sampling,
                aborted=aborted or engine_aborted,
                request_body=request_body if full and position == 0 else None,
                response_body=response_body if full and position == 0 else None,
                unreadable=unreadable,
            )
        )
    return tuple(records)


def _index_or_position(index: Any, position: int) -> int:
    return index if isinstance(index, int) and not isinstance(index, bool) and index >= 0 else position


# -- the events document ------------------------------------------------------------------------------------


def _strict_json(value: Any) -> bool:
    """Whether `value` encodes as strict JSON (no NaN, not too deep for the encoders)."""
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, RecursionError):
        return False
    return True


def _log_probs(values: Sequence[float] | None) -> LogProbs | None:
    """The log-probs as sent: none when one is not finite (strict JSON has no NaN; the adapter drops it)."""
    if values is None or not all(map(math.isfinite, values)):
        return None
    return tuple(values)


def call_record(call: CapturedCall) -> CallRecord:
    """A stored call as the wire type (no validation: what the store holds was validated at capture)."""
    request = response = None
    unreadable = call.unreadable
    if call.request_body is not None or call.response_body is not None:
        request, response = _json(call.request_body), _json(call.response_body)
        if not (_strict_json(request) and _strict_json(response)):
            request = response = None
            unreadable = "this call's request or response could not be encoded as JSON"
    return CallRecord.model_construct(
        attempt_id=call.attempt_id,
        endpoint=call.path,
        status=call.status,
        latency_seconds=call.latency_seconds,
        model_version=call.model_version,
        started_at=call.started_at,
        choice_index=call.choice_index,
        prompt_token_ids=None if call.prompt_token_ids is None else tuple(call.prompt_token_ids),
        response_token_ids=None if call.response_token_ids is None else tuple(call.response_token_ids),
        response_logprobs=_log_probs(call.response_logprobs),
        agent_sampling=call.agent_sampling,
        aborted=call.aborted,
        request=request,
        response=response,
        unreadable=unreadable,
    )


def _call_json(call: CapturedCall) -> bytes:
    try:
        return call_record(call).model_dump_json().encode()
    except Exception:  # a serializer's own limit (depth), an odd stored value
        logger.warning("a captured call of attempt %s cannot be encoded", call.attempt_id, exc_info=True)
    stub = CallRecord.model_construct(
        attempt_id=call.attempt_id,
        endpoint=call.path,
        status=call.status,
        latency_seconds=call.latency_seconds,
        model_version=call.model_version,
        started_at=call.started_at,
        choice_index=call.choice_index,
        aborted=call.aborted,
        unreadable="this call could not be encoded as JSON",
    )
    return stub.model_dump_json().encode()


def _event_json(event: dict[str, Any]) -> bytes:
    data = event.get("data")
    if isinstance(data, dict) and _strict_json(data):
        return json.dumps({**event, "data": data}, allow_nan=False).encode()
    stub = EventRecord(
        attempt_id=_str_or_none(event.get("attempt_id")),
        event_type=_str_or_none(event.get("event_type")),
        at=event.get("at") if isinstance(event.get("at"), float | int) else None,
        unreadable="this event's data could not be encoded as JSON",
    )
    return stub.model_dump_json().encode()


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def events_document(rollout: Rollout) -> bytes:
    """`GET /api/rollouts/{rollout_id}/events` as JSON bytes: a `gateway_api.events.EventsDocument`."""
    view = rollout.view()
    try:
        encoded_view = view.model_dump_json().encode() if _strict_json(view.input) else None
    except Exception:  # a serializer's own depth limit
        encoded_view = None
    if encoded_view is None:  # only the input (the trainer's, checked at admission) can be at fault
        encoded_view = view.model_copy(update={"input": None}).model_dump_json().encode()
    calls = b",".join(_call_json(call) for call in rollout.calls)
    events = b",".join(_event_json(event) for event in rollout.events)
    return b'{"rollout":%s,"model_calls":[%s],"events":[%s]}' % (encoded_view, calls, events)
