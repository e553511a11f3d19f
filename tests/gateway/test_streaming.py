"""Streamed model calls over real HTTP: relayed chunk by chunk, captured like plain calls, paused safely.

Real gateway and fake-upstream processes on 127.0.0.1 (the fake streams as vLLM does); the official OpenAI
SDK (sync and async) plays the streaming agent. Conditions are awaited with generous deadlines.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from asyncrl.gateway_api.tokens import agent_token
from tests.gateway.conftest import RunningGateway, create_rollouts
from tests.gateway.test_pauses import admin_headers, agent_headers, metric, openai_sdk

DEADLINE_SECONDS = 30.0
MESSAGES = [{"role": "user", "content": "three little words"}]
ANSWER = "alpha beta gamma delta"


@pytest.fixture
def gateway(full_capture_gateway: RunningGateway) -> RunningGateway:
    """These tests compare the captured response JSON with the streamed answer: Full capture keeps it."""
    return full_capture_gateway


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def calls_of(gateway: RunningGateway, rollout_id: str) -> list[dict[str, Any]]:
    with gateway.management() as admin:
        calls: list[dict[str, Any]] = admin.get(f"/api/rollouts/{rollout_id}/events").json()["model_calls"]
    return calls


def upstream_stats(upstream_url: str) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{upstream_url}/stats").json()
    return stats


def labelled(gateway: RunningGateway, name: str, label: str) -> float:
    for line in httpx.get(gateway.url + "/metrics").text.splitlines():
        if line.startswith(f"{name}{{{label}}} "):
            return float(line.split()[1])
    return 0.0


def comparable(call: dict[str, Any]) -> dict[str, Any]:
    """A captured row without what differs between two calls of the same answer (timing, ids, the ask)."""
    response = {key: value for key, value in call["response"].items() if key not in {"id", "created"}}
    skip = {"latency_seconds", "started_at", "request", "response"}
    return {**{key: value for key, value in call.items() if key not in skip}, "response": response}


def test_sync_sdk_gets_the_first_chunk_before_the_upstream_has_finished(
    gateway: RunningGateway, upstream_url: str
) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
    before = upstream_stats(upstream_url)
    stream = openai_sdk(gateway, "r1").chat.completions.create(
        model="anything",
        messages=MESSAGES,  # type: ignore[arg-type]
        stream=True,
        extra_body={"fake_answer": ANSWER, "fake_chunk_delay_seconds": 0.3},
    )
    pieces: list[str] = []
    unfinished_at_first_content: bool | None = None
    for chunk in stream:
        content = chunk.choices[0].delta.content if chunk.choices else None
        if content and unfinished_at_first_content is None:
            unfinished_at_first_content = (
                upstream_stats(upstream_url)["streams_completed"] == before["streams_completed"]
            )
        pieces.append(content or "")
    assert unfinished_at_first_content is True  # relayed as it came, not after the whole answer
    assert "".join(pieces) == ANSWER
    assert upstream_stats(upstream_url)["streams_completed"] == before["streams_completed"] + 1
    (call,) = calls_of(gateway, "r1")
    assert call["status"] == 200
    assert call["aborted"] is False
    assert call["response"]["choices"][0]["message"]["content"] == ANSWER
    assert len(call["response_token_ids"]) == len(call["response_logprobs"]) == 4
    assert labelled(gateway, "asyncrl_gateway_streamed_calls_total", 'outcome="completed"') == 1


@pytest.mark.parametrize("endpoint", ["chat/completions", "completions"])
def test_a_streamed_call_is_captured_exactly_as_the_same_answer_unstreamed(
    gateway: RunningGateway, endpoint: str
) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "plain", "streamed")
        admin.post("/proxy/resume", json={"model_version": 3})
    extra = {"fake_answer": ANSWER}
    plain_client, streamed_client = openai_sdk(gateway, "plain"), openai_sdk(gateway, "streamed")
    if endpoint == "chat/completions":
        plain_client.chat.completions.create(model="m", messages=MESSAGES, extra_body=extra)  # type: ignore[arg-type]
        chunks = list(
            streamed_client.chat.completions.create(
                model="m",
                messages=MESSAGES,  # type: ignore[arg-type]
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra,
            )
        )
    else:
        plain_client.completions.create(model="m", prompt="three little words", extra_body=extra)
        chunks = list(
            streamed_client.completions.create(
                model="m",
                prompt="three little words",
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra,
            )
        )
    (plain,) = calls_of(gateway, "plain")
    (streamed,) = calls_of(gateway, "streamed")
    assert comparable(streamed) == comparable(plain)
    assert streamed["request"]["stream"] is True
    assert streamed["prompt_token_ids"]
    assert streamed["response_token_ids"]
    assert streamed["response_logprobs"]
    assert streamed["model_version"] == 3
    # include_usage honoured: the last chunk is the usage, with no choices
    assert chunks[-1].usage is not None
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 4
    assert all(chunk.usage is None for chunk in chunks[:-1])


def test_without_include_usage_the_agent_gets_no_usage_chunk_but_the_capture_has_usage(
    gateway: RunningGateway, upstream_url: str
) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
    chunks = list(
        openai_sdk(gateway, "r1").chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            extra_body={"fake_answer": ANSWER},
        )
    )
    assert all(chunk.usage is None and chunk.choices for chunk in chunks)
    assert upstream_stats(upstream_url)["last_stream_options"] == {"include_usage": True}
    (call,) = calls_of(gateway, "r1")
    assert call["response"]["usage"]["completion_tokens"] == 4


def test_async_sdk_streams_a_completion_and_it_is_captured(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1")

    async def agent() -> str:
        base_url = f"{gateway.url}/proxy/rollout/r1/attempt/a1/mode/train/openai/v1"
        client = openai.AsyncOpenAI(base_url=base_url, api_key=agent_token(gateway.key, "r1"))
        stream = await client.completions.create(
            model="m", prompt="one two", stream=True, extra_body={"fake_chunk_delay_seconds": 0.05}
        )
        text = "".join([chunk.choices[0].text async for chunk in stream])
        await client.close()
        return text

    text = asyncio.run(agent())
    (call,) = calls_of(gateway, "r1")
    assert call["endpoint"] == "completions"
    assert call["response"]["choices"][0]["text"] == text
    assert text.startswith("echo 2 words call")
    assert len(call["response_logprobs"]) == len(call["response_token_ids"]) == len(text.split())


def test_an_abandoned_stream_is_cancelled_upstream_and_captured_as_aborted(
    gateway: RunningGateway, upstream_url: str
) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
    before = upstream_stats(upstream_url)
    body = {"messages": MESSAGES, "stream": True, "fake_answer": ANSWER, "fake_chunk_delay_seconds": 5}
    with (
        httpx.Client(base_url=gateway.url, headers=agent_headers(gateway, "r1"), timeout=30) as agent,
        agent.stream("POST", gateway.proxy_path("r1"), json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        first = next(response.iter_lines())
        assert first.startswith("data: ")
    # the agent closed its connection after one chunk of a 20 s answer
    wait_for(
        lambda: upstream_stats(upstream_url)["streams_cancelled"] == before["streams_cancelled"] + 1,
        "the upstream to see its stream cancelled",
    )
    wait_for(lambda: len(calls_of(gateway, "r1")) == 1, "the aborted call to be captured")
    (call,) = calls_of(gateway, "r1")
    assert call["aborted"] is True
    assert call["status"] == 499  # never trained on: the adapter drops calls that did not succeed
    assert upstream_stats(upstream_url)["streams_completed"] == before["streams_completed"]
    assert labelled(gateway, "asyncrl_gateway_streamed_calls_total", 'outcome="abandoned"') == 1
    with gateway.management() as admin:
        assert admin.get("/proxy/state").json()["inflight"] == 0


@pytest.mark.parametrize(
    ("knob", "message"),
    [("fake_stream_cut_after", "ended before"), ("fake_stream_malformed_after", "not JSON")],
)
def test_a_broken_upstream_stream_gives_the_agent_a_clean_error_and_no_captured_row(
    gateway: RunningGateway, knob: str, message: str
) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
    received: list[str] = []
    with pytest.raises(openai.APIError) as raised:  # noqa: PT012
        for chunk in openai_sdk(gateway, "r1").chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            extra_body={"fake_answer": ANSWER, knob: 3},
        ):
            received.append(chunk.choices[0].delta.content or "")
    assert message in raised.value.message
    text = "".join(received)
    if knob == "fake_stream_malformed_after":
        assert text == "alpha beta"  # what came before the break
    else:
        # What came before a cut connection is relayed as far as the gateway read it before the cut: aiohttp's
        # StreamReader raises the connection error before handing out bytes that arrived together with it
        # (seen in CI on a loaded machine), so the agent may get less, never anything else.
        assert "alpha beta".startswith(text)
    assert calls_of(gateway, "r1") == []
    assert labelled(gateway, "asyncrl_gateway_streamed_calls_total", 'outcome="failed"') == 1


def test_a_streamed_call_arriving_during_a_pause_is_held_then_streamed(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
        admin.post("/proxy/pause", json={"reason": "update"})
        threading.Timer(
            1.0, lambda: gateway.management().post("/proxy/resume", json={"model_version": 4})
        ).start()
        text = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in openai_sdk(gateway, "r1").chat.completions.create(
                model="m",
                messages=MESSAGES,  # type: ignore[arg-type]
                stream=True,
                extra_body={"fake_answer": ANSWER},
            )
        )
    assert text == ANSWER
    (call,) = calls_of(gateway, "r1")
    assert call["model_version"] == 4  # generated after the update
    assert metric(gateway, "asyncrl_gateway_held_calls_total") == 1


def test_a_streamed_call_arriving_during_a_pause_gets_429_in_reject_mode(
    reject_gateway: RunningGateway,
) -> None:
    with reject_gateway.management() as admin:
        create_rollouts(admin, "r1")
        admin.post("/proxy/pause", json={"reason": "update", "retry_after_seconds": 0.1})
        client = openai_sdk(reject_gateway, "r1").with_options(max_retries=0)
        with pytest.raises(openai.RateLimitError):
            client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore[arg-type]
    assert calls_of(reject_gateway, "r1") == []


@pytest.mark.parametrize("abort", [False, True])
def test_a_stream_already_sending_when_a_pause_begins_is_drained_not_aborted(
    gateway: RunningGateway, abort: bool
) -> None:
    """Bytes already sent cannot be re-issued: Wait and Abort both let the stream finish, and wait for it."""
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
    body = {"messages": MESSAGES, "stream": True, "fake_answer": ANSWER, "fake_chunk_delay_seconds": 0.3}
    with (
        httpx.Client(base_url=gateway.url, headers=agent_headers(gateway, "r1"), timeout=30) as agent,
        agent.stream("POST", gateway.proxy_path("r1"), json=body) as response,
    ):
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # the stream has begun
        paused: dict[str, Any] = {}

        def pause() -> None:
            answer = httpx.post(
                gateway.url + "/proxy/pause?wait=30",
                json={"reason": "update", "abort": abort},
                headers=admin_headers(gateway),
                timeout=60,
            )
            paused.update(answer.json())

        pausing = threading.Thread(target=pause)
        pausing.start()
        rest = [line for line in lines if line]
        pausing.join(timeout=DEADLINE_SECONDS)
    assert rest[-1] == "data: [DONE]"
    assert paused["drained"] is True
    assert paused["aborted"] == 0
    assert paused["inflight_at_pause"] == 1
    assert paused["drain_seconds"] >= 0.3  # the drain waited for the stream's remaining chunks
    assert metric(gateway, "asyncrl_gateway_last_drain_seconds") == paused["drain_seconds"]
    assert metric(gateway, "asyncrl_gateway_aborted_calls_total") == 0
    (call,) = calls_of(gateway, "r1")
    assert call["status"] == 200
    assert call["response"]["choices"][0]["message"]["content"] == ANSWER


def test_abort_reissues_a_streamed_call_that_has_not_sent_a_byte(
    gateway: RunningGateway, upstream_url: str
) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
    before = upstream_stats(upstream_url)
    results: list[str] = []

    def agent() -> None:
        stream = openai_sdk(gateway, "r1").chat.completions.create(
            model="m",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            extra_body={"fake_answer": ANSWER, "fake_delay_seconds": 3},
        )
        results.append("".join(chunk.choices[0].delta.content or "" for chunk in stream))

    running = threading.Thread(target=agent)
    running.start()
    with gateway.management() as admin:
        wait_for(lambda: admin.get("/proxy/state").json()["inflight"] == 1, "the stream in flight")
        # At the upstream too (on a busy machine it may not be there yet, and an abort before it arrives
        # leaves no disconnect to count).
        wait_for(lambda: upstream_stats(upstream_url)["calls"] == before["calls"] + 1, "the call upstream")
        paused = admin.post("/proxy/pause?wait=30", json={"reason": "update", "abort": True}).json()
        wait_for(
            lambda: upstream_stats(upstream_url)["disconnects"] == before["disconnects"] + 1,
            "the upstream to see the aborted call leave",
        )
        admin.post("/proxy/resume", json={"model_version": 9})
    running.join(timeout=DEADLINE_SECONDS)
    assert results == [ANSWER]  # the agent saw one slow stream
    assert paused["aborted"] == 1
    assert paused["drained"] is True
    assert upstream_stats(upstream_url)["calls"] == before["calls"] + 2
    (call,) = calls_of(gateway, "r1")
    assert call["model_version"] == 9  # only the re-issued call, new weights
    assert metric(gateway, "asyncrl_gateway_aborted_calls_total") == 1


@pytest.mark.parametrize(
    ("field", "value"), [("stream", "yes"), ("stream", 1), ("stream_options", 5), ("stream_options", [])]
)
def test_malformed_stream_fields_are_refused_naming_the_field(
    gateway: RunningGateway, field: str, value: object
) -> None:
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        body = {"messages": MESSAGES, "stream": True, field: value}
        response = agent.post(gateway.proxy_path("r1"), json=body)
    assert response.status_code == 400
    assert response.json()["field"] == field
    assert calls_of(gateway, "r1") == []


def test_stream_options_without_stream_is_refused(gateway: RunningGateway) -> None:
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        body = {"messages": MESSAGES, "stream_options": {"include_usage": True}}
        response = agent.post(gateway.proxy_path("r1"), json=body)
    assert response.status_code == 400
    assert "stream: true" in response.json()["error"]
