"""The token fields of an upstream answer, read by a typed decoder that skips everything else.

Capture needs only a few fields of vLLM's answer: the prompt's token ids, each choice's generated ids, their
log-probs, `finish_reason` and `index`. Parsing the whole answer into Python objects (a dict per log-prob,
with its token text, bytes and alternatives) and then validating the lists cost about 1.5 ms a call for a
500-token answer, on the gateway's one event loop, while calls released at a resume wait in line for it.
msgspec decodes just these fields into typed structs and skips the rest in C.

This is a fast path only. An answer of any other shape (a token id that is no int or past 2**64, a
log-prob that is null or missing, NaN, a choice that is no object, no JSON at all) makes `read_answer`
return None, and the caller reads it the general way (`capture.py`), which says what could not be read.
So both paths give the same records; `tests/gateway/test_answer_tokens.py` checks that they do.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec


class _ChatLogProb(msgspec.Struct):
    logprob: float


class _LogProbs(msgspec.Struct):
    content: list[_ChatLogProb] | None = None  # chat completions
    token_logprobs: list[float] | None = None  # text completions


class _Choice(msgspec.Struct):
    index: int | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None  # text completions put the prompt's ids here
    logprobs: _LogProbs | None = None
    finish_reason: str | None = None


class _Answer(msgspec.Struct):
    prompt_token_ids: list[int] | None = None  # chat completions put them here
    choices: list[_Choice] | None = None


_DECODER = msgspec.json.Decoder(_Answer)


@dataclass(frozen=True, slots=True)
class ChoiceTokens:
    """One choice's capture fields, as the general reader would give them for a well-formed answer."""

    index: int | None
    prompt_token_ids: list[int] | None
    response_token_ids: list[int] | None
    log_probs: list[float] | None
    finish_reason: str | None


def _log_probs(logprobs: _LogProbs | None) -> list[float] | None:
    if logprobs is None:
        return None
    if logprobs.content is not None:
        return [item.logprob for item in logprobs.content]
    return logprobs.token_logprobs


def read_answer(raw: bytes) -> list[ChoiceTokens] | None:
    """Each choice's token fields in the answer's order, or None when `raw` is not a plain, well-formed answer
    (the general reader then decides what it holds). An answer without choices has none here."""
    try:
        answer = _DECODER.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return [
        ChoiceTokens(
            index=choice.index,
            prompt_token_ids=answer.prompt_token_ids
            if answer.prompt_token_ids is not None
            else choice.prompt_token_ids,
            response_token_ids=choice.token_ids,
            log_probs=_log_probs(choice.logprobs),
            finish_reason=choice.finish_reason,
        )
        for choice in answer.choices or ()
    ]
