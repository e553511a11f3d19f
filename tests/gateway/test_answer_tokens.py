"""The typed fast read of an upstream answer gives exactly what the general reader gives, or steps aside.

`capture.py` reads a well-formed answer with `answer_tokens.read_answer` (msgspec, token fields only) and any
other with the general reader. Hypothesis writes answers of both kinds, well-formed and odd (ids that are
floats, strings, bools or past 2**64; log-probs that are null, strings, huge; choices that are no objects;
duplicate keys), and every one must capture the same records either way.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.capturing import CaptureMode
from asyncrl.gateway.capture import _fast_choices, _general_choices, capture_call

_ids = st.lists(st.integers(min_value=0, max_value=200_000), max_size=12)
_odd_id = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
)
_odd_ids = st.one_of(_ids, st.lists(st.one_of(st.integers(0, 50), _odd_id), max_size=6), st.none())
_logprob = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False), st.integers(min_value=-100, max_value=0)
)
_odd_logprob = st.one_of(_logprob, st.none(), st.text(max_size=4), st.booleans())


@st.composite
def _choice(draw: st.DrawFn, *, odd: bool) -> Any:
    """One choice as vLLM writes it (chat or completions), or, when `odd`, of any shape."""
    ids = _odd_ids if odd else _ids
    choice: dict[str, Any] = {}
    if draw(st.booleans()):
        choice["index"] = draw(
            st.one_of(st.integers(-3, 5), st.booleans(), st.none()) if odd else st.integers(0, 5)
        )
    if draw(st.booleans()):
        choice["token_ids"] = draw(ids)
    if draw(st.booleans()):
        choice["prompt_token_ids"] = draw(ids)
    kind = draw(st.sampled_from(["chat", "completions", "none", "null"] + (["odd"] if odd else [])))
    values = draw(st.lists(_odd_logprob if odd else _logprob, max_size=8))
    if kind == "chat":
        items: list[Any] = [
            {"token": "x", "logprob": value, "bytes": [120], "top_logprobs": []} for value in values
        ]
        if odd and draw(st.booleans()) and items:
            items[0] = {"token": "x"}  # no log-prob at all
        choice["logprobs"] = {"content": items}
    elif kind == "completions":
        choice["logprobs"] = {"token_logprobs": values, "tokens": ["x"] * len(values)}
    elif kind == "null":
        choice["logprobs"] = None
    elif kind == "odd":
        choice["logprobs"] = draw(st.one_of(st.text(max_size=3), st.just([1, 2]), st.just({"content": "x"})))
    if draw(st.booleans()):
        reasons = st.sampled_from(["stop", "length", "abort", "tool_calls"])
        choice["finish_reason"] = draw(st.one_of(reasons, st.integers(0, 2)) if odd else reasons)
    choice["message"] = {"role": "assistant", "content": "ignored " * draw(st.integers(0, 3))}
    if odd and draw(st.booleans()):
        return draw(st.one_of(st.none(), st.integers(), st.text(max_size=3), st.just(choice)))
    return choice


@st.composite
def _answer(draw: st.DrawFn, *, odd: bool) -> bytes:
    answer: dict[str, Any] = {"id": "chatcmpl-1", "object": "chat.completion", "usage": {"prompt_tokens": 3}}
    if draw(st.booleans()):
        answer["prompt_token_ids"] = draw(_odd_ids if odd else _ids)
    answer["choices"] = draw(st.lists(_choice(odd=odd), min_size=0 if odd else 1, max_size=3))
    if odd and draw(st.booleans()):
        answer["choices"] = draw(st.one_of(st.none(), st.text(max_size=3), st.just(answer["choices"])))
    text = json.dumps(answer)
    edit = draw(st.integers(0, 3)) if odd else None
    if edit == 0:
        text = text.replace('"id": ', '"choices": [], "id": ', 1)  # a duplicate key: the last one counts
    elif edit == 1:
        text = text.replace("-0.5", "-1e400", 1).replace("0.0", "NaN", 1)  # what only the lax parser takes
    elif edit == 2:
        text = text[: draw(st.integers(0, len(text)))]  # cut short
    return text.encode()


def _records(raw: bytes, *, fast: bool) -> list[tuple[Any, ...]]:
    choices = _fast_choices(raw) if fast else None
    if choices is None:
        choices = _general_choices(raw)
    return [
        (index, _values(prompt), _values(response), _values(log_probs), unreadable, aborted)
        for index, prompt, response, log_probs, unreadable, aborted in choices
    ]


def _values(packed: Any) -> Any:
    return None if packed is None else list(packed)


def _as_text(records: list[tuple[Any, ...]]) -> str:
    return repr(records)  # NaN, which only the lax parser takes, is never equal to itself


@settings(max_examples=400, deadline=None)
@given(_answer(odd=False))
def test_a_well_formed_answer_is_read_fast_and_captured_as_the_general_reader_does(raw: bytes) -> None:
    assert _fast_choices(raw) is not None
    assert _as_text(_records(raw, fast=True)) == _as_text(_records(raw, fast=False))


@settings(max_examples=600, deadline=None)
@given(_answer(odd=True))
def test_an_answer_of_any_shape_is_captured_as_the_general_reader_does(raw: bytes) -> None:
    assert _as_text(_records(raw, fast=True)) == _as_text(_records(raw, fast=False))


def _vllm_chat_answer(tokens: int, *, finish_reason: str = "length") -> bytes:
    logprobs = [
        {"token": "x", "logprob": -0.25 - index / 1000, "bytes": [120], "top_logprobs": []}
        for index in range(tokens)
    ]
    return json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "model": "policy",
            "prompt_token_ids": list(range(40)),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "x " * tokens, "tool_calls": []},
                    "logprobs": {"content": logprobs},
                    "finish_reason": finish_reason,
                    "token_ids": [7 + index for index in range(tokens)],
                }
            ],
            "usage": {"prompt_tokens": 40, "completion_tokens": tokens},
        }
    ).encode()


def test_vllms_answers_take_the_fast_read() -> None:
    """The fast read is used for what vLLM sends (else the speed-up would be silently lost), and its records
    hold vLLM's ids and log-probs exactly."""
    raw = _vllm_chat_answer(300)
    fast = _fast_choices(raw)
    assert fast is not None
    ((index, prompt, response, log_probs, unreadable, aborted),) = fast
    assert (index, unreadable, aborted) == (0, None, False)
    assert list(prompt or ()) == list(range(40))
    assert list(response or ()) == [7 + i for i in range(300)]
    assert list(log_probs or ()) == [-0.25 - i / 1000 for i in range(300)]
    completions = json.dumps(
        {
            "choices": [
                {
                    "index": 1,
                    "prompt_token_ids": [1, 2],
                    "token_ids": [3],
                    "logprobs": {"token_logprobs": [-1]},
                }
            ]
        }
    ).encode()
    assert _fast_choices(completions) == _general_choices(completions)
    assert _fast_choices(completions) is not None


def test_an_aborted_choice_read_fast_is_still_never_trained_on() -> None:
    (call,) = capture_call(
        mode=CaptureMode.COMPACT,
        attempt_id="a1",
        endpoint="chat/completions",
        status=200,
        latency_seconds=0.1,
        model_version=3,
        started_at=0.0,
        request_body=b"{}",
        response_body=_vllm_chat_answer(5, finish_reason="abort"),
    )
    assert call.aborted
    assert "finish_reason abort" in (call.unreadable or "")
    assert list(call.response_token_ids or ()) == [7, 8, 9, 10, 11]
