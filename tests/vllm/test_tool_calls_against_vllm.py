"""Agents' calls with `tools` through the gateway to the real vLLM 0.24 (CPU build), started as verl does.

The shared server (conftest) gets the flags verl adds from the config our Verl backend composes
(`engine_kwargs.vllm`, from spec.model.toolCallParser; `hermes` by default). Without them, vLLM answers every
call below with 400 (`"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set`,
or `tool_choice="required" requires --tool-call-parser to be set`), which is what agents got before.

The tiny model's template renders tools as Qwen2.5's does (asyncrl.testing.tiny_model). Its random weights
never write a tool call of their own, so the calls that must produce one force it: a named function or
`required` (vLLM constrains the output to the tool's schema), or, with automatic tool choice, a regex of the
hermes format (`structured_outputs`), so that the parser itself finds the call in the text. Train-mode calls
may not force anything under the default `samplingParams: Enforce` (asyncrl.gateway.sampling removes it: it
changes the distribution vLLM samples from), so those go as validation calls, which the gateway never changes,
or through a gateway started with `Allow`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.api.types.tool_call_parsers import VLLM_TOOL_CALL_PARSERS
from asyncrl.gateway_api.events import CallRecord
from asyncrl.testing.vllm_cpu import VllmServer, VllmVenv, engine_flags
from asyncrl.trainer.adapter import AdapterConfig, adapt_rollout
from asyncrl.trainer.backends.reference.tokenizer import build_tokenizer
from tests.gateway.conftest import RunningGateway
from tests.vllm.conftest import SRC, backend_engine_flags
from tests.vllm.test_gateway_against_vllm import _finished, calls_of, new_rollout, sdk_client, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Oslo", "Paris"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER]
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
# A hermes tool call, as Qwen2.5 and Qwen3 write one right after `<|im_start|>assistant\n`.
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
# The tiny model writes JSON with much whitespace inside a schema; room for it to finish.
FORCED_CALL_TOKENS = 1000


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start_gateway(vllm_server, tmp_path_factory.mktemp("gateway"), "--capture=full")
    yield running
    running.process.stop()


@pytest.fixture(scope="module")
def allowing_gateway(
    vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    """`samplingParams: Allow`: train-mode calls reach vLLM as the agent sent them, forcing included."""
    running = start_gateway(
        vllm_server, tmp_path_factory.mktemp("allowing-gateway"), "--capture=full", "--sampling-params=Allow"
    )
    yield running
    running.process.stop()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


def forced_hermes_call() -> dict[str, Any]:
    """Request fields that make the model write HERMES_CALL: a regex for the text, and the turn ends on the
    call's last tag (a stop string, kept). Ending it there, not on a stop token, keeps the template's
    re-rendering of the turn a continuation of the sampled text: after a regex, vLLM's grammar ends on the
    tokenizer's eos (`<|endoftext|>`), not on the `<|im_end|>` the template closes a turn with.

    (Not `allowed_token_ids` with the regex: vLLM 0.24's CPU build then samples a token the grammar rejects,
    answers 500 and, a few requests later, its engine dies.)"""
    pattern = "".join("\\" + char if char in "{}[]().*+?|^$\\" else char for char in HERMES_CALL)
    return {
        "structured_outputs": {"regex": pattern},
        "stop": ["</tool_call>"],
        "include_stop_str_in_output": True,
    }


def chat(
    gateway: RunningGateway, rollout_id: str, body: dict[str, Any], *, mode: str = "train"
) -> dict[str, Any]:
    with gateway.agent(rollout_id) as agent:
        agent.timeout = 300
        answer = agent.post(gateway.proxy_path(rollout_id, mode=mode), json={"model": "policy", **body})
    # Before the fix: 400 `"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser ...`
    assert answer.status_code == 200, answer.text
    reply: dict[str, Any] = answer.json()
    return reply


def assert_captured_as_answered(call: CallRecord, reply: dict[str, Any]) -> None:
    (choice,) = reply["choices"]
    assert call.response == reply  # the agent got vLLM's answer as it is
    assert call.prompt_token_ids == tuple(reply["prompt_token_ids"])
    assert call.response_token_ids == tuple(choice["token_ids"])
    assert call.response_logprobs == tuple(float(item["logprob"]) for item in choice["logprobs"]["content"])
    assert not call.aborted


def test_the_shared_server_gets_the_tool_flags_from_the_backends_verl_config(tiny_model_dir: Path) -> None:
    flags = backend_engine_flags(tiny_model_dir)
    assert flags == ["--enable_auto_tool_choice", "--tool_call_parser", "hermes"]


def test_a_call_with_tools_and_automatic_choice_is_answered_and_trained_on(
    gateway: RunningGateway, vllm_server: VllmServer, tokenizer: Any
) -> None:
    """`tools` with tool_choice left out (vLLM reads it as "auto"): vLLM renders the tools into the prompt,
    the parser finds no call in the tiny model's text, and the sample is captured and becomes a row."""
    rollout_id = new_rollout(gateway)
    reply = chat(gateway, rollout_id, {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 16, "seed": 7})
    (choice,) = reply["choices"]
    assert choice["finish_reason"] in {"stop", "length"}
    assert not choice["message"].get("tool_calls")
    (call,) = calls_of(gateway, rollout_id)
    assert_captured_as_answered(call, reply)
    assert call.request["tools"] == TOOLS  # forwarded as the agent sent them
    prompt = tokenizer.decode(call.prompt_token_ids)
    rendered_tools = prompt.split("<tools>")[-1].split("</tools>")[0]
    assert [json.loads(line) for line in rendered_tools.strip().splitlines()] == TOOLS
    rows = adapt_rollout(_finished(gateway, rollout_id), group_id="g1", config=AdapterConfig()).rows
    assert [row.prompt_token_ids for row in rows] == [call.prompt_token_ids]


@pytest.mark.parametrize("tool_choice", [NAMED, "required"], ids=["named", "required"])
def test_a_forced_tool_choice_in_a_validation_call_returns_the_parsed_call_as_the_model_wrote_it(
    gateway: RunningGateway, tokenizer: Any, tool_choice: Any
) -> None:
    rollout_id = new_rollout(gateway)
    body = {
        "messages": MESSAGES,
        "tools": TOOLS,
        "tool_choice": tool_choice,
        "max_tokens": FORCED_CALL_TOKENS,
    }
    # A validation call gets no token ids or log-probs unless it asks (nothing is trained on it).
    reply = chat(
        gateway, rollout_id, {**body, "seed": 3, "return_token_ids": True, "logprobs": True}, mode="val"
    )
    (choice,) = reply["choices"]
    calls = choice["message"]["tool_calls"]
    assert calls, choice
    assert {call["function"]["name"] for call in calls} == {"get_weather"}
    assert all(json.loads(call["function"]["arguments"])["city"] in {"Oslo", "Paris"} for call in calls)
    (captured,) = calls_of(gateway, rollout_id)
    assert_captured_as_answered(captured, reply)
    # The tokens captured are the text the model wrote: vLLM 0.24 constrains it to hermes' own format (the
    # parser's structural tag), `<tool_call>{"name": ..., "arguments": ...}</tool_call>` per call.
    text = tokenizer.decode(captured.response_token_ids, skip_special_tokens=True)
    written = [json.loads(body) for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL)]
    assert written == [
        {"name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"])}
        for call in calls
    ]


def test_automatic_choice_parses_a_hermes_call_and_a_tool_turn_continues_the_same_trajectory_row(
    allowing_gateway: RunningGateway, tokenizer: Any
) -> None:
    """The hermes parser itself turns the model's `<tool_call>` text into `tool_calls` (finish_reason
    tool_calls). The agent sends the call back with the tool's result; the template renders that call as the
    model wrote it, so the two calls are one trajectory row in which the tool's output is not trained on."""
    gateway = allowing_gateway
    rollout_id = new_rollout(gateway)
    first = chat(
        gateway,
        rollout_id,
        {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 200, "seed": 5, **forced_hermes_call()},
    )
    (choice,) = first["choices"]
    assert choice["finish_reason"] == "tool_calls"
    (tool_call,) = choice["message"]["tool_calls"]
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    conversation = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": tool_call["id"], "content": "Sunny, 21 C."},
    ]
    second = chat(gateway, rollout_id, {"messages": conversation, "tools": TOOLS, "max_tokens": 8, "seed": 6})
    assert second["choices"][0]["finish_reason"] in {"stop", "length"}

    calls = calls_of(gateway, rollout_id)
    assert len(calls) == 2
    assert tokenizer.decode(calls[0].response_token_ids) == HERMES_CALL
    assert "<tool_response>\nSunny, 21 C.\n</tool_response>" in tokenizer.decode(calls[1].prompt_token_ids)
    result = adapt_rollout(_finished(gateway, rollout_id), group_id="g1", config=AdapterConfig())
    assert result.counts.trajectory_breaks == 0
    (row,) = result.rows
    last = calls[1]
    assert row.prompt_token_ids + row.response_token_ids == last.prompt_token_ids + last.response_token_ids
    trained = [token for token, mask in zip(row.response_token_ids, row.response_mask, strict=True) if mask]
    assert trained == [token for call in calls for token in call.response_token_ids or ()]


def test_a_streamed_tool_call_reaches_the_sdk_and_the_capture(
    allowing_gateway: RunningGateway, tokenizer: Any
) -> None:
    """Streaming with automatic choice: the parser's tool-call deltas reach the agent through the gateway,
    and the capture assembled from the chunks holds the same call and the tokens the model wrote."""
    gateway = allowing_gateway
    rollout_id = new_rollout(gateway)
    stream = sdk_client(gateway, rollout_id).chat.completions.create(
        model="policy",
        messages=MESSAGES,  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[list-item]
        max_tokens=200,
        seed=5,
        stream=True,
        extra_body=forced_hermes_call(),
    )
    names, arguments, finish = "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                names += (delta.function.name or "") if delta.function else ""
                arguments += (delta.function.arguments or "") if delta.function else ""
            finish = choice.finish_reason or finish
    assert (names, json.loads(arguments), finish) == ("get_weather", {"city": "Oslo"}, "tool_calls")
    (call,) = calls_of(gateway, rollout_id)
    assert not call.aborted
    (captured,) = call.response["choices"][0]["message"]["tool_calls"]
    assert captured["function"]["name"] == "get_weather"
    assert json.loads(captured["function"]["arguments"]) == {"city": "Oslo"}
    assert tokenizer.decode(call.response_token_ids) == HERMES_CALL


# -- the literals the operator validates with are vLLM's and verl's -----------------------------------------

_PROBE = """
import json, sys, tempfile
from pathlib import Path
from asyncrl.testing.verl_server_cpu import write_vllm_distribution_alias
alias = tempfile.mkdtemp()
write_vllm_distribution_alias(Path(alias))
sys.path.insert(0, alias)
from vllm.tool_parsers import ToolParserManager
from verl.workers.rollout.vllm_rollout.utils import build_cli_args_from_config
engine_kwargs = json.loads(sys.argv[1])
print(json.dumps({
    "parsers": ToolParserManager.list_registered(),
    "flags": build_cli_args_from_config(engine_kwargs),
}))
"""


@pytest.fixture(scope="module")
def installed(vllm_venv: VllmVenv) -> dict[str, Any]:
    """vLLM's parser registry and verl's flags for two engine_kwargs, read in the vLLM venv."""
    engine_kwargs = {"enable_auto_tool_choice": True, "tool_call_parser": "hermes", "unset": None}
    completed = vllm_venv.run(["-c", _PROBE, json.dumps(engine_kwargs)], src_dir=SRC, timeout=600)
    answer: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    answer["engine_kwargs"] = engine_kwargs
    return answer


def test_the_parser_names_the_api_accepts_are_vllms_registry(installed: dict[str, Any]) -> None:
    assert list(VLLM_TOOL_CALL_PARSERS) == sorted(installed["parsers"])


def test_the_test_servers_flags_are_the_ones_verl_writes(installed: dict[str, Any]) -> None:
    assert engine_flags(installed["engine_kwargs"]) == installed["flags"]
