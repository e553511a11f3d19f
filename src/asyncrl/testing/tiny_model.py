"""A tiny causal LM saved as a Hugging Face model directory, made in code: vLLM and verl load it as any.

The reference backend's architecture (Llama) and byte tokenizer with its ChatML template, random weights from
a fixed seed. Nothing is downloaded. vLLM's CPU attention refuses small heads ("Unsupported CPU attention
configuration: head_dim=16"), so the default keeps head_dim 64 (hidden 128, 2 heads).
"""

from __future__ import annotations

from pathlib import Path

from asyncrl.trainer.backends.reference.config import ModelConfig
from asyncrl.trainer.backends.reference.model import build_policy_model
from asyncrl.trainer.backends.reference.tokenizer import IM_END, build_tokenizer

TINY = ModelConfig(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=256, max_model_len=32768)


def save_tiny_model(directory: Path, *, config: ModelConfig = TINY) -> Path:
    """Write config, safetensors weights, tokenizer and generation config to `directory`; return it.

    Generation stops at the end of text or at the end of a chat turn (`<|im_end|>`), as a chat model's does.
    """
    tokenizer = build_tokenizer()
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
