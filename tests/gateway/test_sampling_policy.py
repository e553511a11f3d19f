"""The sampling policy as a rule: every request parameter that changes the distribution vLLM samples from.

vLLM 0.24 reports processed log-probs: those of the distribution after everything the request applies to the
logits. The trainer recomputes the policy's own, at the run's temperature with nothing else applied, so on
train-mode calls each such parameter is replaced or removed (Enforce) or refused (Reject), and its neutral
values pass. The tables here are written out from vLLM 0.24's ChatCompletionRequest, CompletionRequest and
SamplingParams, not imported from the code under test, so a parameter the policy forgets fails here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.gateway.sampling import SamplingRefused, apply_rollout_sampling
from asyncrl.rollout_sampling import RolloutSampling, SamplingParamsPolicy

RUN = RolloutSampling(temperature=0.9, top_p=1.0, top_k=-1)
ENFORCE, REJECT, ALLOW = SamplingParamsPolicy.ENFORCE, SamplingParamsPolicy.REJECT, SamplingParamsPolicy.ALLOW
MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
STRICT_TOOL = {"type": "function", "function": {**TOOL["function"], "strict": True}}
# What Enforce always sends, as for temperature: vLLM fills these two from the model's generation config when
# a request leaves them out (Qwen's sets repetition_penalty 1.05).
ALWAYS_SENT = {"temperature": 0.9, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}

# (parameter, a value that changes the distribution)
BIASING: list[tuple[str, Any]] = [
    ("frequency_penalty", 0.5),
    ("presence_penalty", -1.0),
    ("repetition_penalty", 1.3),
    ("min_p", 0.1),
    ("logit_bias", {"65": 5.0}),
    ("bad_words", ["blue"]),
    ("allowed_token_ids", [65, 66]),
    ("allowed_token_ids", []),  # vLLM refuses an empty list; removed under Enforce all the same
    ("min_tokens", 4),
    ("structured_outputs", {"choice": ["red", "blue"]}),
    ("structured_outputs", {}),  # vLLM refuses one with no constraint
    ("response_format", {"type": "json_object"}),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}),
    ("response_format", {"type": "structural_tag", "structures": [], "triggers": []}),
    ("tool_choice", "required"),
    ("tool_choice", {"type": "function", "function": {"name": "lookup"}}),
    ("thinking_token_budget", 16),
    ("thinking_token_budget", 0),
    ("use_beam_search", True),
    ("vllm_xargs", {"my_processor_arg": 1}),  # read by custom logits processors only
    # Names earlier vLLM versions applied (vLLM 0.24 ignores them; the gateway cannot tell the version).
    ("guided_json", {"type": "object"}),
    ("guided_regex", "[a-z]+"),
    ("guided_choice", ["red", "blue"]),
    ("guided_grammar", 'root ::= "a"'),
    ("logits_processors", ["my.Processor"]),
    ("best_of", 4),
]

# (parameter, a value that leaves the distribution as it is): passes in Reject, is no override in Enforce.
NEUTRAL: list[tuple[str, Any]] = [
    ("frequency_penalty", 0),
    ("frequency_penalty", 0.0),
    ("frequency_penalty", None),
    ("presence_penalty", 0),
    ("repetition_penalty", 1),
    ("repetition_penalty", 1.0),
    ("repetition_penalty", None),
    ("min_p", 0),
    ("min_p", 0.0),
    ("min_p", None),
    ("logit_bias", {}),
    ("logit_bias", None),
    ("logit_bias", {"65": 0, "66": 0.0}),
    ("bad_words", []),
    ("bad_words", None),
    ("allowed_token_ids", None),
    ("min_tokens", 0),
    ("min_tokens", None),
    ("structured_outputs", None),
    ("response_format", {"type": "text"}),
    ("response_format", None),
    ("tool_choice", "auto"),
    ("tool_choice", "none"),
    ("tool_choice", None),
    ("thinking_token_budget", None),
    ("use_beam_search", False),
    ("vllm_xargs", {}),
    ("vllm_xargs", None),
    ("guided_json", None),
    ("logits_processors", []),
    ("best_of", 1),
    ("best_of", None),
]

# Parameters that do not change the per-token distribution: never touched, in any mode. `stop`, `ignore_eos`
# and the token limits end (or do not end) a sample but leave every sampled token's log-prob the policy's.
PASSING: dict[str, Any] = {
    "seed": 7,
    "n": 2,
    "max_tokens": 5,
    "max_completion_tokens": 5,
    "stop": ["\n"],
    "stop_token_ids": [2],
    "include_stop_str_in_output": True,
    "ignore_eos": True,
    "top_logprobs": 3,
    "prompt_logprobs": 1,
    "skip_special_tokens": False,
    "echo": True,
    "length_penalty": 2.0,  # beam search only
    "repetition_detection": {"max_pattern_size": 4, "min_count": 3},
    "reasoning_effort": "low",
    "chat_template_kwargs": {"enable_thinking": False},
    "tools": [TOOL],
    "parallel_tool_calls": False,
    "guided_decoding_backend": "xgrammar",  # picks a backend; constrains nothing by itself
    "user": "u1",
    "priority": 0,
    "stream": True,
}


def enforce(body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    outcome = apply_rollout_sampling(body, policy=ENFORCE, rollout=RUN, train=True)
    return outcome.body, outcome.asked


def reject(body: dict[str, Any]) -> dict[str, Any]:
    return apply_rollout_sampling(body, policy=REJECT, rollout=RUN, train=True).body


@pytest.mark.parametrize(("name", "value"), BIASING)
def test_a_parameter_that_changes_the_distribution_is_refused_under_reject_naming_it_and_the_fix(
    name: str, value: Any
) -> None:
    with pytest.raises(SamplingRefused) as refused:
        reject({"messages": MESSAGES, "tools": [TOOL], name: value})
    message = str(refused.value)
    assert message.startswith(f"{name}=")
    assert "omit" in message
    assert "spec.gateway.samplingParams is Reject" in message


@pytest.mark.parametrize(("name", "value"), BIASING)
def test_a_parameter_that_changes_the_distribution_is_neutralised_under_enforce_and_recorded(
    name: str, value: Any
) -> None:
    body = {"messages": MESSAGES, "tools": [TOOL], name: value}
    forwarded, asked = enforce(body)
    assert forwarded.get(name) == ALWAYS_SENT.get(name)  # the neutral value, or gone
    assert forwarded["tools"] == [TOOL]
    assert asked == {name: value}
    assert body[name] == value  # the agent's request is not changed in place
    reject(forwarded)  # what Enforce forwards is what Reject lets through


@pytest.mark.parametrize(("name", "value"), NEUTRAL)
def test_a_neutral_value_passes_under_reject_and_is_no_override_under_enforce(name: str, value: Any) -> None:
    body = {"messages": MESSAGES, "tools": [TOOL], name: value}
    assert reject(body) == {**body, **ALWAYS_SENT, **({} if value is None else {name: value})}
    forwarded, asked = enforce(body)
    assert asked is None
    assert forwarded[name] == (ALWAYS_SENT.get(name, value) if value is None else value)


@pytest.mark.parametrize("policy", list(SamplingParamsPolicy))
def test_parameters_that_do_not_change_the_distribution_pass_untouched(policy: SamplingParamsPolicy) -> None:
    body = {"messages": MESSAGES, **PASSING}
    outcome = apply_rollout_sampling(body, policy=policy, rollout=RUN, train=True)
    assert {key: outcome.body[key] for key in PASSING} == PASSING
    assert outcome.asked is None


def test_min_p_and_repetition_penalty_are_always_sent_as_vllm_fills_omitted_ones_itself() -> None:
    assert enforce({"messages": MESSAGES}) == ({"messages": MESSAGES, **ALWAYS_SENT}, None)
    assert reject({"messages": MESSAGES}) == {"messages": MESSAGES, **ALWAYS_SENT}


@pytest.mark.parametrize(("name", "value"), BIASING[:6])
def test_allow_and_validation_calls_forward_every_parameter_untouched(name: str, value: Any) -> None:
    body = {"messages": MESSAGES, name: value}
    allowed = apply_rollout_sampling(body, policy=ALLOW, rollout=RUN, train=True)
    validation = apply_rollout_sampling(body, policy=REJECT, rollout=RUN, train=False)
    assert allowed.body == validation.body == body
    assert allowed.asked is validation.asked is None


def test_enforce_records_every_owned_parameter_the_agent_sent_when_one_was_changed() -> None:
    body = {"messages": MESSAGES, "temperature": 0.7, "frequency_penalty": 0, "logit_bias": {"65": -100}}
    forwarded, asked = enforce(body)
    assert asked == {"temperature": 0.7, "frequency_penalty": 0, "logit_bias": {"65": -100}}
    assert forwarded == {"messages": MESSAGES, "frequency_penalty": 0, **ALWAYS_SENT}


# -- tool calling --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("tool_choice", ["auto", None, "absent"])
def test_a_strict_tool_under_auto_is_refused_under_reject(tool_choice: str | None) -> None:
    """vLLM 0.24 constrains a strict tool's call to its schema under tool_choice auto (its structural tags,
    VLLM_ENFORCE_STRICT_TOOL_CALLING on by default) whenever the server has a tool parser."""
    body: dict[str, Any] = {"messages": MESSAGES, "tools": [TOOL, STRICT_TOOL]}
    if tool_choice != "absent":
        body["tool_choice"] = tool_choice
    if tool_choice is None:  # vLLM builds no structural tag for a null tool_choice
        assert reject(body)["tools"] == [TOOL, STRICT_TOOL]
        return
    with pytest.raises(SamplingRefused, match=r"^tools\[1\]\.function\.strict=True .*omit"):
        reject(body)


def test_enforce_drops_strict_from_tools_and_a_forcing_tool_choice_and_records_both() -> None:
    body = {"messages": MESSAGES, "tools": [TOOL, STRICT_TOOL], "tool_choice": "required"}
    forwarded, asked = enforce(body)
    assert "tool_choice" not in forwarded  # vLLM's default with tools: auto
    assert forwarded["tools"] == [TOOL, TOOL]
    assert asked == {"tool_choice": "required", "tools[*].function.strict": ["lookup"]}
    assert body["tools"][1] == STRICT_TOOL  # not changed in place
    reject(forwarded)


def test_strict_tools_are_neutral_when_tool_choice_is_none() -> None:
    body = {"messages": MESSAGES, "tools": [STRICT_TOOL], "tool_choice": "none"}
    assert reject(body)["tools"] == [STRICT_TOOL]
    assert enforce(body) == ({**body, **ALWAYS_SENT}, None)


@pytest.mark.parametrize("strict", [False, None])
def test_a_tool_that_is_not_strict_passes(strict: bool | None) -> None:
    tool = {"type": "function", "function": {**TOOL["function"], "strict": strict}}
    body = {"messages": MESSAGES, "tools": [tool], "tool_choice": "auto"}
    assert reject(body)["tools"] == [tool]


# -- odd values ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("repetition_penalty", "1.0"),  # a string: vLLM would parse it, but it is not a neutral number
        ("repetition_penalty", True),  # True == 1 in Python
        ("frequency_penalty", False),  # False == 0 in Python
        ("min_p", float("nan")),
        ("min_p", [0]),
        ("logit_bias", {"65": "5"}),
        ("logit_bias", {"65": True}),
        ("logit_bias", [[65, 5.0]]),
        ("logit_bias", "65:5"),
        ("min_tokens", {"value": 0}),
        ("tool_choice", "REQUIRED"),
        ("tool_choice", {"type": "function"}),
        ("response_format", {"type": "json_object", "nested": {"deep": [1, {"x": None}]}}),
        ("response_format", {}),
        ("use_beam_search", "false"),
        ("best_of", 1.5),
    ],
)
def test_a_value_that_is_not_plainly_neutral_is_refused_and_removed(name: str, value: Any) -> None:
    with pytest.raises(SamplingRefused, match=f"^{name}="):
        reject({"messages": MESSAGES, name: value})
    forwarded, asked = enforce({"messages": MESSAGES, name: value})
    assert forwarded.get(name) == ALWAYS_SENT.get(name)
    assert asked is not None
    assert name in asked


def test_best_of_equal_to_n_returns_every_sample_and_passes() -> None:
    assert reject({"prompt": "a", "n": 3, "best_of": 3})["best_of"] == 3
    with pytest.raises(SamplingRefused, match="best_of=3"):
        reject({"prompt": "a", "n": 2, "best_of": 3})


def test_a_huge_logit_bias_is_removed_and_recorded_in_a_few_bytes() -> None:
    """What Enforce records stays with the captured call (not counted by the capture limits), and a Reject
    message goes back to the agent: neither may carry the agent's whole map."""
    huge = {str(token): -100.0 for token in range(100_000)}
    forwarded, asked = enforce({"messages": MESSAGES, "logit_bias": huge})
    assert "logit_bias" not in forwarded
    assert asked is not None
    assert len(json.dumps(asked)) < 200
    assert "100000 entries" in str(asked["logit_bias"])
    with pytest.raises(SamplingRefused) as refused:
        reject({"messages": MESSAGES, "logit_bias": huge})
    assert len(str(refused.value)) < 1_000
    assert len(huge) == 100_000  # untouched


# -- properties ----------------------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)
_owned_names = sorted({name for name, _ in BIASING} | {"temperature", "top_p", "top_k"})
_bodies = st.dictionaries(
    st.sampled_from([*_owned_names, "tools", "seed", "stop", "ignore_eos"]), _json, max_size=6
).map(lambda body: {"messages": MESSAGES, **body})


@settings(max_examples=300, deadline=None)
@given(body=_bodies)
def test_enforce_forwards_what_reject_accepts_and_is_a_fixed_point(body: dict[str, Any]) -> None:
    forwarded, _ = enforce(body)
    assert reject(forwarded) == forwarded
    assert enforce(forwarded) == (forwarded, None)
    assert all(forwarded[key] is body[key] for key in body if key not in _owned_names and key != "tools")


@settings(max_examples=300, deadline=None)
@given(body=_bodies)
def test_reject_either_refuses_or_forwards_the_body_with_only_the_runs_values_added(
    body: dict[str, Any],
) -> None:
    try:
        forwarded = reject(body)
    except SamplingRefused:
        return
    assert {key: value for key, value in forwarded.items() if key not in ALWAYS_SENT} == {
        key: value for key, value in body.items() if key not in ALWAYS_SENT
    }
