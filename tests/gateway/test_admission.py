"""The door's pure rules and the store's event rules, without HTTP: depth, non-finite numbers, rewards, and an
events document that nothing stored can break. Route access is `test_access.py`'s."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncrl.capturing import CaptureMode
from asyncrl.gateway.admission import Refused, find_json_problem, parse_json
from asyncrl.gateway.capture import capture_call, events_document
from asyncrl.gateway.store import (
    EventRejected,
    RolloutFinished,
    RolloutStore,
    UnknownAttempt,
)
from asyncrl.gateway_api.events import EventsDocument
from asyncrl.gateway_api.models import RolloutCreate
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.adapter import AdapterConfig, adapt_rollout


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def test_json_exactly_at_the_depth_limit_passes_and_one_level_more_is_refused_with_its_path() -> None:
    assert find_json_problem({"d": nested(3)}, max_depth=4) is None
    assert find_json_problem({"d": nested(4)}, max_depth=4) == ("too_deep", ("d", 0, 0, 0))
    assert parse_json(json.dumps({"a": [1, {"b": nested(2)}]}).encode(), max_depth=5) == {
        "a": [1, {"b": [[0]]}]
    }
    with pytest.raises(Refused) as refused:
        parse_json(json.dumps({"a": [1, {"b": nested(3)}]}).encode(), max_depth=5)
    assert refused.value.status == 422
    assert refused.value.body["field"] == "a.1.b.0.0"
    assert refused.value.body["limit"] == 5


def test_json_deeper_than_the_parser_can_go_is_a_422_not_a_recursion_error() -> None:
    with pytest.raises(Refused) as refused:
        parse_json(b"[" * 100_000, max_depth=64)
    assert refused.value.status == 422
    assert refused.value.body["setting"] == "--max-json-depth"


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_non_finite_numbers_are_refused_with_the_field_named(literal: str) -> None:
    with pytest.raises(Refused) as refused:
        parse_json(f'{{"data": {{"value": {literal}}}}}'.encode(), max_depth=64)
    assert refused.value.status == 422
    assert refused.value.body["field"] == "data.value"


def test_a_nan_inside_a_string_is_just_text_and_ordinary_bodies_pass() -> None:
    body = {"messages": [{"role": "user", "content": "NaN Infinity [[[[{{{{"}], "temperature": 0.5}
    assert parse_json(json.dumps(body).encode(), max_depth=3) == body


def test_invalid_json_and_huge_integers_are_a_400() -> None:
    with pytest.raises(Refused) as refused:
        parse_json(b'{"value": ' + b"9" * 5000 + b"}", max_depth=64)
    assert refused.value.status == 400
    assert refused.value.body["detail"] == "an integer has more than 4300 digits"


def _store_with_rollout(**limits: int) -> RolloutStore:
    store = RolloutStore(**limits)
    store.create([RolloutCreate(rollout_id="r1", group_id="g1", step=0)])
    return store


def _run(store: RolloutStore, attempt_id: str = "a1") -> None:
    rollout = store.get("r1")  # what transition() does, without the event loop its timeout needs
    rollout.state, rollout.attempt_id = RolloutState.RUNNING, attempt_id


def test_rewards_count_only_from_the_rollouts_attempt_and_only_until_it_ends() -> None:
    store = _store_with_rollout()
    store.record_event("r1", "a9", "reward", {"value": 5.0}, size=14)  # queued: attempt not known yet
    _run(store)
    assert store.get("r1").reward is None  # posted by an attempt the rollout never had
    with pytest.raises(UnknownAttempt, match="has no attempt 'a9'"):
        store.record_event("r1", "a9", "reward", {"value": 5.0}, size=14)
    store.record_event("r1", "a1", "reward", {"value": 0.5}, size=14)
    store.get("r1").state = RolloutState.SUCCEEDED
    with pytest.raises(RolloutFinished, match="already finished"):
        store.record_event("r1", "a1", "reward", {"value": 1.0}, size=14)
    assert store.get("r1").reward == 0.5
    assert len(store.get("r1").events) == 2


@pytest.mark.parametrize("value", [10**400, -(10**400), 1e308 * 10, True, "1", None])
def test_a_reward_must_be_a_finite_number(value: object) -> None:
    store = _store_with_rollout()
    with pytest.raises(EventRejected) as rejected:
        store.record_event("r1", "a1", "reward", {"value": value}, size=20)
    assert (rejected.value.status, rejected.value.field) == (422, "data.value")
    assert store.get("r1").reward is None
    assert store.get("r1").events == []


def test_event_data_per_rollout_is_bounded_in_bytes() -> None:
    store = _store_with_rollout(max_event_bytes=2048)
    store.record_event("r1", "a1", "note", {}, size=1500)
    with pytest.raises(EventRejected) as rejected:
        store.record_event("r1", "a1", "note", {}, size=600)
    assert rejected.value.status == 413
    assert "--max-event-bytes" in str(rejected.value)
    store.record_event("r1", "a1", "note", {}, size=500)
    assert len(store.get("r1").events) == 2


@pytest.mark.parametrize("mode", list(CaptureMode))
def test_the_events_document_stays_readable_whatever_was_stored(mode: CaptureMode) -> None:
    store = _store_with_rollout()
    _run(store)
    # Stored without the door's checks: what a bug or an older gateway could have let in.
    store.get("r1").events.append({"attempt_id": "a1", "event_type": "note", "data": nested(5000), "at": 1.0})
    store.get("r1").events.append({"attempt_id": "a1", "event_type": "note", "data": float("nan"), "at": 2.0})
    store.record_event("r1", "a1", "reward", {"value": 1.0}, size=14)
    odd_response = {
        "prompt_token_ids": [5],
        "choices": [{"token_ids": [1], "logprobs": {"content": [{"no": "logprob"}]}}],
    }
    store.record_call(
        "r1",
        *capture_call(
            mode=mode,
            attempt_id="a1",
            endpoint="chat/completions",
            status=200,
            latency_seconds=0.1,
            model_version=0,
            request_body=b'{"x": NaN}',
            response_body=json.dumps(odd_response).encode(),
            started_at=1.0,
        ),
    )
    store.get("r1").state = RolloutState.SUCCEEDED
    document = json.loads(events_document(store.get("r1")), parse_constant=pytest.fail)
    assert [event.get("unreadable") is not None for event in document["events"]] == [True, True, False]
    assert document["events"][2]["data"] == {"value": 1.0}
    assert document["model_calls"][0]["unreadable"]
    assert document["model_calls"][0]["request"] is None
    parsed = EventsDocument.model_validate(document)  # what the trainer's adapter reads
    assert parsed.rollout.reward == 1.0
    assert parsed.model_calls[0].response_token_ids == (1,)
    assert parsed.model_calls[0].response_logprobs is None  # the adapter drops it: no log-probs
    result = adapt_rollout(parsed, group_id="g1", config=AdapterConfig())
    assert (result.counts.dropped_calls_without_logprobs, result.rows) == (1, ())
