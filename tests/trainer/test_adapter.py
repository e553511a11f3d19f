"""The events → training rows adapter on hand-written rollouts: one behaviour per test."""

from __future__ import annotations

import json
import math
from types import EllipsisType
from typing import Any

import pytest
from pydantic import ValidationError

from asyncrl.capturing import CaptureMode
from asyncrl.gateway.capture import capture_call, events_document
from asyncrl.gateway.store import RolloutStore
from asyncrl.gateway_api.events import EventsDocument
from asyncrl.gateway_api.models import RolloutCreate
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.adapter import (
    AdapterConfig,
    AdapterCounts,
    AdapterResult,
    SampleLevel,
    adapt_rollout,
    group_rewards,
    rollout_reward,
)

TRAJECTORY = AdapterConfig()
TRANSITION = AdapterConfig(sample_level=SampleLevel.TRANSITION)


def call(
    prompt: list[int] | None,
    response: list[int] | None,
    *,
    started_at: float,
    logprobs: list[float] | EllipsisType | None = ...,
    status: int = 200,
    version: int | None = 1,
    attempt_id: str = "a1",
) -> dict[str, Any]:
    """One model call as an events document's `CallRecord`; log-probs default to -0.5 per response token."""
    if logprobs is ...:
        logprobs = None if response is None else [-0.5] * len(response)
    return {
        "attempt_id": attempt_id,
        "endpoint": "chat/completions",
        "status": status,
        "latency_seconds": 0.1,
        "model_version": version,
        "started_at": started_at,
        "request": None,
        "response": None,
        "prompt_token_ids": prompt,
        "response_token_ids": response,
        "response_logprobs": logprobs,
    }


def document(
    *calls: dict[str, Any],
    state: str = "succeeded",
    reward: float | None = 1.0,
    rollout_id: str = "r1",
    group_id: str = "g1",
    attempt_id: str | None = None,
    mode: str = "train",
) -> dict[str, Any]:
    """An events document as `GET /api/rollouts/{rollout_id}/events` returns it."""
    return {
        "rollout": {
            "rollout_id": rollout_id,
            "group_id": group_id,
            "step": 0,
            "input": {"question": "?"},
            "mode": mode,
            "state": state,
            "attempt_id": attempt_id,
            "timeout_seconds": None,
            "created_at": 0.0,
            "started_at": 1.0,
            "finished_at": 2.0,
            "reward": reward,
            "message": None,
            "n_model_calls": len(calls),
        },
        "model_calls": list(calls),
        "events": [],
    }


def adapt(doc: dict[str, Any], config: AdapterConfig = TRAJECTORY, group_id: str = "g1") -> AdapterResult:
    return adapt_rollout(doc, group_id=group_id, config=config)


# -- trajectory level -------------------------------------------------------------------------------------


def test_tool_output_between_calls_is_context_with_mask_zero() -> None:
    doc = document(
        call([1, 2], [3, 4], started_at=1.0, logprobs=[-0.1, -0.2]),
        call([1, 2, 3, 4, 50, 51], [5], started_at=2.0, logprobs=[-0.3]),
    )
    (row,) = adapt(doc).rows
    assert row.prompt_token_ids == (1, 2)
    assert row.response_token_ids == (3, 4, 50, 51, 5)
    assert row.response_mask == (1, 1, 0, 0, 1)
    assert row.rollout_log_probs == (-0.1, -0.2, 0.0, 0.0, -0.3)


def test_next_prompt_equal_to_the_previous_sequence_merges_without_context_tokens() -> None:
    doc = document(call([1], [2], started_at=1.0), call([1, 2], [3], started_at=2.0))
    (row,) = adapt(doc).rows
    assert row.response_token_ids == (2, 3)
    assert row.response_mask == (1, 1)


def test_call_whose_prompt_does_not_extend_the_previous_starts_a_new_row() -> None:
    doc = document(
        call([1, 2], [3], started_at=1.0),
        call([1, 2, 9, 50], [4], started_at=2.0),  # rewrote the history: 9 where the model said 3
    )
    result = adapt(doc)
    assert [row.prompt_token_ids for row in result.rows] == [(1, 2), (1, 2, 9, 50)]
    assert [row.response_token_ids for row in result.rows] == [(3,), (4,)]
    assert result.counts.trajectory_breaks == 1
    assert result.counts.rows == 2


def test_interleaved_conversations_each_merge_into_their_own_row() -> None:
    doc = document(
        call([100, 1], [2], started_at=1.0),  # planner
        call([200, 1], [7], started_at=2.0),  # sub-agent
        call([100, 1, 2, 3], [4], started_at=3.0),  # planner continues
        call([200, 1, 7, 8], [9], started_at=4.0),  # sub-agent continues
    )
    result = adapt(doc)
    assert [(row.prompt_token_ids, row.response_token_ids) for row in result.rows] == [
        ((100, 1), (2, 3, 4)),
        ((200, 1), (7, 8, 9)),
    ]
    assert result.counts.trajectory_breaks == 1  # the sub-agent's first call


def test_calls_are_ordered_by_started_at() -> None:
    doc = document(call([1, 2, 3, 9], [4], started_at=5.0), call([1, 2], [3], started_at=1.0))
    (row,) = adapt(doc).rows
    assert row.prompt_token_ids == (1, 2)
    assert row.response_token_ids == (3, 9, 4)


def test_merged_row_takes_the_oldest_model_version() -> None:
    doc = document(call([1], [2], started_at=1.0, version=4), call([1, 2], [3], started_at=2.0, version=3))
    (row,) = adapt(doc).rows
    assert row.model_version == 3


def test_merged_row_with_a_call_of_unknown_version_has_unknown_version() -> None:
    doc = document(call([1], [2], started_at=1.0, version=4), call([1, 2], [3], started_at=2.0, version=None))
    (row,) = adapt(doc).rows
    assert row.model_version is None


def test_dropped_call_in_a_conversation_becomes_context_of_the_next() -> None:
    doc = document(
        call([1], [2], started_at=1.0),
        call([1, 2, 3], [4, 5], started_at=2.0, logprobs=None),
        call([1, 2, 3, 4, 5, 6], [7], started_at=3.0),
    )
    result = adapt(doc)
    (row,) = result.rows
    assert row.response_token_ids == (2, 3, 4, 5, 6, 7)
    assert row.response_mask == (1, 0, 0, 0, 0, 1)
    assert result.counts.dropped_calls_without_logprobs == 1
    assert result.counts.trajectory_breaks == 0


# -- transition level -------------------------------------------------------------------------------------


def test_transition_level_makes_one_row_per_call_with_the_calls_version() -> None:
    doc = document(
        call([1], [2], started_at=1.0, version=1, logprobs=[-1.0]),
        call([1, 2, 3], [4, 5], started_at=2.0, version=2, logprobs=[-2.0, -3.0]),
    )
    result = adapt(doc, TRANSITION)
    assert [(row.prompt_token_ids, row.response_token_ids) for row in result.rows] == [
        ((1,), (2,)),
        ((1, 2, 3), (4, 5)),
    ]
    assert [row.response_mask for row in result.rows] == [(1,), (1, 1)]
    assert [row.rollout_log_probs for row in result.rows] == [(-1.0,), (-2.0, -3.0)]
    assert [row.model_version for row in result.rows] == [1, 2]
    assert [row.reward for row in result.rows] == [1.0, 1.0]
    assert result.counts.trajectory_breaks == 0


def test_call_with_an_empty_response_makes_no_row_and_is_counted() -> None:
    result = adapt(document(call([1], [], started_at=1.0)), TRANSITION)
    assert result.rows == ()
    assert result.counts.dropped_rows_without_trained_tokens == 1
    assert result.counts.rollouts_without_rows == 1


# -- which calls count ------------------------------------------------------------------------------------


def test_failed_calls_are_dropped_and_counted() -> None:
    doc = document(call([1], [2], started_at=1.0, status=500), call([1], [3], started_at=2.0))
    result = adapt(doc)
    assert [row.response_token_ids for row in result.rows] == [(3,)]
    assert result.counts.dropped_calls_failed == 1
    assert result.counts.calls == 2


def test_calls_without_token_ids_are_dropped_and_counted() -> None:
    doc = document(
        call(None, None, started_at=1.0), call([1], None, started_at=2.0), call([1], [2], started_at=3.0)
    )
    result = adapt(doc)
    assert len(result.rows) == 1
    assert result.counts.dropped_calls_without_tokens == 2


@pytest.mark.parametrize(
    "logprobs",
    [None, [-0.1], [-0.1, -0.2, -0.3], [-0.1, math.nan], [-0.1, -math.inf]],
    ids=["missing", "too-few", "too-many", "nan", "minus-infinity"],
)
def test_calls_without_usable_logprobs_are_dropped_and_counted(logprobs: list[float] | None) -> None:
    result = adapt(document(call([1], [2, 3], started_at=1.0, logprobs=logprobs)))
    assert result.rows == ()
    assert result.counts.dropped_calls_without_logprobs == 1


def test_calls_of_an_earlier_attempt_are_dropped_and_counted() -> None:
    doc = document(
        call([1], [2], started_at=1.0, attempt_id="a1"),
        call([1], [3], started_at=2.0, attempt_id="a2"),
        attempt_id="a2",
    )
    result = adapt(doc)
    assert [row.response_token_ids for row in result.rows] == [(3,)]
    assert result.counts.dropped_calls_other_attempt == 1


def test_all_attempts_count_when_the_rollout_names_none() -> None:
    doc = document(
        call([1], [2], started_at=1.0, attempt_id="a1"), call([1], [3], started_at=2.0, attempt_id="a2")
    )
    assert len(adapt(doc).rows) == 2


# -- limits -----------------------------------------------------------------------------------------------


def test_long_response_is_truncated_and_counted() -> None:
    config = AdapterConfig(sample_level=SampleLevel.TRANSITION, max_response_tokens=2)
    result = adapt(document(call([1], [2, 3, 4], started_at=1.0, logprobs=[-1.0, -2.0, -3.0])), config)
    (row,) = result.rows
    assert row.response_token_ids == (2, 3)
    assert row.rollout_log_probs == (-1.0, -2.0)
    assert row.truncated
    assert result.counts.truncated_rows == 1


def test_long_prompt_drops_the_row_and_counts_it() -> None:
    config = AdapterConfig(sample_level=SampleLevel.TRANSITION, max_prompt_tokens=2)
    doc = document(call([1, 2, 3], [4], started_at=1.0), call([1, 2], [5], started_at=2.0))
    result = adapt(doc, config)
    assert [row.prompt_token_ids for row in result.rows] == [(1, 2)]
    assert result.counts.dropped_long_prompt == 1


def test_merged_response_is_truncated_at_the_limit_and_not_split() -> None:
    config = AdapterConfig(max_response_tokens=4)
    doc = document(call([1], [2, 3], started_at=1.0), call([1, 2, 3, 9], [4, 5], started_at=2.0))
    result = adapt(doc, config)
    (row,) = result.rows
    assert row.response_token_ids == (2, 3, 9, 4)
    assert row.response_mask == (1, 1, 0, 1)
    assert row.truncated
    assert result.counts.rows == 1


def test_row_whose_truncated_response_has_no_trained_token_is_dropped() -> None:
    config = AdapterConfig(max_response_tokens=2)
    doc = document(call([1], [], started_at=1.0), call([1, 8, 9, 10], [4], started_at=2.0))
    result = adapt(doc, config)
    assert result.rows == ()
    assert result.counts.dropped_rows_without_trained_tokens == 1
    assert result.counts.truncated_rows == 0


def test_model_version_ignores_calls_cut_off_by_truncation() -> None:
    config = AdapterConfig(max_response_tokens=1)
    doc = document(call([1], [2], started_at=1.0, version=5), call([1, 2], [3], started_at=2.0, version=2))
    (row,) = adapt(doc, config).rows
    assert row.model_version == 5


# -- rewards and groups -----------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["failed", "timed_out", "cancelled"])
def test_failed_rollout_gets_the_fill_reward_and_stays_in_its_group(state: str) -> None:
    config = AdapterConfig(failed_rollout_reward=-1.0)
    failed = adapt(
        document(call([1], [2], started_at=1.0), state=state, reward=None, rollout_id="r2"), config
    )
    succeeded = adapt(document(call([1], [3], started_at=1.0), reward=1.0, rollout_id="r1"), config)
    assert [row.reward for row in failed.rows] == [-1.0]
    assert failed.counts.rollouts_failed == 1
    assert group_rewards([succeeded, failed], rollout_ids=["r1", "r2"]) == {"r1": 1.0, "r2": -1.0}


def test_failed_rollout_without_calls_produces_no_rows_but_keeps_its_reward_in_the_group() -> None:
    config = AdapterConfig(failed_rollout_reward=-1.0)
    failed = adapt(document(state="timed_out", reward=None, rollout_id="r2"), config)
    succeeded = adapt(document(call([1], [3], started_at=1.0), rollout_id="r1"), config)
    assert failed.rows == ()
    assert failed.reward == -1.0
    assert failed.counts.rollouts_without_rows == 1
    assert group_rewards([failed, succeeded], rollout_ids=["r1", "r2"]) == {"r1": 1.0, "r2": -1.0}


def test_reward_posted_by_a_failed_rollout_is_ignored() -> None:
    result = adapt(document(call([1], [2], started_at=1.0), state="failed", reward=0.9))
    assert result.reward == 0.0
    assert [row.reward for row in result.rows] == [0.0]


def test_succeeded_rollout_without_reward_gets_the_fill_reward_by_default() -> None:
    result = adapt(
        document(call([1], [2], started_at=1.0), reward=None), AdapterConfig(failed_rollout_reward=-0.5)
    )
    assert result.reward == -0.5
    assert result.counts.rollouts_missing_reward == 1
    assert result.counts.rollouts_failed == 0


def test_succeeded_rollout_without_reward_gets_missing_reward_when_set() -> None:
    config = AdapterConfig(failed_rollout_reward=-1.0, missing_reward=0.0)
    assert adapt(document(call([1], [2], started_at=1.0), reward=None), config).reward == 0.0
    assert adapt(document(state="failed"), config).reward == -1.0


def test_rollout_reward_needs_a_terminal_state() -> None:
    with pytest.raises(ValueError, match="no final reward"):
        rollout_reward(state=RolloutState.RUNNING, reward=1.0, config=TRAJECTORY)


def test_group_rewards_follow_the_member_order_and_reject_a_missing_or_foreign_member() -> None:
    r1 = adapt(document(rollout_id="r1", reward=0.25))
    r2 = adapt(document(rollout_id="r2", reward=0.75))
    assert list(group_rewards([r1, r2], rollout_ids=["r2", "r1"]).items()) == [("r2", 0.75), ("r1", 0.25)]
    assert group_rewards([r1, r2]) == {"r1": 0.25, "r2": 0.75}
    with pytest.raises(ValueError, match=r"missing for \['r3'\]"):
        group_rewards([r1, r2], rollout_ids=["r1", "r2", "r3"])
    with pytest.raises(ValueError, match=r"not members: \['r2'\]"):
        group_rewards([r1, r2], rollout_ids=["r1"])


def test_group_rewards_reject_duplicates_and_mixed_groups() -> None:
    r1 = adapt(document(rollout_id="r1"))
    other = adapt(document(rollout_id="r2", group_id="g2"), group_id="g2")
    with pytest.raises(ValueError, match="twice"):
        group_rewards([r1, r1])
    with pytest.raises(ValueError, match="several groups"):
        group_rewards([r1, other])


# -- input checks -----------------------------------------------------------------------------------------


def test_non_terminal_rollout_is_rejected() -> None:
    with pytest.raises(ValueError, match="not terminal"):
        adapt(document(state="running"))


def test_validation_rollout_is_rejected() -> None:
    with pytest.raises(ValueError, match="val rollout"):
        adapt(document(mode="val"))


def test_document_of_another_group_is_rejected() -> None:
    with pytest.raises(ValueError, match="belongs to group g1"):
        adapt(document(), group_id="g9")


def test_malformed_document_is_rejected() -> None:
    with pytest.raises(ValidationError):
        adapt({"rollout": {"rollout_id": "r1", "state": "succeeded"}, "model_calls": [{"status": 200}]})


def test_config_rejects_a_non_finite_reward_and_unknown_fields() -> None:
    with pytest.raises(ValidationError):
        AdapterConfig(failed_rollout_reward=math.nan)
    with pytest.raises(ValidationError):
        AdapterConfig.model_validate({"levle": "transition"})


@pytest.mark.parametrize("mode", list(CaptureMode))
def test_document_written_by_the_gateway_route_is_adapted(mode: CaptureMode) -> None:
    """The real producers: `capture_call` on a vLLM-style response, `events_document` from the store."""
    response = {
        "prompt_token_ids": [11, 12],
        "choices": [
            {
                "token_ids": [13, 14],
                "logprobs": {"content": [{"token": "a", "logprob": -0.25}, {"token": "b", "logprob": -0.5}]},
            }
        ],
    }
    store = RolloutStore()
    store.create([RolloutCreate(rollout_id="r1", group_id="g1", step=0)])
    rollout = store.get("r1")
    rollout.state, rollout.attempt_id = RolloutState.RUNNING, "a1"
    store.record_event("r1", "a1", "reward", {"value": 0.5}, size=14)
    store.record_call(
        "r1",
        *capture_call(
            mode=mode,
            attempt_id="a1",
            endpoint="chat/completions",
            status=200,
            latency_seconds=0.2,
            model_version=3,
            request_body=b'{"messages": []}',
            response_body=json.dumps(response).encode(),
            started_at=10.0,
        ),
    )
    rollout.state = RolloutState.SUCCEEDED
    doc = json.loads(events_document(rollout))
    result = adapt(doc)
    (row,) = result.rows
    assert (row.prompt_token_ids, row.response_token_ids) == ((11, 12), (13, 14))
    assert row.rollout_log_probs == (-0.25, -0.5)
    assert (row.reward, row.model_version, row.rollout_id, row.group_id) == (0.5, 3, "r1", "g1")
    assert adapt_rollout(EventsDocument.model_validate(doc), group_id="g1", config=TRAJECTORY) == result
    assert (doc["model_calls"][0]["response"] is not None) is (mode is CaptureMode.FULL)


# -- counts -----------------------------------------------------------------------------------------------


def test_counts_add_up_across_rollouts() -> None:
    first = adapt(document(call([1], [2], started_at=1.0), call([9], [3], started_at=2.0)))
    second = adapt(document(call(None, None, started_at=1.0), state="failed", rollout_id="r2"))
    total = first.counts + second.counts
    assert total == AdapterCounts.total([first.counts, second.counts])
    assert (total.rollouts, total.rows, total.calls, total.trajectory_breaks) == (2, 2, 3, 1)
    assert (total.rollouts_failed, total.rollouts_without_rows, total.dropped_calls_without_tokens) == (
        1,
        1,
        1,
    )
    assert total.trained_tokens == 2
    assert AdapterCounts.total([]) == AdapterCounts()
    assert total.metrics()["training/adapter/trajectory_breaks"] == 1.0
