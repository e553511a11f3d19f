"""Token-by-token sampling that reports the behaviour policy's log-prob of every token it picks.

Rollout importance sampling divides the trainer's probability of a token by the probability the token was
actually drawn with, so the log-prob returned here is exactly that: the log-prob of the sampled token under
the distribution it was sampled from.

- temperature 1, top_p 1: the model's log-softmax (what the trainer recomputes).
- other temperatures: log-softmax(logits / temperature).
- top_p < 1: that distribution restricted to the nucleus and renormalised.
- temperature 0 (greedy): 0.0, the log of probability 1.

vLLM's default differs at temperature != 1 (it reports the raw model log-probs unless configured for
processed ones); at temperature 1 and top_p 1, the setting RL rollouts use, both agree.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Literal

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling settings, already validated."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()  # strings that end the text (not included in it)
    top_logprobs: int = 0  # alternatives reported per position


@dataclass(frozen=True)
class Sample:
    """One generated continuation."""

    token_ids: tuple[int, ...]  # includes the stop token when generation ended on one
    logprobs: tuple[float, ...]  # behaviour log-prob of each token in token_ids
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]  # per position, when asked for
    text: str  # decoded without special tokens, cut before a matched stop string
    finish_reason: Literal["stop", "length"]
    stop_reason: str | None  # the stop string that ended it; None for the end token or the length limit


OnToken = Callable[[int, float, tuple[tuple[int, float], ...]], None]


def generate(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    *,
    prompt_token_ids: list[int],
    params: SamplingParams,
    stop_token_ids: Collection[int],
    generator: torch.Generator,
    on_token: OnToken | None = None,
) -> Sample:
    """Sample up to `params.max_tokens` tokens after the prompt, with a KV cache.

    `on_token(token, logprob, alternatives)` is called as each token is drawn (streaming); an exception it
    raises stops the generation and propagates.
    """
    tokens: list[int] = []
    logprobs: list[float] = []
    alternatives: list[tuple[tuple[int, float], ...]] = []
    with torch.inference_mode():
        output = model(input_ids=torch.tensor([prompt_token_ids]), use_cache=True)
        for _ in range(params.max_tokens):
            log_dist = behaviour_log_probs(output.logits[0, -1], params)
            token = _draw(log_dist, params, generator)
            tokens.append(token)
            logprobs.append(0.0 if params.temperature == 0 else float(log_dist[token]))
            if params.top_logprobs:
                top = torch.topk(log_dist, params.top_logprobs)
                alternatives.append(tuple(zip(top.indices.tolist(), top.values.tolist(), strict=True)))
            if on_token is not None:
                on_token(token, logprobs[-1], alternatives[-1] if params.top_logprobs else ())
            if token in stop_token_ids:
                return _finish(tokenizer, tokens, logprobs, alternatives, "stop", None)
            if params.stop:
                text = str(tokenizer.decode(tokens, skip_special_tokens=True))
                for stop in params.stop:
                    if stop in text:
                        return _finish(tokenizer, tokens, logprobs, alternatives, "stop", stop)
            output = model(
                input_ids=torch.tensor([[token]]), past_key_values=output.past_key_values, use_cache=True
            )
    return _finish(tokenizer, tokens, logprobs, alternatives, "length", None)


def behaviour_log_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Log-probs of the distribution tokens are drawn from (greedy: the untempered log-softmax)."""
    logits = logits.float()
    if params.temperature > 0:
        logits = logits / params.temperature
    log_dist = torch.log_softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_log_dist, order = torch.sort(log_dist, descending=True)
        sorted_probs = sorted_log_dist.exp()
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        outside = order[mass_before >= params.top_p]  # the most likely token is always kept
        log_dist = log_dist.clone()
        log_dist[outside] = float("-inf")
        log_dist = torch.log_softmax(log_dist, dim=-1)
    return log_dist


def _draw(log_dist: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    if params.temperature == 0:
        return int(torch.argmax(log_dist))
    return int(torch.multinomial(log_dist.exp(), num_samples=1, generator=generator))


def _finish(
    tokenizer: PreTrainedTokenizerFast,
    tokens: list[int],
    logprobs: list[float],
    alternatives: list[tuple[tuple[int, float], ...]],
    finish_reason: Literal["stop", "length"],
    stop_reason: str | None,
) -> Sample:
    text = str(tokenizer.decode(tokens, skip_special_tokens=True))
    if stop_reason is not None:
        text = text[: text.index(stop_reason)]
    return Sample(
        token_ids=tuple(tokens),
        logprobs=tuple(logprobs),
        top_logprobs=tuple(alternatives),
        text=text,
        finish_reason=finish_reason,
        stop_reason=stop_reason,
    )
