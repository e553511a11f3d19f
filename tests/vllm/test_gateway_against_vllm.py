"""The gateway in front of the real vLLM 0.24 (CPU build): what it captures is what vLLM answered.

Real here: vLLM's own OpenAI server on a tiny model made in code, `asyncrl gateway` processes registered with
it by its OpenAI base URL (`http://127.0.0.1:PORT/v1`, as vLLM's docs write it), agents over real HTTP (the
official OpenAI SDK among them), and the trainer's own adapter turning the captures into training rows.

Each test compares the gateway's capture with vLLM's own answer: the JSON vLLM sent (kept by
`--capture=full`), its `/tokenize` endpoint, and the same request replayed directly against vLLM with the
same seed (vLLM's per-request seed makes CPU sampling reproducible).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from asyncrl.gateway_api.events import CallRecord, EventsDocument
from asyncrl.gateway_api.tokens import agent_token
from asyncrl.testing.vllm_cpu import VllmServer
from asyncrl.testing.waiting import WaitTimeout, wait_for
from asyncrl.trainer.adapter import AdapterConfig, adapt_rollout
from asyncrl.trainer.backends.reference.tokenizer import IM_END, build_tokenizer
from tests.gateway.conftest import RunningGateway, create_rollouts, launch_gateway
from tests.vllm.conftest import SERVED_MODEL

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

MESSAGES = [{"role": "user", "content": "Name two colours."}]
# Printable ASCII letters, space and the turn's end: a reply that decodes to text and re-encodes to the same
# ids, as a real model's usually does; the byte tokenizer's ids are the bytes themselves.
ASCII_REPLY_IDS = [*range(ord("a"), ord("z") + 1), ord(" ")]
LOGPROB_TOLERANCE = 1e-4  # a replay of the same request on the same CPU; float32 kernels, another batch
# Seconds of generation for the tiny model on two cores (2-3 s unloaded), so the pause catches it running.
ABORTED_CALL_TOKENS = 6_000
WAIT_SECONDS = 120.0  # for vLLM to start or stop a call: well under a second unloaded
# vLLM's CPU kernels against HF transformers' eager float32 forward, same weights.
TRAINER_LOGPROB_TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer()


@pytest.fixture(scope="module")
def im_end(tokenizer: Any) -> int:
    token_id: int = tokenizer.convert_tokens_to_ids(IM_END)
    return token_id


def start_gateway(vllm_server: VllmServer, log_dir: Path, *extra: str) -> RunningGateway:
    """A gateway registered with vLLM by its OpenAI base URL (`.../v1`), forwarding vLLM's model name."""
    return launch_gateway([f"{vllm_server.url}/v1"], log_dir, "--model", vllm_server.model, *extra)


@pytest.fixture(scope="module")
def gateway(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningGateway]:
    running = start_gateway(vllm_server, tmp_path_factory.mktemp("gateway"), "--capture=full")
    yield running
    running.process.stop()


@pytest.fixture(scope="module")
def allow_gateway(
    vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningGateway]:
    """`samplingParams: Allow`: for the tests that steer the random tiny model (allowed_token_ids, logit_bias,
    min_tokens), which the default Enforce removes from train-mode calls."""
    running = start_gateway(
        vllm_server, tmp_path_factory.mktemp("allow"), "--capture=full", "--sampling-params=Allow"
    )
    yield running
    running.process.stop()


_rollout_counter = iter(range(1_000_000))


def new_rollout(gateway: RunningGateway) -> str:
    rollout_id = f"r{next(_rollout_counter)}"
    with gateway.management() as admin:
        create_rollouts(admin, rollout_id)
    return rollout_id


def wait_until_vllm_runs(
    thread: threading.Thread,
    outcome: dict[str, httpx.Response],
    gateway: RunningGateway,
    vllm_server: VllmServer,
) -> None:
    """Until vLLM runs the long call the thread sent; a failure says what the call, the gateway and vLLM did
    (once this failed in CI after 120 s with nothing to go on)."""
    try:
        wait_for(
            lambda: not thread.is_alive() or running_calls(vllm_server) >= 1,
            timeout=WAIT_SECONDS,
            what="vLLM to start it",
            interval=0.05,
        )
    except WaitTimeout as timeout:
        try:
            waiting = f"{vllm_metric(vllm_server, 'vllm:num_requests_waiting'):g}"
        except (AssertionError, httpx.HTTPError) as error:
            waiting = f"unknown ({error})"
        raise AssertionError(
            f"{timeout}; vLLM has {waiting} requests waiting; gateway log tail:\n"
            f"{gateway.process.log()[-3000:]}\nvLLM log tail:\n{vllm_server.process.log()[-3000:]}"
        ) from timeout
    if not thread.is_alive():
        answer = outcome.get("answer")
        said = "no answer (the agent's request raised)"
        if answer is not None:
            said = f"{answer.status_code} {answer.text[:400]}"
        log = gateway.process.log()[-3000:]
        raise AssertionError(f"the long call ended before the abort: {said}; gateway log tail:\n{log}")


def calls_of(gateway: RunningGateway, rollout_id: str) -> list[CallRecord]:
    with gateway.management() as admin:
        response = admin.get(f"/api/rollouts/{rollout_id}/events")
    assert response.status_code == 200, response.text
    return list(EventsDocument.model_validate_json(response.content).model_calls)


def direct(vllm_server: VllmServer, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    """The same request sent to vLLM itself, not through the gateway."""
    response = httpx.post(f"{vllm_server.url}/v1/{endpoint}", json=body, timeout=300)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def chat_logprobs(choice: dict[str, Any]) -> list[float]:
    return [float(item["logprob"]) for item in choice["logprobs"]["content"]]


def assert_close(captured: tuple[float, ...] | None, expected: list[float]) -> None:
    assert captured is not None
    assert len(captured) == len(expected)
    worst = max((abs(a - b) for a, b in zip(captured, expected, strict=True)), default=0.0)
    assert worst <= LOGPROB_TOLERANCE, f"log-probs differ by up to {worst}"


def vllm_metric(vllm_server: VllmServer, name: str, **labels: str) -> float:
    """The sum of a vLLM Prometheus sample over the series whose labels include `labels`."""
    text = httpx.get(f"{vllm_server.url}/metrics", timeout=30).text
    total, found = 0.0, False
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", line)
        if not match:
            continue
        series = match.group(1) or ""
        if all(f'{key}="{value}"' in series for key, value in labels.items()):
            total, found = total + float(match.group(2)), True
    assert found, f"vLLM exports no {name}{labels or ''}"
    return total


def running_calls(vllm_server: VllmServer) -> float:
    return vllm_metric(vllm_server, "vllm:num_requests_running")


# -- chat, completions, streaming, n > 1 ---------------------------------------------------------------------


def test_a_chat_call_captures_exactly_the_tokens_and_log_probs_vllm_answered(
    gateway: RunningGateway, vllm_server: VllmServer, tokenizer: Any
) -> None:
    rollout_id = new_rollout(gateway)
    with gateway.agent(rollout_id) as agent:
        answer = agent.post(
            gateway.proxy_path(rollout_id),
            json={"model": "what-the-agent-says", "messages": MESSAGES, "max_tokens": 24, "seed": 11},
        )
    assert answer.status_code == 200, answer.text
    (call,) = calls_of(gateway, rollout_id)
    vllm_said = call.response
    assert answer.json() == vllm_said  # the agent gets vLLM's answer as it is
    assert call.request["model"] == SERVED_MODEL
    assert call.request["return_token_ids"] is True
    (choice,) = vllm_said["choices"]
    assert call.prompt_token_ids == tuple(vllm_said["prompt_token_ids"])
    assert call.response_token_ids == tuple(choice["token_ids"])
    assert call.response_logprobs == tuple(chat_logprobs(choice))
    assert len(call.response_token_ids) >= 1

    # The prompt ids are vLLM's own chat template, which is also ours: no re-tokenization drift.
    tokenized = httpx.post(
        f"{vllm_server.url}/tokenize",
        json={"model": SERVED_MODEL, "messages": MESSAGES, "add_generation_prompt": True},
        timeout=60,
    ).json()
    assert call.prompt_token_ids == tuple(tokenized["tokens"])
    ours = tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert call.prompt_token_ids == tuple(ours)

    # The same request replayed against vLLM itself: the same sample, the same log-probs.
    replay = direct(vllm_server, "chat/completions", call.request)
    assert call.response_token_ids == tuple(replay["choices"][0]["token_ids"])
    assert_close(call.response_logprobs, chat_logprobs(replay["choices"][0]))


def test_n_greater_than_one_captures_every_choice_vllm_sampled(
    gateway: RunningGateway, vllm_server: VllmServer
) -> None:
    rollout_id = new_rollout(gateway)
    with gateway.agent(rollout_id) as agent:
        answer = agent.post(
            gateway.proxy_path(rollout_id),
            json={"messages": MESSAGES, "max_tokens": 16, "n": 3, "seed": 5},
        )
    assert answer.status_code == 200, answer.text
    calls = calls_of(gateway, rollout_id)
    choices = answer.json()["choices"]
    assert len(choices) == 3
    assert [call.choice_index for call in calls] == [0, 1, 2]
    for call, choice in zip(calls, choices, strict=True):
        assert call.prompt_token_ids == tuple(answer.json()["prompt_token_ids"])
        assert call.response_token_ids == tuple(choice["token_ids"])
        assert call.response_logprobs == tuple(chat_logprobs(choice))
    rollout = _finished(gateway, rollout_id)
    result = adapt_rollout(rollout, group_id="g1", config=AdapterConfig())
    assert len(result.rows) == 3  # three samples, three rows


def test_completions_capture_each_choices_own_prompt_ids(
    gateway: RunningGateway, vllm_server: VllmServer, tokenizer: Any
) -> None:
    prompts = ["The sky is", "Two plus two makes"]
    rollout_id = new_rollout(gateway)
    with gateway.agent(rollout_id) as agent:
        answer = agent.post(
            gateway.proxy_path(rollout_id, endpoint="completions"),
            json={"prompt": prompts, "max_tokens": 8, "n": 2, "seed": 3},
        )
    assert answer.status_code == 200, answer.text
    choices = sorted(answer.json()["choices"], key=lambda choice: choice["index"])
    assert len(choices) == 4
    calls = calls_of(gateway, rollout_id)
    assert len(calls) == 4
    for call, choice in zip(calls, choices, strict=True):
        prompt = prompts[choice["index"] // 2]  # vLLM orders the n samples of each prompt together
        assert call.prompt_token_ids == tuple(choice["prompt_token_ids"])
        assert call.prompt_token_ids == tuple(tokenizer.encode(prompt, add_special_tokens=False))
        assert call.response_token_ids == tuple(choice["token_ids"])
        expected = [float(value) for value in choice["logprobs"]["token_logprobs"]]
        assert call.response_logprobs == tuple(expected)
        assert len(expected) == len(choice["token_ids"])


def test_a_streamed_chat_call_captures_what_the_same_call_unstreamed_samples(
    gateway: RunningGateway, vllm_server: VllmServer
) -> None:
    """The agent streams through the gateway with the OpenAI SDK; the capture, assembled from vLLM's chunks,
    equals vLLM's non-streamed answer to the same request and seed."""
    rollout_id = new_rollout(gateway)
    client = sdk_client(gateway, rollout_id)
    stream = client.chat.completions.create(
        model="anything", messages=MESSAGES, max_tokens=20, seed=23, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    (call,) = calls_of(gateway, rollout_id)
    assert not call.aborted
    forwarded = {key: value for key, value in call.request.items() if key not in {"stream", "stream_options"}}
    replay = direct(vllm_server, "chat/completions", forwarded)
    (choice,) = replay["choices"]
    assert call.prompt_token_ids == tuple(replay["prompt_token_ids"])
    assert call.response_token_ids == tuple(choice["token_ids"])
    assert_close(call.response_logprobs, chat_logprobs(choice))
    assert text == choice["message"]["content"]


# -- the sampling the trainer needs --------------------------------------------------------------------------


def test_enforce_captures_the_runs_sampling_not_the_agents(
    gateway: RunningGateway, vllm_server: VllmServer
) -> None:
    """The agent asks for temperature 0.3; the run samples at 1.0 (the default). What is captured is vLLM's
    sample at 1.0 (the same as a direct call at 1.0 with the seed), and the agent's setting is recorded."""
    rollout_id = new_rollout(gateway)
    body = {"messages": MESSAGES, "max_tokens": 24, "seed": 29, "temperature": 0.3}
    with gateway.agent(rollout_id) as agent:
        assert agent.post(gateway.proxy_path(rollout_id), json=body).status_code == 200
    (call,) = calls_of(gateway, rollout_id)
    assert call.agent_sampling == {"temperature": 0.3}
    assert call.request["temperature"] == 1.0
    at_run = direct(vllm_server, "chat/completions", {**call.request})
    at_agent = direct(vllm_server, "chat/completions", {**call.request, "temperature": 0.3})
    assert call.response_token_ids == tuple(at_run["choices"][0]["token_ids"])
    assert_close(call.response_logprobs, chat_logprobs(at_run["choices"][0]))
    # The agent's own setting would have given other log-probs for the same tokens' positions.
    assert chat_logprobs(at_agent["choices"][0]) != chat_logprobs(at_run["choices"][0])


def test_reject_refuses_the_agents_own_sampling_before_vllm_sees_it(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    running = start_gateway(vllm_server, tmp_path, "--sampling-params=Reject")
    try:
        rollout_id = new_rollout(running)
        before = vllm_metric(vllm_server, "vllm:request_success_total")
        with running.agent(rollout_id) as agent:
            refused = agent.post(
                running.proxy_path(rollout_id), json={"messages": MESSAGES, "max_tokens": 4, "top_p": 0.5}
            )
            assert refused.status_code == 400
            assert "top_p=0.5" in refused.text
            plain = {"messages": MESSAGES, "max_tokens": 4}
            accepted = agent.post(running.proxy_path(rollout_id), json=plain)
            assert accepted.status_code == 200, accepted.text
        assert vllm_metric(vllm_server, "vllm:request_success_total") == before + 1
    finally:
        running.process.stop()


# vLLM applies each of these to the logits before it samples and reports processed log-probs: (parameter,
# value) on a request the tiny model answers with printable bytes.
BIASING_PARAMETERS: list[tuple[str, Any]] = [
    ("logit_bias", {str(ord("a")): 6.0}),  # the byte tokenizer's ids are the bytes themselves
    ("min_tokens", 24),  # the stop tokens masked for the whole reply: every other token's log-prob rises
    ("repetition_penalty", 1.8),
    ("presence_penalty", 1.5),
    ("structured_outputs", {"choice": ["red", "blue"]}),
]


def captured(gateway: RunningGateway, body: dict[str, Any]) -> CallRecord:
    rollout_id = new_rollout(gateway)
    with gateway.agent(rollout_id) as agent:
        answer = agent.post(gateway.proxy_path(rollout_id), json=body)
    assert answer.status_code == 200, answer.text
    (call,) = calls_of(gateway, rollout_id)
    assert call.response_logprobs is not None
    return call


@pytest.mark.parametrize(("name", "value"), BIASING_PARAMETERS)
def test_enforce_removes_a_parameter_that_biases_vllms_log_probs_and_allow_shows_the_bias_is_real(
    gateway: RunningGateway, allow_gateway: RunningGateway, name: str, value: Any
) -> None:
    """Under Enforce (the module's gateway) the agent's biased call is captured exactly as its plain call with
    the same seed: the tokens and log-probs of the policy the trainer recomputes. Under Allow the same biased
    call reaches vLLM, and what vLLM samples and reports differs: the bias the gateway removes is real."""
    plain = {"messages": MESSAGES, "max_tokens": 24, "seed": 53}
    biased = {**plain, name: value}
    reference = captured(gateway, plain)
    enforced = captured(gateway, biased)
    assert enforced.response_token_ids == reference.response_token_ids
    assert_close(enforced.response_logprobs, list(reference.response_logprobs or ()))
    assert enforced.agent_sampling == {name: value}
    assert enforced.request.get(name) == reference.request.get(name)  # gone, or repetition_penalty 1

    allowed = captured(allow_gateway, biased)
    assert allowed.request[name] == value
    assert allowed.agent_sampling is None
    assert reference.response_logprobs is not None
    assert allowed.response_logprobs is not None
    if allowed.response_token_ids == reference.response_token_ids:
        worst = max(
            abs(a - b) for a, b in zip(allowed.response_logprobs, reference.response_logprobs, strict=True)
        )
        assert worst > 100 * LOGPROB_TOLERANCE, f"{name}={value!r} moved vLLM's log-probs by only {worst}"
    # Else the bias changed what vLLM sampled: a different sample altogether.


def test_reject_lets_neutral_values_reach_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    """Neutral values of the owned parameters pass Reject, and vLLM takes what the gateway sends with them
    (min_p 0 and repetition_penalty 1 set on every call)."""
    running = start_gateway(vllm_server, tmp_path, "--sampling-params=Reject", "--capture=full")
    try:
        neutral = {
            "logit_bias": {},
            "min_tokens": 0,
            "repetition_penalty": 1,
            "min_p": 0,
            "frequency_penalty": 0,
            "presence_penalty": 0,
            "bad_words": [],
            "response_format": {"type": "text"},
        }
        plain = {"messages": MESSAGES, "max_tokens": 12, "seed": 59}
        reference = captured(running, plain)
        call = captured(running, {**plain, **neutral})
        assert call.response_token_ids == reference.response_token_ids
        assert_close(call.response_logprobs, list(reference.response_logprobs or ()))
        assert reference.request["min_p"] == 0.0
        assert reference.request["repetition_penalty"] == 1.0
    finally:
        running.process.stop()


# -- abort at a pause ----------------------------------------------------------------------------------------


def test_a_pause_with_abort_stops_vllm_generating_and_the_agent_still_gets_its_answer(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    """drainPolicy Abort: vLLM itself stops generating the call (its running-requests gauge falls to 0 with
    fewer tokens generated than asked, and no more while paused); after the resume the call is re-issued and
    answered in full, by the new model version."""
    running = start_gateway(vllm_server, tmp_path)
    try:
        rollout_id = new_rollout(running)
        tokens_before = vllm_metric(vllm_server, "vllm:generation_tokens_total")
        long_call = {"messages": MESSAGES, "max_tokens": ABORTED_CALL_TOKENS, "ignore_eos": True, "seed": 1}
        outcome: dict[str, httpx.Response] = {}

        def agent_call() -> None:
            with running.agent(rollout_id) as agent:
                agent.timeout = httpx.Timeout(600)
                outcome["answer"] = agent.post(running.proxy_path(rollout_id), json=long_call)

        thread = threading.Thread(target=agent_call)
        thread.start()
        wait_until_vllm_runs(thread, outcome, running, vllm_server)
        with running.management() as admin:
            paused = admin.post("/proxy/pause", params={"wait": 60}, json={"abort": True, "reason": "update"})
            assert paused.status_code == 200, paused.text
            assert paused.json()["drained"] is True
            assert paused.json()["aborted"] == 1
            wait_for(lambda: running_calls(vllm_server) == 0, timeout=WAIT_SECONDS, what="vLLM to stop it")
            generated = vllm_metric(vllm_server, "vllm:generation_tokens_total") - tokens_before
            assert 0 < generated < ABORTED_CALL_TOKENS  # stopped part-way: vLLM aborted it
            time.sleep(0.5)  # a negative check: nothing is generated while paused
            assert vllm_metric(vllm_server, "vllm:generation_tokens_total") - tokens_before == generated
            assert "answer" not in outcome  # held in the gateway, not answered
            assert calls_of(running, rollout_id) == []  # nothing of the aborted call is captured
            assert admin.post("/proxy/resume", json={"model_version": 1}).status_code == 200
        thread.join(timeout=600)
        answer = outcome["answer"]
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["choices"][0]["token_ids"]) == ABORTED_CALL_TOKENS
        (call,) = calls_of(running, rollout_id)
        assert call.model_version == 1  # generated after the resume, by the new weights
        assert len(call.response_token_ids or ()) == ABORTED_CALL_TOKENS
        total = vllm_metric(vllm_server, "vllm:generation_tokens_total") - tokens_before
        assert total == generated + ABORTED_CALL_TOKENS
    finally:
        running.process.stop()


# -- multi-turn agent with the official SDK, into training rows ----------------------------------------------


def sdk_client(gateway: RunningGateway, rollout_id: str) -> openai.OpenAI:
    base_url = f"{gateway.url}/proxy/rollout/{rollout_id}/attempt/a1/mode/train/openai/v1"
    return openai.OpenAI(base_url=base_url, api_key=agent_token(gateway.key, rollout_id), max_retries=0)


def _finished(gateway: RunningGateway, rollout_id: str, reward: float = 1.0) -> EventsDocument:
    with gateway.management() as admin:
        running = admin.post(
            f"/api/rollouts/{rollout_id}/transition", json={"state": "running", "attempt_id": "a1"}
        )
        assert running.status_code == 200, running.text
    with gateway.agent(rollout_id) as agent:
        posted = agent.post(
            f"/api/rollouts/{rollout_id}/attempt/a1/events",
            json={"event_type": "reward", "data": {"value": reward}},
        )
        assert posted.status_code == 201, posted.text
    with gateway.management() as admin:
        done = admin.post(f"/api/rollouts/{rollout_id}/transition", json={"state": "succeeded"})
        assert done.status_code == 200, done.text
        document = admin.get(f"/api/rollouts/{rollout_id}/events")
    return EventsDocument.model_validate_json(document.content)


def test_a_multi_turn_sdk_agent_becomes_one_row_holding_the_tokens_vllm_saw(
    allow_gateway: RunningGateway, im_end: int
) -> None:
    """Three turns with the OpenAI SDK; the trainer's adapter merges them into one trajectory row whose
    tokens are exactly vLLM's last prompt plus its last answer, with only vLLM's own samples trained on."""
    rollout_id = new_rollout(allow_gateway)
    client = sdk_client(allow_gateway, rollout_id)
    messages: list[dict[str, str]] = [{"role": "user", "content": "Say a word."}]
    for turn in range(3):
        reply = client.chat.completions.create(
            model="anything",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=12,
            seed=100 + turn,
            extra_body={"allowed_token_ids": [*ASCII_REPLY_IDS, im_end]},
        )
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": f"And another, number {turn + 2}."},
        ]
    document = _finished(allow_gateway, rollout_id, reward=0.75)
    calls = list(document.model_calls)
    assert len(calls) == 3
    result = adapt_rollout(document, group_id="g1", config=AdapterConfig())
    assert result.counts.trajectory_breaks == 0
    (row,) = result.rows
    assert row.reward == 0.75
    last = calls[-1]
    assert row.prompt_token_ids == calls[0].prompt_token_ids
    assert row.prompt_token_ids + row.response_token_ids == last.prompt_token_ids + last.response_token_ids
    # Trained on: exactly vLLM's samples, at vLLM's log-probs; the template's tokens between turns are masked.
    trained = [token for token, mask in zip(row.response_token_ids, row.response_mask, strict=True) if mask]
    sampled = [token for call in calls for token in call.response_token_ids or ()]
    assert trained == sampled
    trained_logprobs = [lp for lp, mask in zip(row.rollout_log_probs, row.response_mask, strict=True) if mask]
    assert trained_logprobs == [lp for call in calls for lp in call.response_logprobs or ()]
    assert all(math.isfinite(value) for value in trained_logprobs)


def test_a_finished_turn_ends_with_its_stop_token_so_the_policy_learns_to_end_turns(
    allow_gateway: RunningGateway, im_end: int
) -> None:
    """A reply that stopped on `<|im_end|>` keeps that token among the sampled ids (vLLM includes a stop
    token from the model's generation config), so the row trains on ending the turn rather than masking it."""
    rollout_id = new_rollout(allow_gateway)
    with allow_gateway.agent(rollout_id) as agent:
        answer = agent.post(
            allow_gateway.proxy_path(rollout_id),
            json={
                "messages": MESSAGES,
                "max_tokens": 64,
                "seed": 2,
                # Only "a" or the turn's end: the reply ends on <|im_end|> within a few tokens.
                "allowed_token_ids": [ord("a"), im_end],
                "logit_bias": {str(im_end): 5.0},
            },
        )
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    (call,) = calls_of(allow_gateway, rollout_id)
    assert call.response_token_ids is not None
    assert call.response_token_ids[-1] == im_end
    assert "<|im_end|>" not in (choice["message"]["content"] or "")


# -- vLLM's log-probs are the ones the trainer recomputes --------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_captured_log_probs_equal_the_trainers_recomputation_at_the_runs_temperature(
    vllm_server: VllmServer, tiny_model_dir: Path, tmp_path: Path, temperature: float
) -> None:
    """Rollout correction divides the trainer's old log-probs by vLLM's. verl recomputes them from the actor's
    logits divided by `rollout.temperature` (verl's `logprobs_from_logits`), so vLLM's captured log-probs must
    be that same distribution: the run's temperature (the gateway enforces it) and vLLM's processed log-probs
    (as verl starts vLLM). Checked here on the same weights with the trainer's own code (HF transformers)."""
    running = start_gateway(vllm_server, tmp_path, f"--rollout-temperature={temperature}")
    try:
        rollout_id = new_rollout(running)
        with running.agent(rollout_id) as agent:
            body = {"messages": MESSAGES, "max_tokens": 32, "seed": 41, "temperature": 0.2}
            assert agent.post(running.proxy_path(rollout_id), json=body).status_code == 200
        (call,) = calls_of(running, rollout_id)
    finally:
        running.process.stop()
    gap = max(map(abs, captured_minus_trainer(call, tiny_model_dir, temperature)))
    assert gap <= TRAINER_LOGPROB_TOLERANCE, f"vLLM's and the trainer's log-probs differ by up to {gap}"


def captured_minus_trainer(call: CallRecord, tiny_model_dir: Path, temperature: float) -> list[float]:
    """Per generated token, vLLM's captured log-prob minus verl's recomputation of it from the same weights
    (HF transformers, float32): the actor's logits divided by the temperature, no filter."""
    import torch
    from transformers import AutoModelForCausalLM
    from verl.utils.torch_functional import logprobs_from_logits

    assert call.prompt_token_ids is not None
    assert call.response_token_ids is not None
    assert call.response_logprobs is not None
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([[*call.prompt_token_ids, *call.response_token_ids]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    n_prompt = len(call.prompt_token_ids)
    response_logits = logits[n_prompt - 1 : -1] / temperature
    labels = torch.tensor(call.response_token_ids)
    trainer = logprobs_from_logits(response_logits, labels).tolist()
    return [vllm - ours for vllm, ours in zip(call.response_logprobs, trainer, strict=True)]


@pytest.mark.parametrize(
    ("filters", "biased"),
    [({"top_p": 1.0, "top_k": 0}, False), ({"top_k": 5}, True), ({"top_p": 0.5}, True)],
    ids=["no-filter", "top_k-5", "top_p-0.5"],
)
def test_a_top_p_or_top_k_filter_makes_vllms_log_probs_differ_from_the_trainers_recomputation(
    allow_gateway: RunningGateway, tiny_model_dir: Path, filters: dict[str, float], biased: bool
) -> None:
    """Why a run's own actor_rollout_ref.rollout.top_p < 1 or top_k > 0 is refused: vLLM (processed
    log-probs, as verl starts it) reports each token's log-prob under the filtered, renormalised
    distribution, and the trainer recomputes it from the whole one, so the importance weights would be off.
    The module's Allow gateway forwards the filter as a run's own setting would reach vLLM."""
    body = {"messages": MESSAGES, "max_tokens": 32, "seed": 43, "temperature": 1.0, **filters}
    call = captured(allow_gateway, body)
    assert {key: call.request[key] for key in filters} == filters  # vLLM sampled with exactly these
    differences = captured_minus_trainer(call, tiny_model_dir, temperature=1.0)
    shown = f"{filters}: vLLM's minus the trainer's log-probs range {min(differences)}..{max(differences)}"
    if biased:
        # The filter renormalises onto the tokens it keeps: every sampled token's vLLM log-prob is higher.
        assert min(differences) > 100 * TRAINER_LOGPROB_TOLERANCE, shown
    else:
        assert max(map(abs, differences)) <= TRAINER_LOGPROB_TOLERANCE, shown


def test_replies_that_do_not_survive_decoding_break_the_trajectory_but_lose_no_sampled_token(
    allow_gateway: RunningGateway,
) -> None:
    """Unconstrained, the random tiny model emits bytes that are not valid UTF-8: the agent gets U+FFFD in the
    text, sends that back, and vLLM's next prompt is not the previous prompt plus the sampled ids (as happens
    with real models when an agent edits or re-formats a reply). The adapter must then start a new row,
    never train on ids vLLM did not sample, and lose no sampled id."""
    rollout_id = new_rollout(allow_gateway)
    client = sdk_client(allow_gateway, rollout_id)
    messages: list[dict[str, str]] = [{"role": "user", "content": "Say a word."}]
    replies = []
    for turn in range(3):
        reply = client.chat.completions.create(
            model="anything",
            messages=messages,  # type: ignore[arg-type]
            max_tokens=16,
            seed=7 + turn,
            extra_body={"min_tokens": 16},
        )
        replies.append(reply.choices[0].message.content or "")
        messages += [
            {"role": "assistant", "content": replies[-1]},
            {"role": "user", "content": "Again."},
        ]
    assert any("\ufffd" in reply for reply in replies), f"every reply decoded cleanly: {replies!r}"
    document = _finished(allow_gateway, rollout_id)
    calls = list(document.model_calls)
    result = adapt_rollout(document, group_id="g1", config=AdapterConfig())
    assert result.counts.trajectory_breaks >= 1
    assert len(result.rows) == 1 + result.counts.trajectory_breaks
    trained = [
        token
        for row in result.rows
        for token, mask in zip(row.response_token_ids, row.response_mask, strict=True)
        if mask
    ]
    assert trained == [token for call in calls for token in call.response_token_ids or ()]


# -- capture an agent cannot turn off, and samples vLLM did not finish -------------------------------------


def test_an_agent_cannot_turn_the_capture_of_a_train_call_off(gateway: RunningGateway) -> None:
    """`logprobs: false` and `return_token_ids: false` were kept (the gateway only defaulted them), so such a
    call gave vLLM's answer without ids and silently no training row."""
    rollout_id = new_rollout(gateway)
    with gateway.agent(rollout_id) as agent:
        answer = agent.post(
            gateway.proxy_path(rollout_id),
            json={"messages": MESSAGES, "max_tokens": 8, "logprobs": False, "return_token_ids": False},
        )
    assert answer.status_code == 200, answer.text
    (call,) = calls_of(gateway, rollout_id)
    assert call.prompt_token_ids
    assert call.response_token_ids
    assert call.response_logprobs is not None
    assert len(call.response_logprobs) == len(call.response_token_ids)


def test_a_sample_vllms_engine_aborted_is_captured_as_aborted_and_never_trained_on(
    gateway: RunningGateway, vllm_server: VllmServer
) -> None:
    """verl aborts vLLM's requests at the engine (`abort_all_requests`, the server's `/pause?mode=abort`):
    vLLM then answers 200 with `finish_reason: abort` and the tokens so far. Before, that partial sample was
    captured like a finished one and trained on."""
    rollout_id = new_rollout(gateway)
    outcome: dict[str, httpx.Response] = {}

    def agent_call() -> None:
        with gateway.agent(rollout_id) as agent:
            agent.timeout = httpx.Timeout(600)
            long_call = {"messages": MESSAGES, "max_tokens": ABORTED_CALL_TOKENS, "ignore_eos": True}
            outcome["answer"] = agent.post(gateway.proxy_path(rollout_id), json=long_call)

    thread = threading.Thread(target=agent_call)
    thread.start()
    try:
        wait_until_vllm_runs(thread, outcome, gateway, vllm_server)
        engine_pause = httpx.post(
            f"{vllm_server.url}/pause", params={"mode": "abort", "clear_cache": "true"}, timeout=120
        )
        assert engine_pause.status_code == 200, engine_pause.text
        thread.join(timeout=600)
    finally:
        resumed = httpx.post(f"{vllm_server.url}/resume", timeout=120)
    assert resumed.status_code == 200, resumed.text
    answer = outcome["answer"]
    assert answer.status_code == 200, answer.text
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "abort"
    assert len(choice["token_ids"]) < ABORTED_CALL_TOKENS
    (call,) = calls_of(gateway, rollout_id)
    assert call.aborted
    assert "finish_reason abort" in (call.unreadable or "")
    result = adapt_rollout(_finished(gateway, rollout_id), group_id="g1", config=AdapterConfig())
    assert result.rows == ()
    assert result.counts.dropped_calls_failed == 1
