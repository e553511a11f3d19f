"""The run's rollout sampling, applied to the agents' train-mode model calls.

The trainer recomputes the old policy's log-probs from the model's logits at the run's rollout temperature,
with no top-p, no top-k and nothing else applied; rollout importance weights are the ratio of those to the
log-probs vLLM reports. vLLM (started as verl starts it, logprobs_mode processed_logprobs) reports each
sampled token's log-prob under the distribution it actually sampled from: after the request's temperature,
top_p and top_k, and after everything else the request applies to the logits first (penalties, logit_bias,
bad_words, allowed_token_ids, min_tokens, min_p, structured output, a forced tool call). A request that
changes that distribution biases every weight without any error, so on train-mode calls the gateway owns
every request parameter that does (`spec.gateway.samplingParams`):

- `Enforce` (default): the run's temperature/top_p/top_k are sent, and neutral values of the rest: min_p 0
  and repetition_penalty 1 always (vLLM fills omitted ones from the model's generation config), the others
  removed when the agent asked for anything else; what the agent asked for is kept with the captured call
  and the call is counted;
- `Reject`: a call that asks for anything else gets 400 naming the parameter and the fix;
- `Allow`: the agent's values go through untouched (the weights are then biased; for experiments).

`OWNED_PARAMETERS` is the list, read from vLLM 0.24's ChatCompletionRequest, CompletionRequest and
SamplingParams; the parameters that pass and why are in docs/writing-an-agent.md. A null counts as omitted
for these (vLLM's own default), except for temperature/top_p/top_k, which must be the run's numbers.
Validation-mode calls are never changed. Pure: no I/O here, the proxy calls `apply_rollout_sampling`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from asyncrl.rollout_sampling import SAMPLING_KEYS, RolloutSampling, SamplingParamsPolicy

STRICT_TOOLS = "tools[*].function.strict"  # the name `asked` records strict tools under
RECORDED_VALUE_BYTES = 200  # an asked value longer than this (as JSON) is recorded as a summary
SHOWN_VALUE_CHARS = 80  # of a value quoted back in a Reject message


class SamplingRefused(ValueError):
    """A train-mode call asked for a distribution other than the run's policy (policy Reject)."""


@dataclass(frozen=True)
class SamplingOutcome:
    body: dict[str, Any]  # what is forwarded
    asked: dict[str, Any] | None  # the agent's own values, when the gateway changed any; else None


Neutral = Callable[[Any, Mapping[str, Any]], bool]  # (value, the whole request) -> leaves the policy as is


@dataclass(frozen=True)
class OwnedParameter:
    """A request parameter that changes the distribution vLLM samples from, and so its log-probs."""

    name: str
    is_neutral: Neutral
    effect: str  # what a non-neutral value does, for the Reject message
    neutral_values: str  # what may be sent instead, for the Reject message
    always_sent: float | None = None  # Enforce and Reject send this when the agent's value is neutral or gone


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _exactly(target: float) -> Neutral:
    return lambda value, _request: value is None or (_number(value) and abs(value - target) <= 1e-9)


def _empty(value: Any, _request: Mapping[str, Any]) -> bool:
    return value is None or (isinstance(value, list | dict) and not value)


def _null(value: Any, _request: Mapping[str, Any]) -> bool:
    return value is None


def _zero_biases(value: Any, _request: Mapping[str, Any]) -> bool:
    return value is None or (
        isinstance(value, dict) and all(_number(bias) and bias == 0 for bias in value.values())
    )


def _plain_text(value: Any, _request: Mapping[str, Any]) -> bool:
    return value is None or (isinstance(value, dict) and value.get("type") == "text")


def _not_forced(value: Any, _request: Mapping[str, Any]) -> bool:
    return value in (None, "auto", "none")


def _not_beam_search(value: Any, _request: Mapping[str, Any]) -> bool:
    return value is None or value is False


def _every_sample_returned(value: Any, request: Mapping[str, Any]) -> bool:
    n = request.get("n")
    return value is None or (_number(value) and value == (n if _number(n) else 1))


_STRUCTURED = "constrains the sample to a grammar (structured output)"

OWNED_PARAMETERS: tuple[OwnedParameter, ...] = (
    OwnedParameter("min_p", _exactly(0.0), "drops unlikely tokens (min-p filtering)", "0", always_sent=0.0),
    OwnedParameter(
        "repetition_penalty", _exactly(1.0), "rescales repeated tokens' logits", "1", always_sent=1.0
    ),
    OwnedParameter("frequency_penalty", _exactly(0.0), "penalises tokens by their count so far", "0"),
    OwnedParameter("presence_penalty", _exactly(0.0), "penalises tokens already generated", "0"),
    OwnedParameter("logit_bias", _zero_biases, "adds to tokens' logits", "{} or zero biases"),
    OwnedParameter("bad_words", _empty, "forbids tokens", "[]"),
    OwnedParameter("allowed_token_ids", _null, "forbids every token not listed", "null"),
    OwnedParameter(
        "min_tokens", _exactly(0.0), "forbids the stop tokens until that many were generated", "0"
    ),
    OwnedParameter("structured_outputs", _null, _STRUCTURED, "null"),
    OwnedParameter("response_format", _plain_text, _STRUCTURED, '{"type": "text"}'),
    OwnedParameter(
        "tool_choice",
        _not_forced,
        "forces a tool call: vLLM constrains the sample to the tools' JSON schema",
        '"auto" or "none"',
    ),
    OwnedParameter(
        "thinking_token_budget", _null, "forces the end of reasoning after that many tokens", "null"
    ),
    OwnedParameter("use_beam_search", _not_beam_search, "replaces sampling with beam search", "false"),
    OwnedParameter("vllm_xargs", _empty, "is read by custom logits processors", "{}"),
    # Names earlier vLLM versions applied; vLLM 0.24 ignores them, and the gateway cannot tell the version.
    OwnedParameter("guided_json", _null, _STRUCTURED, "null"),
    OwnedParameter("guided_regex", _null, _STRUCTURED, "null"),
    OwnedParameter("guided_choice", _empty, _STRUCTURED, "null"),
    OwnedParameter("guided_grammar", _null, _STRUCTURED, "null"),
    OwnedParameter("logits_processors", _empty, "changes the logits (custom logits processors)", "[]"),
    OwnedParameter(
        "best_of", _every_sample_returned, "returns the best of several samples, not a sample", "null or n"
    ),
)
_ALWAYS_SENT = {owned.name: owned.always_sent for owned in OWNED_PARAMETERS if owned.always_sent is not None}


def apply_rollout_sampling(
    body: dict[str, Any], *, policy: SamplingParamsPolicy, rollout: RolloutSampling, train: bool
) -> SamplingOutcome:
    """The request to forward under `policy`; SamplingRefused under Reject when it would change the policy."""
    if not train or policy is SamplingParamsPolicy.ALLOW:
        return SamplingOutcome(body=body, asked=None)
    wanted = rollout.as_body()
    differing = [key for key in SAMPLING_KEYS if key in body and not _same(key, body[key], wanted[key])]
    biasing = [
        owned
        for owned in OWNED_PARAMETERS
        if owned.name in body and not owned.is_neutral(body[owned.name], body)
    ]
    if policy is SamplingParamsPolicy.REJECT:
        if differing:
            key = differing[0]
            raise SamplingRefused(
                f"{key}={_shown(body[key])} differs from the run's rollout {key} ({wanted[key]!r}), and "
                f"training needs the log-probs of the run's sampling: omit {key} or send {wanted[key]!r} "
                f"{_REJECT_MODE}"
            )
        if biasing:
            owned = biasing[0]
            raise SamplingRefused(
                f"{owned.name}={_shown(body[owned.name])} {owned.effect}, {_NOT_THE_POLICY}: omit "
                f"{owned.name} or send {owned.neutral_values} {_REJECT_MODE}"
            )
        if strict := _strict_tools(body):
            index = strict[0]
            value = _shown(body["tools"][index]["function"]["strict"])
            raise SamplingRefused(
                f"tools[{index}].function.strict={value} makes vLLM constrain the tool call to its schema "
                f"under tool_choice auto, {_NOT_THE_POLICY}: omit strict (or send tool_choice none) "
                f"{_REJECT_MODE}"
            )
        return SamplingOutcome(body={**body, **wanted, **_ALWAYS_SENT}, asked=None)
    removed = {owned.name for owned in biasing}
    # Every one of `wanted` and `_ALWAYS_SENT` is set, even when the agent left it out: vLLM would fill those
    # from the model's generation config, which need not match the run's settings.
    forwarded = {key: value for key, value in body.items() if key not in removed} | wanted | _ALWAYS_SENT
    strict = _strict_tools(forwarded)  # after tool_choice: a forcing one removed is vLLM's default, auto
    if strict:
        forwarded["tools"] = [
            _without_strict(tool) if index in strict else tool
            for index, tool in enumerate(forwarded["tools"])
        ]
    if not (differing or biasing or strict):
        return SamplingOutcome(body=forwarded, asked=None)
    owned_names = (*SAMPLING_KEYS, *(owned.name for owned in OWNED_PARAMETERS))
    asked = {key: _recorded(body[key]) for key in owned_names if key in body}
    if strict:
        asked[STRICT_TOOLS] = _recorded([body["tools"][index]["function"].get("name") for index in strict])
    return SamplingOutcome(body=forwarded, asked=asked)


_NOT_THE_POLICY = "so vLLM's log-probs would not be the policy's that the trainer recomputes"
_REJECT_MODE = "(the run's spec.gateway.samplingParams is Reject; Enforce replaces or removes it instead)"


def _same(key: str, value: Any, wanted: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False  # null or a string: not the run's value (vLLM would refuse or default it)
    if key == "top_k":
        return bool((value <= 0 and wanted <= 0) or value == wanted)  # 0 and -1 both mean "off" in vLLM
    return abs(float(value) - float(wanted)) <= 1e-9


def _strict_tools(request: Mapping[str, Any]) -> list[int]:
    """Indices of the tools vLLM 0.24 constrains to their schema under tool_choice auto (explicit, or vLLM's
    default when tools are given): `function.strict` set (pydantic reads "true" or 1 as true too). With a
    tool parser, its structural tags (VLLM_ENFORCE_STRICT_TOOL_CALLING, on by default) do so."""
    tools = request.get("tools")
    if request.get("tool_choice", "auto") != "auto" or not isinstance(tools, list):
        return []
    return [
        index
        for index, tool in enumerate(tools)
        if isinstance(tool, dict)
        and isinstance(tool.get("function"), dict)
        and tool["function"].get("strict") not in (None, False)
    ]


def _without_strict(tool: dict[str, Any]) -> dict[str, Any]:
    # Removed, not false: vLLM leaves an unset strict out of the tools the chat template renders.
    return {**tool, "function": {key: value for key, value in tool["function"].items() if key != "strict"}}


def _recorded(value: Any) -> Any:
    """The agent's value as kept with the call, or a summary of it: the record is not counted by the capture
    limits, so an agent's 100,000-entry logit_bias must not be copied into every call."""
    text = json.dumps(value, default=repr)
    if len(text) <= RECORDED_VALUE_BYTES:
        return value
    if isinstance(value, dict | list):
        kind = f"{'an object' if isinstance(value, dict) else 'a list'} of {len(value)} entries"
    else:
        kind = f"a {type(value).__name__}"
    return f"<{kind}, {len(text)} bytes of JSON: not kept>"


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_VALUE_CHARS else f"{text[:SHOWN_VALUE_CHARS]}... ({len(text)} chars)"
