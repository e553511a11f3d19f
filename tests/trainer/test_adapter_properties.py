"""Invariants of the events → rows adapter on random conversations and random junk.

A conversation is built the way an agent builds one: each next prompt is the previous prompt + the previous
response + some inserted tokens (tool output, the next user turn). The adapter must recover exactly that
structure; on arbitrary call lists it must still never break a limit and account for every call and row.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.trainer.adapter import AdapterConfig, AdapterCounts, SampleLevel, adapt_rollout

TOKENS = st.lists(st.integers(0, 50), max_size=8)
LOG_PROB = st.floats(-20.0, 0.0, allow_nan=False)
UNLIMITED = AdapterConfig(max_prompt_tokens=10_000, max_response_tokens=10_000)


@dataclass(frozen=True)
class Turn:
    response: list[int]
    log_probs: list[float]
    inserted_before: list[int]  # tokens between the previous sequence and this turn's prompt's end
    version: int


@dataclass(frozen=True)
class Conversation:
    first_prompt: list[int]
    turns: list[Turn]

    def calls(self, *, start: float = 0.0, spacing: float = 1.0) -> list[dict[str, Any]]:
        """The model calls of this conversation, in order, as `parse_call` writes them."""
        calls = []
        sequence = list(self.first_prompt)
        for index, turn in enumerate(self.turns):
            sequence += turn.inserted_before
            calls.append(
                {
                    "attempt_id": "a1",
                    "status": 200,
                    "model_version": turn.version,
                    "started_at": start + index * spacing,
                    "prompt_token_ids": list(sequence),
                    "response_token_ids": turn.response,
                    "response_logprobs": turn.log_probs,
                }
            )
            sequence += turn.response
        return calls


@st.composite
def turns(draw: st.DrawFn, *, first: bool) -> Turn:
    response = draw(st.lists(st.integers(0, 50), min_size=1, max_size=8))
    return Turn(
        response=response,
        log_probs=draw(st.lists(LOG_PROB, min_size=len(response), max_size=len(response))),
        inserted_before=[] if first else draw(TOKENS),
        version=draw(st.integers(0, 5)),
    )


@st.composite
def conversations(draw: st.DrawFn, *, opening_token: int | None = None) -> Conversation:
    """A multi-turn conversation; with `opening_token`, its first prompt starts with that token."""
    prompt = draw(TOKENS)
    if opening_token is not None:
        prompt = [opening_token, *prompt]
    n_turns = draw(st.integers(1, 6))
    return Conversation(
        first_prompt=prompt,
        turns=[draw(turns(first=index == 0)) for index in range(n_turns)],
    )


def document(
    calls: list[dict[str, Any]], *, state: str = "succeeded", reward: float | None = 1.0
) -> dict[str, Any]:
    return {
        "rollout": {
            "rollout_id": "r1",
            "group_id": "g1",
            "step": 0,
            "input": None,
            "mode": "train",
            "state": state,
            "attempt_id": None,
            "timeout_seconds": None,
            "created_at": 0.0,
            "started_at": 1.0,
            "finished_at": 2.0,
            "reward": reward,
            "message": None,
            "n_model_calls": len(calls),
        },
        "model_calls": calls,
    }


def shuffled(calls: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The same calls in another list order: `started_at`, not list position, orders them."""
    copy = list(calls)
    random.Random(seed).shuffle(copy)
    return copy


@settings(max_examples=200, deadline=None)
@given(conversation=conversations(), seed=st.integers(0, 2**16))
def test_trajectory_level_recovers_one_row_of_responses_and_inserted_context(
    conversation: Conversation, seed: int
) -> None:
    calls = shuffled(conversation.calls(), seed)
    result = adapt_rollout(document(calls), group_id="g1", config=UNLIMITED)

    (row,) = result.rows
    trained = [token for token, mask in zip(row.response_token_ids, row.response_mask, strict=True) if mask]
    context = [
        token for token, mask in zip(row.response_token_ids, row.response_mask, strict=True) if not mask
    ]
    assert row.prompt_token_ids == tuple(conversation.first_prompt)
    assert trained == [token for turn in conversation.turns for token in turn.response]
    assert context == [token for turn in conversation.turns for token in turn.inserted_before]
    assert [lp for lp, mask in zip(row.rollout_log_probs, row.response_mask, strict=True) if mask] == [
        lp for turn in conversation.turns for lp in turn.log_probs
    ]
    assert all(
        lp == 0.0 for lp, mask in zip(row.rollout_log_probs, row.response_mask, strict=True) if not mask
    )
    assert row.model_version == min(turn.version for turn in conversation.turns)
    assert not row.truncated
    assert result.counts.trajectory_breaks == 0


@settings(max_examples=200, deadline=None)
@given(conversation=conversations(), seed=st.integers(0, 2**16))
def test_transition_level_makes_one_row_per_call(conversation: Conversation, seed: int) -> None:
    calls = conversation.calls()
    config = UNLIMITED.model_copy(update={"sample_level": SampleLevel.TRANSITION})
    result = adapt_rollout(document(shuffled(calls, seed)), group_id="g1", config=config)

    assert len(result.rows) == len(calls)
    for row, call in zip(result.rows, calls, strict=True):
        assert row.prompt_token_ids == tuple(call["prompt_token_ids"])
        assert row.response_token_ids == tuple(call["response_token_ids"])
        assert row.rollout_log_probs == tuple(call["response_logprobs"])
        assert set(row.response_mask) == {1}
        assert row.model_version == call["model_version"]


@settings(max_examples=100, deadline=None)
@given(data=st.data(), n_conversations=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_interleaved_conversations_yield_one_row_each(
    data: st.DataObject, n_conversations: int, seed: int
) -> None:
    # A distinct opening token per conversation keeps any one from extending another.
    parts = [data.draw(conversations(opening_token=1000 + index)) for index in range(n_conversations)]
    queues = [part.calls() for part in parts]
    rng = random.Random(seed)
    interleaved: list[dict[str, Any]] = []
    while any(queues):
        queue = rng.choice([queue for queue in queues if queue])
        interleaved.append(dict(queue.pop(0), started_at=float(len(interleaved))))

    result = adapt_rollout(document(interleaved), group_id="g1", config=UNLIMITED)

    assert sorted(row.prompt_token_ids for row in result.rows) == sorted(tuple(p.first_prompt) for p in parts)
    assert result.counts.trajectory_breaks == n_conversations - 1


@st.composite
def arbitrary_calls(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Calls of any shape the gateway may record: failures, missing fields, unrelated prompts, repeats."""
    calls: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 8))):
        response = draw(st.none() | TOKENS)
        n = 0 if response is None else len(response)
        log_probs = draw(st.one_of(st.none(), st.lists(LOG_PROB, min_size=n, max_size=n), st.lists(LOG_PROB)))
        continues_previous = draw(st.booleans())
        if calls and continues_previous:  # the previous call's conversation goes on
            previous = calls[-1]
            prompt = (
                (previous["prompt_token_ids"] or []) + (previous["response_token_ids"] or []) + draw(TOKENS)
            )
        else:
            prompt = draw(st.none() | TOKENS)
        calls.append(
            {
                "attempt_id": draw(st.sampled_from(["a1", "a2"])),
                "status": draw(st.sampled_from([200, 200, 200, 429, 500])),
                "model_version": draw(st.none() | st.integers(0, 5)),
                "started_at": draw(st.floats(0, 10)),
                "prompt_token_ids": prompt,
                "response_token_ids": response,
                "response_logprobs": log_probs,
            }
        )
    return calls


@settings(max_examples=200, deadline=None)
@given(
    calls=arbitrary_calls(),
    level=st.sampled_from(SampleLevel),
    max_prompt_tokens=st.integers(1, 20),
    max_response_tokens=st.integers(1, 20),
    state=st.sampled_from(["succeeded", "failed", "timed_out", "cancelled"]),
    reward=st.none() | st.floats(-1, 1),
    final_attempt=st.none() | st.just("a2"),
)
def test_rows_always_align_respect_limits_and_every_call_is_accounted_for(
    calls: list[dict[str, Any]],
    level: SampleLevel,
    max_prompt_tokens: int,
    max_response_tokens: int,
    state: str,
    reward: float | None,
    final_attempt: str | None,
) -> None:
    config = AdapterConfig(
        sample_level=level,
        max_prompt_tokens=max_prompt_tokens,
        max_response_tokens=max_response_tokens,
        failed_rollout_reward=-1.0,
    )
    doc = document(calls, state=state, reward=reward)
    doc["rollout"]["attempt_id"] = final_attempt
    result = adapt_rollout(doc, group_id="g1", config=config)
    counts = result.counts

    for row in result.rows:
        assert len(row.response_token_ids) == len(row.response_mask) == len(row.rollout_log_probs)
        assert len(row.prompt_token_ids) <= max_prompt_tokens
        assert len(row.response_token_ids) <= max_response_tokens
        assert 1 in row.response_mask
        assert row.reward == result.reward
    expected_reward = reward if state == "succeeded" and reward is not None else -1.0
    assert result.reward == expected_reward

    dropped_calls = (
        counts.dropped_calls_failed
        + counts.dropped_calls_without_tokens
        + counts.dropped_calls_without_logprobs
        + counts.dropped_calls_other_attempt
    )
    used_calls = counts.calls - dropped_calls
    candidate_rows = counts.rows + counts.dropped_long_prompt + counts.dropped_rows_without_trained_tokens
    assert counts.calls == len(calls)
    assert counts.rows == len(result.rows)
    assert counts.truncated_rows == sum(row.truncated for row in result.rows)
    assert counts.trained_tokens == sum(sum(row.response_mask) for row in result.rows)
    assert counts.rollouts_without_rows == (not result.rows)
    if level is SampleLevel.TRANSITION:
        assert candidate_rows == used_calls
        assert counts.trajectory_breaks == 0
    else:
        assert candidate_rows == (counts.trajectory_breaks + 1 if used_calls else 0)


count_values = st.integers(0, 100)
adapter_counts = st.builds(AdapterCounts, **{f.name: count_values for f in fields(AdapterCounts)})


@given(a=adapter_counts, b=adapter_counts, c=adapter_counts)
def test_counts_add_like_numbers(a: AdapterCounts, b: AdapterCounts, c: AdapterCounts) -> None:
    assert a + b == b + a
    assert (a + b) + c == a + (b + c) == AdapterCounts.total([a, b, c])
    assert a + AdapterCounts() == a
