"""GRPO updates of the reference backend: new weights served, loss falling, weights capped, learning."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import time
from typing import Any

import pytest
import torch
from verl.trainer.ppo import core_algos

from asyncrl.trainer.backends.reference import MODEL_VERSION_HEADER, ReferenceBackend
from asyncrl.trainer.rows import TrainingRow
from tests.trainer.backends.support import (
    post,
    random_rows,
    row,
    serving,
    small_backend,
    with_policy_log_probs,
)

SAMPLE = {"prompt": "Q: 1+1=", "max_tokens": 12, "seed": 11, "logprobs": 0, "return_token_ids": True}


def rows_from_completions(answers: list[dict[str, Any]]) -> list[TrainingRow]:
    """One group per answer, one row per choice; reward: the share of ASCII bytes in the response."""
    rows = []
    for group, answer in enumerate(answers):
        for choice in answer["choices"]:
            tokens = choice["token_ids"]
            rows.append(
                row(
                    prompt=choice["prompt_token_ids"],
                    response=tokens,
                    log_probs=choice["logprobs"]["token_logprobs"],
                    reward=sum(token < 128 for token in tokens) / len(tokens),
                    group=f"g{group}",
                    rollout=f"g{group}-{choice['index']}",
                )
            )
    return rows


def test_an_update_on_served_samples_bumps_the_version_and_the_server_serves_the_new_weights() -> None:
    backend = ReferenceBackend()

    async def scenario() -> tuple[Any, ...]:
        async with serving(backend) as session:
            _, before_headers, before = await post(session, "/v1/completions", SAMPLE)
            answers = [
                (await post(session, "/v1/completions", {**SAMPLE, "n": 4, "seed": group}))[2]
                for group in range(4)
            ]
            metrics = await backend.update(rows_from_completions(answers), step=0)
            _, after_headers, after = await post(session, "/v1/completions", SAMPLE)
            return before_headers, before, metrics, after_headers, after

    before_headers, before, metrics, after_headers, after = asyncio.run(scenario())

    assert (before["model_version"], before_headers[MODEL_VERSION_HEADER]) == (0, "0")
    assert (after["model_version"], after_headers[MODEL_VERSION_HEADER]) == (1, "1")
    assert backend.model_version == metrics.model_version == 1
    same_seed_tokens = before["choices"][0]["token_ids"] == after["choices"][0]["token_ids"]
    before_logprobs = before["choices"][0]["logprobs"]["token_logprobs"]
    after_logprobs = after["choices"][0]["logprobs"]["token_logprobs"]
    assert not same_seed_tokens or before_logprobs != pytest.approx(after_logprobs, abs=1e-6)
    assert metrics.rows == 16
    assert metrics.importance_weight_max == pytest.approx(1.0, abs=1e-3)  # the samples are on-policy
    assert metrics.grad_norm > 0
    assert metrics.tokens_per_second > 0


def test_a_request_in_flight_during_an_update_is_answered_wholly_by_the_old_weights() -> None:
    backend = small_backend()
    old_policy = backend.server.policy
    long_request = {"prompt": "tell me a story", "max_tokens": 400, "seed": 3, "logprobs": 0}
    long_request |= {"return_token_ids": True, "ignore_eos": True}
    rows = with_policy_log_probs(
        backend, random_rows(groups=2, per_group=4, prompt_tokens=8, response_tokens=8)
    )

    async def scenario() -> tuple[Any, Any]:
        async with serving(backend) as session:
            in_flight = asyncio.create_task(post(session, "/v1/completions", long_request))
            await asyncio.sleep(0.05)  # the request is generating now
            await backend.update(rows, step=0)
            assert not in_flight.done()  # the update finished while the request was still generating
            _, _, during = await in_flight
            _, _, after = await post(session, "/v1/completions", long_request)
            return during, after

    during, after = asyncio.run(scenario())

    assert (during["model_version"], after["model_version"]) == (0, 1)
    assert len(during["choices"][0]["token_ids"]) == 400
    prompt, response = during["choices"][0]["prompt_token_ids"], during["choices"][0]["token_ids"]
    with torch.no_grad():
        logits = old_policy.model(input_ids=torch.tensor([prompt + response])).logits[0]
    expected = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1].gather(
        -1, torch.tensor(response)[:, None]
    )
    assert during["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
        expected[:, 0].tolist(), abs=1e-4
    )


def test_loss_falls_over_updates_on_a_fixed_batch() -> None:
    backend = small_backend()
    rows = with_policy_log_probs(
        backend, random_rows(groups=4, per_group=4, prompt_tokens=40, response_tokens=40)
    )
    losses = [backend.update_blocking(rows, step=step).loss for step in range(5)]
    assert all(later < earlier for earlier, later in itertools.pairwise(losses)), losses


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_importance_weights_the_loss_uses_are_capped_at_the_threshold(
    level: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[torch.Tensor] = []
    verl_loss = core_algos.get_policy_loss_fn("vanilla")

    def recording_loss(**kwargs: Any) -> Any:
        seen.append(kwargs["rollout_is_weights"])
        return verl_loss(**kwargs)

    monkeypatch.setattr(core_algos, "get_policy_loss_fn", lambda name: recording_loss)
    backend = small_backend(rollout_is=level, rollout_is_threshold=2.0)
    rows = random_rows(groups=2, per_group=4, prompt_tokens=10, response_tokens=10)
    # The behaviour policy (log-prob -30) is far less likely than the current one: raw weights are huge.
    stale = [
        dataclasses.replace(original, rollout_log_probs=(-30.0,) * len(original.response_token_ids))
        for original in rows
    ]

    metrics = backend.update_blocking(stale, step=0)

    [weights] = seen
    trained = weights[weights > 0]
    assert float(trained.max()) == pytest.approx(2.0)
    assert bool((weights <= 2.0 + 1e-6).all())
    assert metrics.importance_weight_max == pytest.approx(2.0)
    assert metrics.extra["rollout_corr/rollout_is_ratio_fraction_high"] > 0


def test_without_rollout_correction_the_loss_gets_no_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []
    verl_loss = core_algos.get_policy_loss_fn("vanilla")

    def recording_loss(**kwargs: Any) -> Any:
        seen.append(kwargs["rollout_is_weights"])
        return verl_loss(**kwargs)

    monkeypatch.setattr(core_algos, "get_policy_loss_fn", lambda name: recording_loss)
    metrics = small_backend(rollout_is=None).update_blocking(
        random_rows(groups=2, per_group=2, prompt_tokens=8, response_tokens=8), step=0
    )
    assert seen == [None]
    assert metrics.importance_weight_max is None


def test_rejection_masks_tokens_whose_ratio_is_out_of_bounds_out_of_the_loss() -> None:
    backend = small_backend(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    rows = random_rows(groups=2, per_group=2, prompt_tokens=8, response_tokens=8)
    # Every token's ratio to a behaviour log-prob of -30 is far above 2: all are masked, nothing is trained.
    stale = [
        dataclasses.replace(original, rollout_log_probs=(-30.0,) * len(original.response_token_ids))
        for original in rows
    ]
    metrics = backend.update_blocking(stale, step=0)
    assert metrics.extra["rollout_corr/rollout_rs_masked_fraction"] == 1.0
    assert metrics.importance_weight_max is None  # no trained token left to report a weight of


def test_rejection_without_bounds_is_refused() -> None:
    with pytest.raises(ValueError, match="rollout_rs_threshold"):
        small_backend(rollout_rs="token_k1")


def test_several_epochs_and_mini_batches_take_several_steps_and_clip() -> None:
    backend = small_backend(ppo_epochs=3, mini_batches=2, learning_rate=1e-2)
    rows = with_policy_log_probs(
        backend, random_rows(groups=4, per_group=4, prompt_tokens=20, response_tokens=20)
    )
    metrics = backend.update_blocking(rows, step=0)
    assert metrics.clip_fraction > 0  # later passes move the ratio past 1 +- 0.2
    assert metrics.ppo_kl != 0


def test_update_metrics_count_rows_tokens_and_rewards() -> None:
    backend = small_backend()
    rows = [
        row(prompt=[1, 2], response=[3, 4, 5], mask=[1, 0, 1], reward=1.0, group="a"),
        row(prompt=[1, 2], response=[6], reward=0.0, group="a"),
    ]
    metrics = backend.update_blocking(rows, step=4)
    assert (metrics.step, metrics.model_version, backend.model_version) == (4, 5, 5)
    assert (metrics.rows, metrics.trained_tokens, metrics.total_tokens) == (2, 3, 8)
    assert (metrics.reward_mean, metrics.reward_std) == (0.5, 0.5)
    assert metrics.as_dict()["actor/pg_loss"] == metrics.loss
    assert "rollout_corr/kl" in metrics.as_dict()


def test_rewarding_a_token_raises_its_probability() -> None:
    backend = small_backend()
    target, prompt = ord("A"), list(b"Say A: ")
    rng = random.Random(0)

    def served_probability() -> float:
        with torch.no_grad():
            logits = backend.server.policy.model(input_ids=torch.tensor([prompt])).logits[0, -1]
        return float(torch.softmax(logits, dim=-1)[target])

    before = served_probability()
    for step in range(30):
        groups = []
        for group in range(4):
            others = rng.sample([token for token in range(256) if token != target], 7)
            groups += [
                row(prompt=prompt, response=[token], reward=float(token == target), group=f"{step}-{group}")
                for token in [target, *others]
            ]
        backend.update_blocking(with_policy_log_probs(backend, groups), step=step)
    after = served_probability()

    assert after > 10 * before, (before, after)


def test_an_update_of_32_rows_of_100_tokens_takes_well_under_two_seconds() -> None:
    backend = small_backend()
    rows = with_policy_log_probs(
        backend, random_rows(groups=8, per_group=4, prompt_tokens=60, response_tokens=80)
    )
    backend.update_blocking(rows, step=0)  # warm-up
    started = time.perf_counter()
    backend.update_blocking(rows, step=1)
    assert time.perf_counter() - started < 2.0
