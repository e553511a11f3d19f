"""A tiny causal LM saved as a Hugging Face model directory, made in code: vLLM and verl load it as any.

The reference backend's architecture (Llama) and byte tokenizer, random weights from a fixed seed. Nothing is
downloaded. vLLM's CPU attention refuses small heads ("Unsupported CPU attention configuration: head_dim=16"),
so the default keeps head_dim 64 (hidden 128, 2 heads).

Its chat template is the reference tokenizer's ChatML plus the tool sections of Qwen2.5's and Hermes'
templates (`<tools>` in a system turn, `<tool_call>` in the assistant's, `<tool_response>` for a tool's
result), the format vLLM's `hermes` tool-call parser reads, so that calls with `tools` render as on the models
most agent runs train. A conversation without tools renders exactly as the reference template renders it.
"""

from __future__ import annotations

from pathlib import Path

from asyncrl.trainer.backends.reference.config import ModelConfig
from asyncrl.trainer.backends.reference.model import build_policy_model
from asyncrl.trainer.backends.reference.tokenizer import IM_END, build_tokenizer

TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\n\n' }}{%- endif %}"
    "{{- '# Tools\n\nYou may call functions, whose signatures are in <tools></tools>:\n<tools>' }}"
    "{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\n</tools>\n\nFor each call, return a JSON object with the function name and arguments within "
    '<tool_call></tool_call>:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\n</tool_call><|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if tools and loop.first and message['role'] == 'system' %}"  # already in the tools turn above
    "{%- elif message['role'] == 'assistant' and message.tool_calls %}"
    # As Qwen2.5's: a call the model wrote right after `<|im_start|>assistant\n` re-renders as it was sampled.
    "{{- '<|im_start|>assistant' + ('\n' + message['content'] if message['content'] else '') }}"
    "{%- for call in message.tool_calls %}"
    "{%- set function = call.function if call.function is defined else call %}"
    "{%- set arguments = function.arguments if function.arguments is string else "
    "function.arguments | tojson %}"
    '{{- \'\n<tool_call>\n{"name": "\' + function.name + \'", "arguments": \' + arguments '
    "+ '}\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '<|im_start|>user\n<tool_response>\n' + message['content'] + '\n</tool_response><|im_end|>\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

TINY = ModelConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256, max_model_len=32768)


def save_tiny_model(directory: Path, *, config: ModelConfig = TINY) -> Path:
    """Write config, safetensors weights, tokenizer and generation config to `directory`; return it.

    Generation stops at the end of text or at the end of a chat turn (`<|im_end|>`), as a chat model's does.
    """
    tokenizer = build_tokenizer()
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    model = build_policy_model(config, vocab_size=len(tokenizer))
    stops = [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids(IM_END)]
    model.config.eos_token_id = stops
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = stops
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def main() -> None:
    import sys

    print(save_tiny_model(Path(sys.argv[1])))


if __name__ == "__main__":
    main()
