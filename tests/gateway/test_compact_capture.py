"""Compact capture: the trainer's rows are exactly what they were with the JSON bodies kept, and the capture
limits refuse clearly without losing anything else.

Rows: the same calls adapted from a Compact document, a Full document, and a document built the way the
gateway built it before compact capture (the upstream's JSON fields copied as they were) must be equal,
including awkward values (ids past 2**31, log-probs that are not short decimals, a clamped -9999). Limits:
real gateway processes on 127.0.0.1 with small limits, attacked by agents over HTTP.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.capturing import CaptureMode
from asyncrl.gateway.capture import capture_call, events_document
from asyncrl.gateway.store import CALL_OVERHEAD_BYTES, RolloutStore
from asyncrl.gateway_api.events import EventsDocument
from asyncrl.gateway_api.models import RolloutCreate
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.adapter import AdapterConfig, SampleLevel, adapt_rollout
from tests.gateway.conftest import RunningGateway, create_rollouts, launch_gateway

UNLIMITED = AdapterConfig(max_prompt_tokens=100_000, max_response_tokens=100_000)
CHAT = {"messages": [{"role": "user", "content": "two words"}]}

# -- rows are the same ---------------------------------------------------------------------------------------

token_ids = st.lists(st.integers(0, 2**40), min_size=1, max_size=12)
log_probs = st.floats(min_value=-9999.0, max_value=0.0, allow_nan=False)


@st.composite
def conversations(draw: st.DrawFn) -> list[tuple[list[int], list[int], list[float]]]:
    """Calls of one agent: each prompt extends the previous prompt + response, or starts over."""
    calls = []
    history: list[int] = []
    for _ in range(draw(st.integers(1, 5))):
        prompt = history + draw(token_ids) if history and draw(st.booleans()) else draw(token_ids)
        response = draw(token_ids)
        calls.append((prompt, response, [draw(log_probs) for _ in response]))
        history = prompt + response
    return calls


def vllm_chat_answer(prompt: list[int], response: list[int], logprobs: list[float]) -> dict[str, Any]:
    content = [{"token": "t", "logprob": value, "bytes": [116], "top_logprobs": []} for value in logprobs]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "prompt_token_ids": prompt,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "t " * len(response)},
             "logprobs": {"content": content}, "token_ids": response, "finish_reason": "stop"}
        ],
    }  # fmt: skip


def stored(mode: CaptureMode, answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The events document a gateway in `mode` writes after these answers, as the trainer receives it."""
    store = RolloutStore()
    store.create([RolloutCreate(rollout_id="r1", group_id="g1", step=0)])
    rollout = store.get("r1")
    rollout.state, rollout.attempt_id = RolloutState.RUNNING, "a1"
    store.record_event("r1", "a1", "reward", {"value": 1.0}, size=14)
    for index, answer in enumerate(answers):
        (call,) = capture_call(
            mode=mode,
            attempt_id="a1",
            endpoint="chat/completions",
            status=200,
            latency_seconds=0.1,
            model_version=index,
            started_at=float(index),
            request_body=json.dumps({"messages": [], "return_token_ids": True}).encode(),
            response_body=json.dumps(answer).encode(),
        )
        assert store.record_call("r1", call) is None
    rollout.state = RolloutState.SUCCEEDED
    document: dict[str, Any] = json.loads(events_document(rollout))
    return document


def as_before(document: dict[str, Any], answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The document as the gateway wrote it before compact capture: the answer's JSON fields as they were."""
    calls = []
    for call, answer in zip(document["model_calls"], answers, strict=True):
        choice = answer["choices"][0]
        calls.append(
            {**call, "request": None, "response": answer, "prompt_token_ids": answer["prompt_token_ids"],
             "response_token_ids": choice["token_ids"],
             "response_logprobs": [float(item["logprob"]) for item in choice["logprobs"]["content"]]}
        )  # fmt: skip
    return {**document, "model_calls": calls}


@settings(max_examples=100, deadline=None)
@given(calls=conversations(), level=st.sampled_from(list(SampleLevel)))
def test_compact_full_and_the_old_document_give_byte_identical_rows(
    calls: list[tuple[list[int], list[int], list[float]]], level: SampleLevel
) -> None:
    answers = [vllm_chat_answer(*call) for call in calls]
    config = UNLIMITED.model_copy(update={"sample_level": level})
    compact, full = stored(CaptureMode.COMPACT, answers), stored(CaptureMode.FULL, answers)
    results = [
        adapt_rollout(document, group_id="g1", config=config)
        for document in (compact, full, as_before(compact, answers))
    ]
    assert results[0] == results[1] == results[2]
    assert repr(results[0].rows) == repr(results[2].rows)  # the same values, bit for bit (floats included)
    assert results[0].counts.rows >= 1
    assert compact["model_calls"][0]["response"] is None
    assert full["model_calls"][0]["response"] is not None


def test_awkward_but_valid_values_come_back_exactly() -> None:
    prompt, response = [0, 2**31 - 1, 2**31, 2**40], [7, 2**63 - 1]
    logprobs = [-0.30000000000000004, -9999.0]
    (call,) = stored(CaptureMode.COMPACT, [vllm_chat_answer(prompt, response, logprobs)])["model_calls"]
    assert (call["prompt_token_ids"], call["response_token_ids"]) == (prompt, response)
    assert call["response_logprobs"] == logprobs
    assert all(math.copysign(1, value) == -1 for value in call["response_logprobs"])


def test_a_non_finite_log_prob_is_sent_as_none_and_the_call_is_dropped_not_the_document() -> None:
    answer = vllm_chat_answer([1, 2], [3], [-0.5])
    answer["choices"][0]["logprobs"]["content"][0]["logprob"] = "-inf"  # float("-inf"): not finite
    document = stored(CaptureMode.COMPACT, [answer])
    assert document["model_calls"][0]["response_logprobs"] is None
    result = adapt_rollout(EventsDocument.model_validate(document), group_id="g1", config=UNLIMITED)
    assert (result.counts.dropped_calls_without_logprobs, result.rows) == (1, ())


def test_the_same_calls_through_compact_and_full_gateways_give_the_same_rows(
    upstream_url: str, tmp_path: Path
) -> None:
    rows = {}
    for mode in ("compact", "full"):
        (tmp_path / mode).mkdir()
        gateway = launch_gateway([upstream_url], tmp_path / mode, f"--capture={mode}")
        try:
            with gateway.management() as admin, gateway.agent("r1") as agent:
                create_rollouts(admin, "r1")
                admin.post("/api/rollouts/r1/transition", json={"state": "running", "attempt_id": "a1"})
                answers = []
                messages: list[dict[str, str]] = []
                for turn in range(3):  # a conversation that grows: trajectory merging across calls
                    messages.append({"role": "user", "content": f"turn {turn} of the same talk"})
                    body = {"messages": messages, "fake_answer": f"answer number {turn}"}
                    answer = agent.post(gateway.proxy_path("r1"), json=body)
                    assert answer.status_code == 200, answer.text
                    answers.append(answer.json())
                    messages.append({"role": "assistant", "content": f"answer number {turn}"})
                admin.post("/api/rollouts/r1/transition", json={"state": "succeeded"})
                document = EventsDocument.model_validate_json(admin.get("/api/rollouts/r1/events").content)
        finally:
            gateway.process.stop()
        assert (document.model_calls[0].response is None) is (mode == "compact")
        rows[mode] = adapt_rollout(document, group_id="g1", config=UNLIMITED).rows
    assert rows["compact"] == rows["full"]
    assert repr(rows["compact"]) == repr(rows["full"])
    assert len(rows["compact"]) >= 1


# -- the limits ---------------------------------------------------------------------------------------------


def _metric(gateway: RunningGateway, name: str, **labels: str) -> float:
    wanted = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    for line in httpx.get(f"{gateway.url}/metrics").text.splitlines():
        head, _, value = line.rpartition(" ")
        if head == (f"{name}{{{wanted}}}" if labels else name):
            return float(value)
    return 0.0


def _start(admin: httpx.Client, *rollout_ids: str) -> None:
    create_rollouts(admin, *rollout_ids)
    for rollout_id in rollout_ids:
        running = {"state": "running", "attempt_id": "a1"}
        assert admin.post(f"/api/rollouts/{rollout_id}/transition", json=running).status_code == 200


def test_a_rollout_past_its_capture_limit_gets_413_naming_the_limit_and_others_go_on(
    upstream_url: str, tmp_path: Path
) -> None:
    gateway = launch_gateway([upstream_url], tmp_path, "--max-capture-bytes-per-rollout=4096")
    try:
        with gateway.management() as admin, gateway.agent("greedy") as greedy, gateway.agent("fair") as fair:
            _start(admin, "greedy", "fair")
            statuses = []
            for _ in range(50):  # each call holds ~600 bytes: the limit is met within a dozen calls
                answer = greedy.post(gateway.proxy_path("greedy"), json=CHAT)
                statuses.append(answer.status_code)
                if answer.status_code != 200:
                    break
            refused = answer
            captured = admin.get("/api/rollouts/greedy/events").json()["model_calls"]
            other = fair.post(gateway.proxy_path("fair"), json=CHAT)
            fair_calls = admin.get("/api/rollouts/fair/events").json()["model_calls"]
            later = greedy.post(gateway.proxy_path("greedy"), json=CHAT)
        assert statuses[:-1] == [200] * (len(statuses) - 1)
        assert 3 <= len(statuses) < 50
        assert refused.status_code == 413
        body = refused.json()
        assert "--max-capture-bytes-per-rollout" in body["error"]
        assert "spec.gateway.maxCaptureBytesPerRollout" in body["error"]
        assert (body["limit"], body["rollout_id"]) == ("rollout", "greedy")
        assert later.status_code == 413  # stays refused: its rollout is full
        # Nothing stored was lost: every answered call is kept; all but at most the one that crossed the
        # limit with its tokens, and that one says why it has none.
        assert len(captured) == len(statuses) - 1
        with_tokens = [call for call in captured if call["response_token_ids"]]
        without = [call for call in captured if not call["response_token_ids"]]
        assert len(without) <= 1
        assert len(with_tokens) >= 2
        assert all("--max-capture-bytes-per-rollout" in call["unreadable"] for call in without)
        assert other.status_code == 200
        assert fair_calls[0]["response_token_ids"]
        hits = "asyncrl_gateway_capture_limit_hits_total"
        assert _metric(gateway, hits, limit="rollout", outcome="refused") >= 2
        assert _metric(gateway, "asyncrl_gateway_rejections_total", reason="capture_rollout_full") >= 2
    finally:
        gateway.process.stop()


def test_a_full_store_gets_507_with_retry_after_until_the_trainer_consumes_rollouts(
    upstream_url: str, tmp_path: Path
) -> None:
    gateway = launch_gateway([upstream_url], tmp_path, "--max-capture-bytes=4096", "--retry-after-seconds=2")
    hits = "asyncrl_gateway_capture_limit_hits_total"
    try:
        with gateway.management() as admin:
            rollout_ids = [f"r{index}" for index in range(20)]
            _start(admin, *rollout_ids)
            answered: list[str] = []
            refused = None
            for rollout_id in rollout_ids:
                with gateway.agent(rollout_id) as agent:
                    answer = agent.post(gateway.proxy_path(rollout_id), json=CHAT)
                if answer.status_code != 200:
                    refused = answer
                    break
                answered.append(rollout_id)
            assert refused is not None, answered
            assert refused.status_code == 507, refused.text
            assert refused.headers["retry-after"] == "2"
            assert "--max-capture-bytes" in refused.json()["error"]
            assert "spec.gateway.maxCaptureBytes" in refused.json()["error"]
            # Tokens never pass the limit; a call that reached it is kept as its metadata only.
            not_captured = _metric(gateway, hits, limit="store", outcome="not_captured")
            stored_bytes = _metric(gateway, "asyncrl_gateway_capture_bytes")
            assert 0 < stored_bytes <= 4096 + CALL_OVERHEAD_BYTES * not_captured
            # Nothing stored was lost: every answered rollout still has its call.
            for rollout_id in answered:
                (call,) = admin.get(f"/api/rollouts/{rollout_id}/events").json()["model_calls"]
                assert call["status"] == 200
            # The trainer consumes finished rollouts: space is freed and calls go through again.
            finished = answered[:2]
            for rollout_id in finished:
                admin.post(f"/api/rollouts/{rollout_id}/transition", json={"state": "succeeded"})
            assert admin.post("/api/rollouts/delete", json={"rollout_ids": finished}).json()["deleted"] == 2
            blocked = rollout_ids[len(answered)]
            with gateway.agent(blocked) as agent:
                again = agent.post(gateway.proxy_path(blocked), json=CHAT)
            assert again.status_code == 200, again.text
            assert _metric(gateway, "asyncrl_gateway_capture_bytes") <= 4096
        assert (
            _metric(gateway, "asyncrl_gateway_capture_limit_hits_total", limit="store", outcome="refused")
            >= 1
        )
    finally:
        gateway.process.stop()


# -- every choice is a sample ------------------------------------------------------------------------------


def _capture(endpoint: str, answer: dict[str, Any], mode: CaptureMode = CaptureMode.COMPACT) -> Any:
    return capture_call(
        mode=mode,
        attempt_id="a1",
        endpoint=endpoint,
        status=200,
        latency_seconds=0.1,
        model_version=2,
        started_at=1.0,
        request_body=b"{}",
        response_body=json.dumps(answer).encode(),
    )


def test_each_choice_of_an_n_greater_than_one_answer_is_its_own_row() -> None:
    """n = 3 is three samples of the policy; before, only choice 0 was captured and two were lost."""
    answer = {
        "prompt_token_ids": [1, 2],
        "choices": [
            {"index": i, "token_ids": [10 + i, 20 + i], "logprobs": {"content": [{"logprob": -0.5}] * 2}}
            for i in range(3)
        ],
    }
    calls = _capture("chat/completions", answer, CaptureMode.FULL)
    assert [call.choice_index for call in calls] == [0, 1, 2]
    assert [tuple(call.response_token_ids) for call in calls] == [(10, 20), (11, 21), (12, 22)]
    assert all(tuple(call.prompt_token_ids) == (1, 2) for call in calls)
    assert calls[0].response_body is not None  # the JSON kept once
    assert calls[1].response_body is None

    store = RolloutStore()
    store.create([RolloutCreate(rollout_id="r1", group_id="g1", step=0, input={})])
    rollout = store.get("r1")
    rollout.state, rollout.attempt_id = RolloutState.RUNNING, "a1"
    for call in calls:
        assert store.record_call("r1", call) is None
    rollout.state = RolloutState.SUCCEEDED
    document = EventsDocument.model_validate_json(events_document(rollout))
    assert [call.choice_index for call in document.model_calls] == [0, 1, 2]
    result = adapt_rollout(document, group_id="g1", config=UNLIMITED)
    assert [row.response_token_ids for row in result.rows] == [(10, 20), (11, 21), (12, 22)]


def test_a_completions_answer_keeps_each_choices_own_prompt_ids() -> None:
    """Two prompts, n = 2: vLLM puts each choice's prompt ids inside the choice (index // n: its prompt)."""
    answer = {
        "choices": [
            {
                "index": i,
                "prompt_token_ids": [1, 2] if i < 2 else [3, 4, 5],
                "token_ids": [30 + i],
                "logprobs": {"token_logprobs": [-1.0]},
            }
            for i in range(4)
        ]
    }
    calls = _capture("completions", answer)
    assert [tuple(call.prompt_token_ids) for call in calls] == [(1, 2), (1, 2), (3, 4, 5), (3, 4, 5)]
    assert [tuple(call.response_logprobs) for call in calls] == [(-1.0,)] * 4


def test_an_answer_without_choices_is_one_call_without_tokens() -> None:
    (call,) = _capture("chat/completions", {"error": "bad"})
    assert call.prompt_token_ids is None
    assert call.response_token_ids is None


def test_a_train_call_always_asks_for_token_ids_and_log_probs() -> None:
    """The agent's own `false` would turn the capture off (it was only defaulted)."""
    from asyncrl.gateway.capture import request_overrides

    off = {"messages": [], "logprobs": False, "return_token_ids": False}
    chat = request_overrides(off, endpoint="chat/completions", model="m", capture=True)
    assert (chat["logprobs"], chat["return_token_ids"]) == (True, True)
    text = request_overrides(
        {"prompt": "x", "logprobs": False}, endpoint="completions", model="m", capture=True
    )
    assert text["logprobs"] == 0
    top = request_overrides({"prompt": "x", "logprobs": 3}, endpoint="completions", model="m", capture=True)
    assert top["logprobs"] == 3  # the agent's alternatives are kept
    validation = request_overrides(off, endpoint="chat/completions", model="m", capture=False)
    assert validation["logprobs"] is False


def test_a_choice_vllm_aborted_is_kept_as_aborted_and_gives_no_row() -> None:
    answer = {
        "prompt_token_ids": [1, 2],
        "choices": [
            {
                "index": 0,
                "finish_reason": "abort",
                "token_ids": [9],
                "logprobs": {"content": [{"logprob": -1}]},
            }
        ],
    }
    (call,) = _capture("chat/completions", answer)
    assert call.aborted
    store = RolloutStore()
    store.create([RolloutCreate(rollout_id="r1", group_id="g1", step=0, input={})])
    rollout = store.get("r1")
    rollout.state, rollout.attempt_id = RolloutState.RUNNING, "a1"
    assert store.record_call("r1", call) is None
    rollout.state = RolloutState.SUCCEEDED
    result = adapt_rollout(
        EventsDocument.model_validate_json(events_document(rollout)), group_id="g1", config=UNLIMITED
    )
    assert result.rows == ()
    assert result.counts.dropped_calls_failed == 1
