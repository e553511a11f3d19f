"""The reference model and tokenizer: built in code, offline, deterministic, and tiny."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import torch

from asyncrl.trainer.backends.reference import (
    ModelConfig,
    ReferenceBackend,
    build_policy_model,
    build_tokenizer,
)
from asyncrl.trainer.backends.reference.tokenizer import IM_END, stop_token_ids


def test_model_tokenizer_and_backend_build_without_any_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    attempts: list[Any] = []

    def refuse(_socket: socket.socket, address: Any) -> None:
        attempts.append(address)
        raise OSError("network access in a test that must not need it")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)

    tokenizer = build_tokenizer()
    model = build_policy_model(ModelConfig(), vocab_size=len(tokenizer))
    backend = ReferenceBackend()

    assert attempts == []
    assert model.config.vocab_size == len(tokenizer) == len(backend.tokenizer)


def test_same_seed_builds_the_same_weights_and_another_seed_does_not() -> None:
    first = build_policy_model(ModelConfig(seed=1), vocab_size=259).state_dict()
    again = build_policy_model(ModelConfig(seed=1), vocab_size=259).state_dict()
    other = build_policy_model(ModelConfig(seed=2), vocab_size=259).state_dict()

    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not all(torch.equal(first[name], other[name]) for name in first)


def test_building_the_model_leaves_the_callers_random_state_alone() -> None:
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_policy_model(ModelConfig(), vocab_size=259)
    assert torch.equal(torch.rand(3), expected)


def test_default_model_is_a_small_float32_model() -> None:
    model = build_policy_model(ModelConfig(), vocab_size=259)
    parameters = list(model.parameters())
    assert sum(parameter.numel() for parameter in parameters) < 200_000
    assert {parameter.dtype for parameter in parameters} == {torch.float32}


def test_tokenizer_gives_one_token_per_byte_and_round_trips_any_text() -> None:
    tokenizer = build_tokenizer()
    text = "héllo, wörld\n\t\x00 ✓"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == list(text.encode())
    assert tokenizer.decode(ids) == text


def test_chat_template_is_chatml_and_ends_with_the_assistant_prompt() -> None:
    tokenizer = build_tokenizer()
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.encode(str(text), add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")  # special tokens are single ids
    assert tokenizer.convert_tokens_to_ids(IM_END) in stop_token_ids(tokenizer)
