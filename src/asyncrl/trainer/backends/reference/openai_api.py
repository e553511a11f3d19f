"""The OpenAI wire format as vLLM speaks it: requests → sampling settings, samples → response bodies.

The gateway captures exactly these shapes (`asyncrl.gateway.capture`): `prompt_token_ids` at the top level
of a chat completion and inside each choice of a text completion (as vLLM's `CompletionResponseChoice`),
per-choice `token_ids` (all when the request sets `return_token_ids`), chat log-probs under
`logprobs.content[i].logprob` (`logprobs: true`) and completion log-probs under `logprobs.token_logprobs`
(`logprobs: k`, 0 included). Two fields are ours: `model_version`, the training step of the weights that
generated the response, at the top level (also sent as the header `x-asyncrl-model-version`).

Unknown request fields are ignored, as vLLM does; `echo` is refused with 400 rather than answered wrongly.
`stream: true` is answered as vLLM streams (`streaming.py`). Everything here is pure, so it is tested
without a server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers import PreTrainedTokenizerFast

from asyncrl.trainer.backends.reference.config import ServerConfig
from asyncrl.trainer.backends.reference.sampling import Sample, SamplingParams
from asyncrl.trainer.backends.reference.tokenizer import token_bytes

MAX_TOP_LOGPROBS = 20


class ApiError(Exception):
    """A request the server refuses; becomes an OpenAI-style error body with this HTTP status."""

    def __init__(self, status: int, message: str, *, error_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.error_type = error_type

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.error_type, "param": None, "code": self.status}
        }


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: bool = False


class _GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=16)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool = False
    ignore_eos: bool = False  # vLLM's extension: generate max_tokens even past the end tokens


RequestT = TypeVar("RequestT", bound=_GenerationRequest)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text; content parts of type `text` are joined, others are refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for part in self.content:
            if part.get("type") != "text":
                raise ApiError(400, f"content part of type {part.get('type')!r} is not supported")
            texts.append(str(part.get("text", "")))
        return "".join(texts)


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)


class CompletionRequest(_GenerationRequest):
    prompt: str | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False


@dataclass(frozen=True)
class Generation:
    """A validated request, ready to sample."""

    prompt_token_ids: list[int]
    params: SamplingParams
    n: int
    seed: int | None
    ignore_eos: bool


def parse_chat(
    body: Any, *, tokenizer: PreTrainedTokenizerFast, config: ServerConfig, max_model_len: int
) -> tuple[ChatCompletionRequest, Generation]:
    """A chat request, its messages rendered with the chat template and tokenized; ApiError if refused."""
    request = _validate(ChatCompletionRequest, body, config)
    messages = [{"role": message.role, "content": message.text()} for message in request.messages]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt = list(tokenizer.encode(str(text), add_special_tokens=False))
    top = (request.top_logprobs or 0) if request.logprobs else 0
    max_tokens = request.max_completion_tokens or request.max_tokens
    return request, _generation(request, prompt, max_tokens, top, config=config, max_model_len=max_model_len)


def parse_completion(
    body: Any, *, tokenizer: PreTrainedTokenizerFast, config: ServerConfig, max_model_len: int
) -> tuple[CompletionRequest, Generation]:
    """A completion request (prompt as text or token ids); ApiError if refused."""
    request = _validate(CompletionRequest, body, config)
    if request.echo:
        raise ApiError(400, "echo is not supported by the reference server")
    if isinstance(request.prompt, str):
        prompt = list(tokenizer.encode(request.prompt, add_special_tokens=False))
    else:
        prompt = list(request.prompt)
        if any(not 0 <= token < len(tokenizer) for token in prompt):
            raise ApiError(400, f"prompt token ids must lie in [0, {len(tokenizer)})")
    top = request.logprobs or 0
    return request, _generation(
        request, prompt, request.max_tokens, top, config=config, max_model_len=max_model_len
    )


def chat_response(
    request: ChatCompletionRequest,
    generation: Generation,
    samples: Sequence[Sample],
    *,
    tokenizer: PreTrainedTokenizerFast,
    model_name: str,
    model_version: int,
) -> dict[str, Any]:
    """vLLM's chat.completion body for `samples`, one choice each."""
    choices = []
    for index, sample in enumerate(samples):
        logprobs = None
        if request.logprobs:
            content = [
                {
                    **chat_logprob_entry(tokenizer, token, logprob),
                    "top_logprobs": _chat_alternatives(tokenizer, sample, i),
                }
                for i, (token, logprob) in enumerate(zip(sample.token_ids, sample.logprobs, strict=True))
            ]
            logprobs = {"content": content}
        choices.append(
            {
                "index": index,
                "message": {"role": "assistant", "content": sample.text, "tool_calls": []},
                "logprobs": logprobs,
                "finish_reason": sample.finish_reason,
                "stop_reason": sample.stop_reason,
                "token_ids": list(sample.token_ids) if request.return_token_ids else None,
            }
        )
    return _envelope(
        "chat.completion", "chatcmpl", request, generation, samples, choices, model_name, model_version
    )


def completion_response(
    request: CompletionRequest,
    generation: Generation,
    samples: Sequence[Sample],
    *,
    tokenizer: PreTrainedTokenizerFast,
    model_name: str,
    model_version: int,
) -> dict[str, Any]:
    """vLLM's text_completion body for `samples`, one choice each."""
    choices = []
    for index, sample in enumerate(samples):
        logprobs = None
        if request.logprobs is not None:
            tokens = [token_text(tokenizer, token) for token in sample.token_ids]
            offsets = [sum(len(text) for text in tokens[:i]) for i in range(len(tokens))]
            top = None
            if request.logprobs:
                top = [
                    {token_text(tokenizer, alt): value for alt, value in position}
                    for position in sample.top_logprobs
                ]
            logprobs = {
                "tokens": tokens,
                "token_logprobs": list(sample.logprobs),
                "top_logprobs": top,
                "text_offset": offsets,
            }
        choices.append(
            {
                "index": index,
                "text": sample.text,
                "logprobs": logprobs,
                "finish_reason": sample.finish_reason,
                "stop_reason": sample.stop_reason,
                "token_ids": list(sample.token_ids) if request.return_token_ids else None,
                "prompt_logprobs": None,
                "prompt_token_ids": generation.prompt_token_ids if request.return_token_ids else None,
            }
        )
    return _envelope(
        "text_completion", "cmpl", request, generation, samples, choices, model_name, model_version
    )


def _validate(kind: type[RequestT], body: Any, config: ServerConfig) -> RequestT:
    try:
        request = kind.model_validate(body)
    except ValidationError as error:
        raise ApiError(400, _first_error(error)) from error
    if request.model is not None and request.model != config.served_model_name:
        raise ApiError(
            404,
            f"The model `{request.model}` does not exist; this server serves `{config.served_model_name}`.",
            error_type="NotFoundError",
        )
    if request.stream_options is not None and not request.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true")
    return request


def _generation(
    request: _GenerationRequest,
    prompt: list[int],
    max_tokens: int | None,
    top_logprobs: int,
    *,
    config: ServerConfig,
    max_model_len: int,
) -> Generation:
    if not prompt:
        raise ApiError(400, "the prompt is empty")
    room = max_model_len - len(prompt)
    if max_tokens is None:
        max_tokens = min(config.default_max_tokens, room)
    if max_tokens > room:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
            f"{max_tokens} in the completion).",
        )
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        stop=tuple(s for s in stop if s),
        top_logprobs=top_logprobs,
    )
    return Generation(
        prompt_token_ids=prompt, params=params, n=request.n, seed=request.seed, ignore_eos=request.ignore_eos
    )


def _envelope(
    kind: str,
    id_prefix: str,
    request: _GenerationRequest,
    generation: Generation,
    samples: Sequence[Sample],
    choices: list[dict[str, Any]],
    model_name: str,
    model_version: int,
) -> dict[str, Any]:
    prompt_tokens = len(generation.prompt_token_ids)
    completion_tokens = sum(len(sample.token_ids) for sample in samples)
    envelope: dict[str, Any] = {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "model_version": model_version,
    }
    if kind == "chat.completion":  # a text completion carries them in each choice
        envelope.update(
            prompt_logprobs=None,
            prompt_token_ids=generation.prompt_token_ids if request.return_token_ids else None,
        )
    return envelope


def token_text(tokenizer: PreTrainedTokenizerFast, token: int) -> str:
    """A token's text as the completions log-probs name it."""
    return token_bytes(tokenizer, token).decode("utf-8", errors="replace")


def chat_logprob_entry(tokenizer: PreTrainedTokenizerFast, token: int, logprob: float) -> dict[str, Any]:
    """One entry of a chat answer's `logprobs.content` (without its `top_logprobs`)."""
    raw = token_bytes(tokenizer, token)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def _chat_alternatives(
    tokenizer: PreTrainedTokenizerFast, sample: Sample, position: int
) -> list[dict[str, Any]]:
    if not sample.top_logprobs:
        return []
    return [chat_logprob_entry(tokenizer, token, value) for token, value in sample.top_logprobs[position]]


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"])
    return f"{location}: {first['msg']}" if location else str(first["msg"])
