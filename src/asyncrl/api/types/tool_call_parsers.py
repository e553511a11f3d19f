"""`spec.model.toolCallParser`: the vLLM parser that turns the tool calls the policy writes into `tool_calls`.

vLLM 0.24 answers HTTP 400 to a chat call with `tools` and automatic tool choice (`tool_choice` "auto" or left
out), and to `required` or a named function as well, unless its server was started with
`--enable-auto-tool-choice --tool-call-parser NAME`. The parser must match the format the model's chat
template teaches it (Qwen's and Hermes' `<tool_call>{json}</tool_call>`, Llama 3's bare JSON, ...); vLLM
cannot tell which from the weights, so the run names it. The default, `hermes`, is verl's own default for its
tool agent loop (`rollout.multi_turn.format`) and the format of Qwen2.5 and Qwen3, which most agent runs
train. A model that never writes `<tool_call>` loses nothing by it: its text comes back as `content`.

The names are a literal list because the API is validated without vLLM (the operator, `kubectl apply`,
`asyncrl validate`), and a misspelt parser should be refused there rather than when vLLM starts on a GPU.
`tests/vllm/` compares the list with vLLM's own registry (`ToolParserManager.list_registered()`) in the CPU
build's venv, so a vLLM upgrade that adds or drops a parser fails there.
"""

from __future__ import annotations

import difflib

DEFAULT_TOOL_CALL_PARSER = "hermes"
TOOL_CALLS_DISABLED = "Disabled"  # start vLLM without the flags: a call with tools gets its 400

# vLLM 0.24.0's registered parsers (vllm/tool_parsers/__init__.py, ToolParserManager.list_registered()).
VLLM_TOOL_CALL_PARSERS: tuple[str, ...] = (
    "apertus",
    "cohere_command3",
    "cohere_command4",
    "deepseek_v3",
    "deepseek_v31",
    "deepseek_v32",
    "deepseek_v4",
    "ernie45",
    "functiongemma",
    "gemma4",
    "gigachat3",
    "glm45",
    "glm47",
    "granite",
    "granite-20b-fc",
    "granite4",
    "hermes",
    "hunyuan_a13b",
    "hy_v3",
    "internlm",
    "jamba",
    "kimi_k2",
    "lfm2",
    "llama3_json",
    "llama4_json",
    "llama4_pythonic",
    "longcat",
    "mimo",
    "minicpm5",
    "minimax_m2",
    "minimax_m3",
    "mistral",
    "olmo3",
    "openai",
    "phi4_mini_json",
    "poolside_v1",
    "pythonic",
    "qwen3_coder",
    "qwen3_xml",
    "seed_oss",
    "step3",
    "step3p5",
    "xlam",
)
TOOL_CALL_PARSER_VALUES: tuple[str, ...] = (TOOL_CALLS_DISABLED, *VLLM_TOOL_CALL_PARSERS)


def check_tool_call_parser(value: str) -> str:
    """`value` if it is `Disabled` or one of vLLM 0.24's parsers; otherwise a ValueError with the nearest."""
    if value in TOOL_CALL_PARSER_VALUES:
        return value
    close = difflib.get_close_matches(value, TOOL_CALL_PARSER_VALUES, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(
        f"{value!r} is not one of vLLM 0.24's tool-call parsers{hint} (the names are listed in "
        f"docs/writing-an-agent.md#tools; {TOOL_CALLS_DISABLED} starts vLLM without tool parsing)"
    )


def vllm_tool_call_parser(value: str) -> str | None:
    """The name vLLM's `--tool-call-parser` gets; None when tool parsing is disabled."""
    return None if value == TOOL_CALLS_DISABLED else value
