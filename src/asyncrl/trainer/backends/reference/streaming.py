"""`stream: true` as vLLM streams it: the chunks of one generation, built one token at a time.

Shapes follow vLLM's OpenAI server (`ChatCompletionStreamResponse`, `CompletionStreamResponse`): a chat
stream opens with a role delta per choice carrying the prompt's token ids at the top level (null unless
`return_token_ids`), then one chunk per token with its text delta, `token_ids` and `logprobs`; a choice's last
chunk carries `finish_reason` and `stop_reason`. A completion stream has no role chunk; each chunk holds every
choice field (null when empty) and the first of a choice carries `prompt_token_ids`. A usage chunk without
choices follows when `stream_options.include_usage` asks, then `data: [DONE]`. Like our plain answers, each
chunk also carries `model_version`.

Text deltas must add up to the plain answer's text: a delta never ends inside a UTF-8 character (the
tokenizer is byte-level) nor inside a possible stop string, and the last delta is the rest of the final text.
Everything here is pure; the server feeds it tokens from the sampling thread.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerFast

from asyncrl.trainer.backends.reference.openai_api import (
    ChatCompletionRequest,
    CompletionRequest,
    Generation,
    chat_logprob_entry,
    token_text,
)
from asyncrl.trainer.backends.reference.sampling import Sample

REPLACEMENT = "\ufffd"


@dataclass
class _ChoiceState:
    tokens: list[int] = field(default_factory=list)
    emitted: str = ""  # text already sent
    offset: int = 0  # completions: text_offset of the next token (as the plain answer counts it)
    first: bool = True


@dataclass
class StreamChunks:
    """Builds the chunks of one streamed generation; one instance per request."""

    request: ChatCompletionRequest | CompletionRequest
    generation: Generation
    tokenizer: PreTrainedTokenizerFast
    model_name: str
    model_version: int
    created: int = field(default_factory=lambda: int(time.time()))
    started: set[int] = field(default_factory=set)  # choices whose opening chunks were sent
    _states: dict[int, _ChoiceState] = field(default_factory=dict)

    def __post_init__(self) -> None:
        prefix = "chatcmpl" if self.chat else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex}"

    @property
    def chat(self) -> bool:
        return isinstance(self.request, ChatCompletionRequest)

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model_name,
            "choices": choices,
            "model_version": self.model_version,
        }

    def opening(self, index: int) -> list[dict[str, Any]]:
        """The chunks sent when choice `index` starts (chat: the role delta; completions: none)."""
        if not self.chat:
            return []
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        prompt = self.generation.prompt_token_ids if self.request.return_token_ids else None
        return [{**self._envelope([choice]), "prompt_token_ids": prompt}]

    def token(
        self,
        index: int,
        token: int,
        logprob: float,
        alternatives: tuple[tuple[int, float], ...],
        *,
        final: Sample | None = None,
    ) -> dict[str, Any]:
        """The chunk of one token; `final` (the finished sample) when it is the choice's last."""
        state = self._states.setdefault(index, _ChoiceState())
        state.tokens.append(token)
        delta = self._text_delta(state, final)
        if self.chat:
            choice: dict[str, Any] = {"index": index, "delta": {"content": delta}}
            choice["logprobs"] = self._chat_logprobs(token, logprob, alternatives)
            choice["finish_reason"] = None if final is None else final.finish_reason
            if final is not None:
                choice["stop_reason"] = final.stop_reason
        else:
            choice = {
                "index": index,
                "text": delta,
                "logprobs": self._completion_logprobs(state, token, logprob),
            }
            if choice["logprobs"] is not None and self.request.logprobs:
                top = {token_text(self.tokenizer, alt): value for alt, value in alternatives}
                choice["logprobs"]["top_logprobs"] = [top]
            choice["finish_reason"] = None if final is None else final.finish_reason
            choice["stop_reason"] = None if final is None else final.stop_reason
            with_ids = self.request.return_token_ids and state.first
            choice["prompt_token_ids"] = self.generation.prompt_token_ids if with_ids else None
        choice["token_ids"] = [token] if self.request.return_token_ids else None
        state.first = False
        chunk = self._envelope([choice])
        if not self.chat:
            chunk["usage"] = None
        return chunk

    def usage(self, samples: list[Sample]) -> dict[str, Any] | None:
        """The usage chunk, when `stream_options.include_usage` asks for it."""
        options = self.request.stream_options
        if options is None or not options.include_usage:
            return None
        prompt_tokens = len(self.generation.prompt_token_ids)
        completion_tokens = sum(len(sample.token_ids) for sample in samples)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        return {**self._envelope([]), "usage": usage}

    def _text_delta(self, state: _ChoiceState, final: Sample | None) -> str:
        if final is not None:
            text = final.text
        else:
            text = str(self.tokenizer.decode(state.tokens, skip_special_tokens=True)).rstrip(REPLACEMENT)
            hold = max((len(stop) for stop in self.generation.params.stop), default=1) - 1
            text = text[: len(text) - hold] if hold else text
        if not text.startswith(state.emitted) or len(text) <= len(state.emitted):
            return ""
        delta = text[len(state.emitted) :]
        state.emitted = text
        return delta

    def _chat_logprobs(
        self, token: int, logprob: float, alternatives: tuple[tuple[int, float], ...]
    ) -> dict[str, Any] | None:
        if not isinstance(self.request, ChatCompletionRequest) or not self.request.logprobs:
            return None
        entry = chat_logprob_entry(self.tokenizer, token, logprob)
        entry["top_logprobs"] = [
            chat_logprob_entry(self.tokenizer, alt, value) for alt, value in alternatives
        ]
        return {"content": [entry]}

    def _completion_logprobs(self, state: _ChoiceState, token: int, logprob: float) -> dict[str, Any] | None:
        if not isinstance(self.request, CompletionRequest) or self.request.logprobs is None:
            return None
        text = token_text(self.tokenizer, token)
        offset, state.offset = state.offset, state.offset + len(text)
        return {"tokens": [text], "token_logprobs": [logprob], "top_logprobs": None, "text_offset": [offset]}
