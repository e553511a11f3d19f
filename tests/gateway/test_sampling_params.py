"""spec.gateway.samplingParams: the run's rollout sampling on train-mode calls, over real HTTP and as a rule.

What the upstream received is read back from the fake upstream's `/stats` (the last request's settings), so
these tests see what vLLM would see.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from asyncrl.api import InvalidRunError, load_run
from asyncrl.gateway.sampling import SamplingRefused, apply_rollout_sampling
from asyncrl.rollout_sampling import RolloutSampling, SamplingParamsPolicy, rollout_sampling_of
from asyncrl.testing.waiting import wait_for
from tests.gateway.conftest import RunningGateway, create_rollouts, launch_gateway
from tests.support.kube import run_manifest

MESSAGES = [{"role": "user", "content": "two words"}]
RUN = RolloutSampling(temperature=0.9, top_p=1.0, top_k=-1)
Launcher = Callable[[str], RunningGateway]
RUN_FLAGS = ["--rollout-temperature=0.9", "--rollout-top-p=1.0", "--rollout-top-k=-1"]


def upstream_saw(upstream_url: str) -> dict[str, object]:
    return dict(httpx.get(f"{upstream_url}/stats").json()["last_sampling"])


def overridden_calls(gateway: RunningGateway) -> float:
    text = httpx.get(f"{gateway.url}/metrics").text
    for line in text.splitlines():
        if line.startswith("asyncrl_gateway_sampling_overridden_total"):
            return float(line.split()[-1])
    raise AssertionError("asyncrl_gateway_sampling_overridden_total is not exported")


@pytest.fixture
def launch(upstream_url: str, tmp_path: Path) -> Iterator[Launcher]:
    started: list[RunningGateway] = []

    def start(policy: str) -> RunningGateway:
        # Full capture: the tests read the forwarded request in the events document.
        running = launch_gateway(
            [upstream_url], tmp_path, f"--sampling-params={policy}", "--capture=full", *RUN_FLAGS
        )
        started.append(running)
        return running

    yield start
    for running in started:
        running.process.stop()


def test_enforce_replaces_the_agents_settings_records_them_and_counts_the_call(
    launch: Launcher, upstream_url: str
) -> None:
    gateway = launch("Enforce")
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        asked = {"messages": MESSAGES, "temperature": 0.7, "top_p": 0.8}
        assert agent.post(gateway.proxy_path("r1"), json=asked).status_code == 200
        assert upstream_saw(upstream_url) == {"temperature": 0.9, "top_p": 1.0, "top_k": -1}
        # Omitted settings are sent too (vLLM would take them from the model's generation config); the run's
        # own values are not an override.
        same = {"messages": MESSAGES, "temperature": 0.9}
        assert agent.post(gateway.proxy_path("r1"), json=same).status_code == 200
        assert upstream_saw(upstream_url) == {"temperature": 0.9, "top_p": 1.0, "top_k": -1}
        calls = admin.get("/api/rollouts/r1/events").json()["model_calls"]
    assert [call["agent_sampling"] for call in calls] == [{"temperature": 0.7, "top_p": 0.8}, None]
    assert calls[0]["request"]["temperature"] == 0.9  # what was forwarded
    assert overridden_calls(gateway) == 1


def test_validation_calls_keep_the_agents_settings(launch: Launcher, upstream_url: str) -> None:
    gateway = launch("Enforce")
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        body = {"messages": MESSAGES, "temperature": 0.2}
        assert agent.post(gateway.proxy_path("r1", mode="val"), json=body).status_code == 200
    assert upstream_saw(upstream_url) == {"temperature": 0.2, "top_p": None, "top_k": None}
    assert overridden_calls(gateway) == 0


def test_reject_answers_400_naming_the_setting_and_forwards_nothing(
    launch: Launcher, upstream_url: str
) -> None:
    gateway = launch("Reject")
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        calls_before = httpx.get(f"{upstream_url}/stats").json()["calls"]
        refused = agent.post(gateway.proxy_path("r1"), json={"messages": MESSAGES, "top_k": 20})
        assert refused.status_code == 400
        assert "top_k=20" in refused.json()["detail"]
        assert httpx.get(f"{upstream_url}/stats").json()["calls"] == calls_before
        # The run's values, or none at all, pass.
        fine = agent.post(gateway.proxy_path("r1"), json={"messages": MESSAGES, "top_k": 0})
        assert fine.status_code == 200
        assert upstream_saw(upstream_url) == {"temperature": 0.9, "top_p": 1.0, "top_k": -1}


def test_allow_forwards_the_agents_settings_untouched(launch: Launcher, upstream_url: str) -> None:
    gateway = launch("Allow")
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        body = {"prompt": "a b", "temperature": 0.3, "top_k": 5}
        assert agent.post(gateway.proxy_path("r1", "completions"), json=body).status_code == 200
    assert upstream_saw(upstream_url) == {"temperature": 0.3, "top_p": None, "top_k": 5}
    assert overridden_calls(gateway) == 0


# -- every parameter that changes the distribution, not only temperature/top_p/top_k ------------------------

BIASED = {
    "logit_bias": {"65": 5.0},
    "min_tokens": 4,
    "repetition_penalty": 1.3,
    "frequency_penalty": 0.5,
    "bad_words": ["blue"],
    "response_format": {"type": "json_object"},
}
STRICT_TOOL = {
    "type": "function",
    "function": {"name": "f", "parameters": {"type": "object"}, "strict": True},
}
NEUTRAL = {
    "logit_bias": {},
    "min_tokens": 0,
    "repetition_penalty": 1,
    "min_p": 0,
    "frequency_penalty": 0,
    "presence_penalty": 0.0,
    "response_format": {"type": "text"},
    "tool_choice": "auto",
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "seed": 3,
    "stop": ["x"],
    "ignore_eos": True,
}


def upstream_calls(upstream_url: str) -> int:
    return int(httpx.get(f"{upstream_url}/stats").json()["calls"])


def test_enforce_removes_every_biasing_parameter_on_chat_completions_and_streams_and_records_them(
    launch: Launcher,
) -> None:
    gateway = launch("Enforce")
    forced = {"tools": [STRICT_TOOL], "tool_choice": "required"}
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        chat = {"messages": MESSAGES, **BIASED, **forced}
        assert agent.post(gateway.proxy_path("r1"), json=chat).status_code == 200
        text = {"prompt": "a b", "min_p": 0.2, "logit_bias": {"66": -100}}
        assert agent.post(gateway.proxy_path("r1", "completions"), json=text).status_code == 200
        streamed = {"messages": MESSAGES, "stream": True, "bad_words": ["red"]}
        with agent.stream("POST", gateway.proxy_path("r1"), json=streamed) as answer:
            assert answer.status_code == 200
            assert "[DONE]" in answer.read().decode()
        # A streamed call is captured once its relay has ended, which can be just after the agent read [DONE]
        # (a race reported in the closing note of 2026-12-05): wait for it rather than read too early.
        calls = wait_for(
            lambda: (
                found
                if len(found := admin.get("/api/rollouts/r1/events").json()["model_calls"]) == 3
                else None
            ),
            timeout=60,
            what="the three calls to be captured",
        )
    neutral = {"temperature": 0.9, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
    for call in calls:
        forwarded = call["request"]
        assert {key: forwarded[key] for key in neutral} == neutral
        assert not {"logit_bias", "min_tokens", "frequency_penalty", "bad_words"} & forwarded.keys()
    assert "tool_choice" not in calls[0]["request"]
    assert calls[0]["request"]["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert "response_format" not in calls[0]["request"]
    assert [call["agent_sampling"] for call in calls] == [
        {**BIASED, "tool_choice": "required", "tools[*].function.strict": ["f"]},
        {"min_p": 0.2, "logit_bias": {"66": -100}},
        {"bad_words": ["red"]},
    ]
    assert overridden_calls(gateway) == 3


@pytest.mark.parametrize(
    ("endpoint", "body", "named"),
    [
        ("chat/completions", {"messages": MESSAGES, "logit_bias": {"65": 5}}, "logit_bias={'65': 5}"),
        ("completions", {"prompt": "a", "min_tokens": 4}, "min_tokens=4"),
        ("chat/completions", {"messages": MESSAGES, "stream": True, "repetition_penalty": 1.2}, "repetition"),
        (
            "chat/completions",
            {"messages": MESSAGES, "tools": [STRICT_TOOL], "tool_choice": "required"},
            "tool_",
        ),
        ("chat/completions", {"messages": MESSAGES, "tools": [STRICT_TOOL]}, "tools[0].function.strict=True"),
        ("chat/completions", {"messages": MESSAGES, "structured_outputs": {"regex": "a+"}}, "structured_"),
    ],
)
def test_reject_answers_400_naming_a_biasing_parameter_and_forwards_nothing(
    launch: Launcher, upstream_url: str, endpoint: str, body: dict[str, object], named: str
) -> None:
    gateway = launch("Reject")
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        before = upstream_calls(upstream_url)
        refused = agent.post(gateway.proxy_path("r1", endpoint), json=body)
    assert refused.status_code == 400
    detail = refused.json()["detail"]
    assert named in detail
    assert "omit" in detail
    assert upstream_calls(upstream_url) == before


def test_reject_lets_neutral_values_through(launch: Launcher, upstream_url: str) -> None:
    gateway = launch("Reject")
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        before = upstream_calls(upstream_url)
        answer = agent.post(gateway.proxy_path("r1"), json={"messages": MESSAGES, **NEUTRAL})
        assert answer.status_code == 200, answer.text
        (call,) = admin.get("/api/rollouts/r1/events").json()["model_calls"]
    assert upstream_calls(upstream_url) == before + 1
    assert {key: call["request"][key] for key in NEUTRAL} == NEUTRAL
    assert call["agent_sampling"] is None


@pytest.mark.parametrize("value", [None, "0.9", True, float("nan")])
def test_values_that_are_not_the_runs_number_are_refused_under_reject(value: object) -> None:
    with pytest.raises(SamplingRefused, match="temperature"):
        apply_rollout_sampling(
            {"temperature": value}, policy=SamplingParamsPolicy.REJECT, rollout=RUN, train=True
        )


def test_the_runs_settings_come_from_verl_overrides_and_are_checked() -> None:
    assert rollout_sampling_of({}) == RolloutSampling(1.0, 1.0, -1)
    assert rollout_sampling_of({"actor_rollout_ref.rollout.temperature": 0.6}).temperature == 0.6
    manifest = run_manifest("r")
    manifest["spec"]["trainer"] = {
        "backend": "Verl",
        "gpus": 1,
        "verlOverrides": {"actor_rollout_ref": {"rollout": {"temperature": 0.8, "top_k": 0}}},
    }
    run = load_run(manifest)
    assert run.spec.trainer.rollout_sampling() == RolloutSampling(0.8, 1.0, 0)
    assert run.spec.gateway.sampling_params is SamplingParamsPolicy.ENFORCE
    manifest["spec"]["trainer"]["verlOverrides"] = {"actor_rollout_ref.rollout.temperature": "hot"}
    with pytest.raises(InvalidRunError, match=r"actor_rollout_ref.rollout.temperature must be a number"):
        load_run(manifest)
    manifest["spec"]["trainer"]["verlOverrides"] = {"actor_rollout_ref.rollout.temperature": 0}
    with pytest.raises(InvalidRunError, match="above 0"):
        load_run(manifest)
    manifest["spec"]["trainer"]["verlOverrides"] = {}
    manifest["spec"]["gateway"]["samplingParams"] = "enforce"  # the enum is CamelCase, as written
    with pytest.raises(InvalidRunError, match="samplingParams"):
        load_run(manifest)


def test_the_completions_capture_reads_prompt_token_ids_inside_the_choice(gateway: RunningGateway) -> None:
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        answer = agent.post(gateway.proxy_path("r1", "completions"), json={"prompt": "a b c"}).json()
        assert "prompt_token_ids" not in answer  # vLLM's text completion: in the choice only
        (call,) = admin.get("/api/rollouts/r1/events").json()["model_calls"]
    assert call["prompt_token_ids"] == answer["choices"][0]["prompt_token_ids"]
    assert len(call["prompt_token_ids"]) == 3
