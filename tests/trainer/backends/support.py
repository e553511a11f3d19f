"""Helpers shared by the reference-backend tests: rows, a served backend, HTTP calls, log-probs."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import torch

from asyncrl.trainer.backends.reference import ReferenceBackend, ReferenceBackendConfig
from asyncrl.trainer.backends.reference.batch import pad_rows
from asyncrl.trainer.backends.reference.grpo import response_log_probs
from asyncrl.trainer.rows import TrainingRow


@asynccontextmanager
async def serving(backend: ReferenceBackend) -> AsyncIterator[aiohttp.ClientSession]:
    """The backend started on a free loopback port, and an HTTP session to call it with."""
    await backend.start()
    try:
        async with aiohttp.ClientSession(base_url=backend.serve_urls[0]) as session:
            yield session
    finally:
        await backend.stop()


Answer = tuple[int, dict[str, str], Any]  # status, headers, JSON body


async def post(session: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> Answer:
    async with session.post(path, json=body) as response:
        return response.status, dict(response.headers), await response.json()


def row(
    *,
    prompt: Sequence[int],
    response: Sequence[int],
    reward: float,
    group: str = "g0",
    rollout: str = "r0",
    mask: Sequence[int] | None = None,
    log_probs: Sequence[float] | None = None,
) -> TrainingRow:
    return TrainingRow(
        rollout_id=rollout,
        group_id=group,
        prompt_token_ids=tuple(prompt),
        response_token_ids=tuple(response),
        response_mask=tuple(mask if mask is not None else [1] * len(response)),
        rollout_log_probs=tuple(log_probs if log_probs is not None else [0.0] * len(response)),
        reward=reward,
        model_version=0,
    )


def random_rows(
    *, groups: int, per_group: int, prompt_tokens: int, response_tokens: int, seed: int = 0
) -> list[TrainingRow]:
    """Groups of rows with random byte tokens and rewards that differ inside each group."""
    rng = random.Random(seed)
    rows = []
    for group in range(groups):
        prompt = [rng.randrange(256) for _ in range(rng.randint(prompt_tokens // 2, prompt_tokens))]
        for member in range(per_group):
            response = [rng.randrange(256) for _ in range(rng.randint(response_tokens // 2, response_tokens))]
            rows.append(
                row(
                    prompt=prompt,
                    response=response,
                    reward=float(member % 2),
                    group=f"g{group}",
                    rollout=f"g{group}-r{member}",
                )
            )
    return rows


def with_policy_log_probs(backend: ReferenceBackend, rows: Sequence[TrainingRow]) -> list[TrainingRow]:
    """The rows as if the backend's current policy had sampled them (rollout log-probs = its log-probs)."""
    batch = pad_rows(rows, pad_token_id=256, vocab_size=len(backend.tokenizer), max_model_len=1024)
    with torch.no_grad():
        log_probs = (response_log_probs(backend.model, batch) * batch.response_mask).tolist()
    return [
        dataclasses.replace(
            original, rollout_log_probs=tuple(log_probs[index][: len(original.response_token_ids)])
        )
        for index, original in enumerate(rows)
    ]


def small_backend(**update: Any) -> ReferenceBackend:
    return ReferenceBackend(ReferenceBackendConfig.model_validate({"update": update}))
