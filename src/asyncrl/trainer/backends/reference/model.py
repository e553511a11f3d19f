"""The reference policy: a tiny Llama-architecture causal LM, built from a config with a fixed seed.

Llama's architecture (RoPE, RMSNorm, SwiGLU, grouped-query attention) is what the open models trained on GPU
use, so the training code paths here (left padding with position ids, KV-cache generation) are the same ones
a real model takes. The weights are random at step 0; what matters in CI is that the numbers are exact and
reproducible, not that the model is any good.

Serving never reads the weights being trained: each update publishes a `ServedPolicy`, a frozen copy tagged
with its version, and a request keeps the copy it started with. No request sees half-updated weights and no
lock is held while generating; the cost is one copy of a model of about 0.1M parameters per update.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from asyncrl.trainer.backends.reference.config import ModelConfig


def build_policy_model(config: ModelConfig, *, vocab_size: int) -> LlamaForCausalLM:
    """A freshly initialised model; the same config and vocabulary give the same weights on every machine."""
    hf_config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_model_len,
        tie_word_embeddings=True,
        attention_dropout=0.0,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    hf_config._attn_implementation = "sdpa"
    with torch.random.fork_rng(devices=[]):  # seed the init without touching the caller's RNG
        torch.manual_seed(config.seed)
        model: LlamaForCausalLM = LlamaForCausalLM(hf_config)  # type: ignore[no-untyped-call]
    model.train()
    return model


@dataclass(frozen=True)
class ServedPolicy:
    """Weights being served and their version (the training step); never modified once published."""

    model: PreTrainedModel
    version: int


def freeze_for_serving(model: PreTrainedModel, *, version: int) -> ServedPolicy:
    """A copy of the training model that inference can use while the original trains on."""
    served = copy.deepcopy(model)
    served.train(False)
    served.requires_grad_(False)
    return ServedPolicy(model=served, version=version)
