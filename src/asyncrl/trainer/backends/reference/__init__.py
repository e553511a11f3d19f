"""The CPU reference backend: a tiny local causal LM, served over OpenAI-style HTTP, trained by verl's GRPO.

Needs the `trainer` extra (torch, transformers, verl). It downloads nothing: the model is built from a
config with a fixed seed and the tokenizer is built in code.
"""

from __future__ import annotations

from asyncrl.trainer.backends.reference.backend import ReferenceBackend
from asyncrl.trainer.backends.reference.config import (
    ModelConfig,
    ReferenceBackendConfig,
    ServerConfig,
    UpdateConfig,
)
from asyncrl.trainer.backends.reference.model import ServedPolicy, build_policy_model
from asyncrl.trainer.backends.reference.server import MODEL_VERSION_HEADER, InferenceServer
from asyncrl.trainer.backends.reference.tokenizer import build_tokenizer

__all__ = [
    "MODEL_VERSION_HEADER",
    "InferenceServer",
    "ModelConfig",
    "ReferenceBackend",
    "ReferenceBackendConfig",
    "ServedPolicy",
    "ServerConfig",
    "UpdateConfig",
    "build_policy_model",
    "build_tokenizer",
]
