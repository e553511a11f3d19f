"""The collocated OpenAI-compatible server over real HTTP on 127.0.0.1: vLLM shapes, the policy's numbers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import torch

from asyncrl.capturing import CaptureMode
from asyncrl.gateway.capture import call_record, capture_call, request_overrides
from asyncrl.trainer.backends.reference import MODEL_VERSION_HEADER, ReferenceBackend
from asyncrl.trainer.backends.reference.sampling import SamplingParams, behaviour_log_probs
from tests.trainer.backends.support import Answer, post, serving

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "What is 2 + 2?"}]


def recomputed_log_probs(backend: ReferenceBackend, prompt: list[int], response: list[int]) -> list[float]:
    """The served model's log-softmax of each response token, from one full forward pass."""
    with torch.no_grad():
        logits = backend.server.policy.model(input_ids=torch.tensor([prompt + response])).logits[0]
    log_probs = torch.log_softmax(logits.float(), dim=-1)[len(prompt) - 1 : -1]
    return log_probs.gather(-1, torch.tensor(response).unsqueeze(-1)).squeeze(-1).tolist()


def call(backend: ReferenceBackend, *requests: tuple[str, dict[str, Any]]) -> list[Answer]:
    async def scenario() -> list[Answer]:
        async with serving(backend) as session:
            return [await post(session, path, body) for path, body in requests]

    return asyncio.run(scenario())


def test_chat_returns_token_ids_and_log_probs_that_the_model_reproduces() -> None:
    backend = ReferenceBackend()
    body = {"messages": MESSAGES, "logprobs": True, "return_token_ids": True, "max_tokens": 24, "seed": 1}
    [(status, headers, answer)] = call(backend, (CHAT, body))

    assert status == 200
    choice = answer["choices"][0]
    prompt, response = answer["prompt_token_ids"], choice["token_ids"]
    assert prompt == backend.tokenizer.encode(
        backend.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )
    assert 1 <= len(response) <= 24
    logprobs = [item["logprob"] for item in choice["logprobs"]["content"]]
    assert logprobs == pytest.approx(recomputed_log_probs(backend, prompt, response), abs=1e-4)
    assert [item["bytes"] for item in choice["logprobs"]["content"]] == [
        list(bytes([token])) if token < 256 else list(backend.tokenizer.convert_ids_to_tokens(token).encode())
        for token in response
    ]
    assert answer["usage"] == {
        "prompt_tokens": len(prompt),
        "completion_tokens": len(response),
        "total_tokens": len(prompt) + len(response),
    }
    assert answer["model_version"] == 0
    assert headers[MODEL_VERSION_HEADER] == "0"


def test_completions_return_token_logprobs_and_top_alternatives_in_vllm_shape() -> None:
    backend = ReferenceBackend()
    body = {"prompt": "Once upon", "logprobs": 3, "return_token_ids": True, "max_tokens": 6, "seed": 2}
    [(status, _headers, answer)] = call(backend, (COMPLETIONS, body))

    assert status == 200
    choice = answer["choices"][0]
    assert answer["object"] == "text_completion"
    assert choice["prompt_token_ids"] == list(b"Once upon")  # in the choice, as vLLM puts them
    assert "prompt_token_ids" not in answer
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == len(choice["token_ids"])
    assert logprobs["token_logprobs"] == pytest.approx(
        recomputed_log_probs(backend, choice["prompt_token_ids"], choice["token_ids"]), abs=1e-4
    )
    assert all(1 <= len(top) <= 3 for top in logprobs["top_logprobs"])
    assert choice["finish_reason"] in {"stop", "length"}


def test_token_ids_are_only_returned_when_asked_for() -> None:
    backend = ReferenceBackend()
    [(_, _, answer)] = call(backend, (CHAT, {"messages": MESSAGES, "max_tokens": 4}))
    assert answer["prompt_token_ids"] is None
    assert answer["choices"][0]["token_ids"] is None
    assert answer["choices"][0]["logprobs"] is None


def test_same_seed_gives_the_same_answer_and_n_gives_several() -> None:
    backend = ReferenceBackend()
    body = {"prompt": "abc", "max_tokens": 12, "seed": 7, "n": 3, "return_token_ids": True}
    (_, _, first), (_, _, again) = call(backend, (COMPLETIONS, body), (COMPLETIONS, body))
    assert [c["token_ids"] for c in first["choices"]] == [c["token_ids"] for c in again["choices"]]
    assert len(first["choices"]) == 3
    assert len({tuple(c["token_ids"]) for c in first["choices"]}) > 1


def test_a_stop_string_ends_the_text_before_it_and_keeps_its_token() -> None:
    backend = ReferenceBackend()
    seeded = {"prompt": "xyz", "max_tokens": 32, "seed": 5, "return_token_ids": True}
    [(_, _, free)] = call(backend, (COMPLETIONS, seeded))
    tokens = free["choices"][0]["token_ids"]
    index = next(
        i for i, token in enumerate(tokens) if i > 0 and 32 < token < 127 and token not in tokens[:i]
    )
    stop = chr(tokens[index])

    [(_, _, stopped)] = call(backend, (COMPLETIONS, seeded | {"stop": [stop]}))
    choice = stopped["choices"][0]
    assert choice["token_ids"] == tokens[: index + 1]
    assert choice["text"] == backend.tokenizer.decode(tokens[:index])
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", stop)


def test_greedy_sampling_reports_log_prob_zero_and_repeats_itself() -> None:
    backend = ReferenceBackend()
    greedy = {"prompt": "xyz", "max_tokens": 8, "temperature": 0, "logprobs": 0, "return_token_ids": True}
    (_, _, first), (_, _, again) = call(backend, (COMPLETIONS, greedy), (COMPLETIONS, greedy | {"seed": 3}))
    assert first["choices"][0]["token_ids"] == again["choices"][0]["token_ids"]
    assert first["choices"][0]["logprobs"]["token_logprobs"] == [0.0] * len(first["choices"][0]["token_ids"])


def test_max_tokens_bounds_the_answer_and_finish_reason_says_length() -> None:
    backend = ReferenceBackend()
    body = {"messages": MESSAGES, "max_tokens": 3, "return_token_ids": True, "seed": 0}
    [(_, _, answer)] = call(backend, (CHAT, body))
    choice = answer["choices"][0]
    assert len(choice["token_ids"]) <= 3
    assert choice["finish_reason"] == ("length" if len(choice["token_ids"]) == 3 else "stop")


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"model": "gpt-4", "prompt": "a"}, 404, "does not exist"),
        ({"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream: true"),
        ({"prompt": "a", "temperature": -1}, 400, "temperature"),
        ({"prompt": "a", "max_tokens": 5000}, 400, "maximum context length is 1024"),
        ({"prompt": ""}, 400, "empty"),
        ({"prompt": [1, 999]}, 400, "token ids"),
    ],
)
def test_bad_requests_get_openai_style_errors(body: dict[str, Any], status: int, fragment: str) -> None:
    [(answer_status, _, answer)] = call(ReferenceBackend(), (COMPLETIONS, body))
    assert answer_status == status
    assert fragment in answer["error"]["message"]


def test_health_and_models_name_the_model_and_its_version() -> None:
    backend = ReferenceBackend()

    async def scenario() -> tuple[Any, Any]:
        async with (
            serving(backend) as session,
            session.get("/health") as health,
            session.get("/v1/models") as models,
        ):
            return await health.json(), await models.json()

    health, models = asyncio.run(scenario())
    assert health == {"status": "ok", "model_version": 0}
    assert [model["id"] for model in models["data"]] == ["asyncrl-reference"]


def test_the_gateway_captures_token_ids_and_log_probs_from_its_answers() -> None:
    backend = ReferenceBackend()
    forwarded = request_overrides(
        {"messages": MESSAGES, "max_tokens": 8},
        endpoint="chat/completions",
        model="asyncrl-reference",
        capture=True,
    )
    [(status, _, answer)] = call(backend, (CHAT, forwarded))
    captured = call_record(
        *capture_call(
            mode=CaptureMode.COMPACT,
            attempt_id="a1",
            endpoint="chat/completions",
            status=status,
            latency_seconds=0.1,
            model_version=0,
            request_body=json.dumps(forwarded).encode(),
            response_body=json.dumps(answer).encode(),
            started_at=0.0,
        )
    ).model_dump(mode="json")
    assert captured["prompt_token_ids"] == answer["prompt_token_ids"]
    assert captured["response_token_ids"] == answer["choices"][0]["token_ids"]
    assert captured["response_logprobs"] == [
        item["logprob"] for item in answer["choices"][0]["logprobs"]["content"]
    ]
    assert len(captured["response_logprobs"]) == len(captured["response_token_ids"]) > 0


def test_behaviour_log_probs_follow_temperature_and_renormalise_over_the_nucleus() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    raw = torch.log_softmax(logits, dim=-1)

    assert torch.allclose(behaviour_log_probs(logits, SamplingParams(max_tokens=1)), raw)
    hot = behaviour_log_probs(logits, SamplingParams(max_tokens=1, temperature=2.0))
    assert torch.allclose(hot, torch.log_softmax(logits / 2.0, dim=-1))

    nucleus = behaviour_log_probs(logits, SamplingParams(max_tokens=1, top_p=0.8))
    kept = raw.exp()[:2]  # 0.64 + 0.24 is the smallest set reaching 0.8
    assert torch.allclose(nucleus[:2].exp(), kept / kept.sum())
    assert torch.isinf(nucleus[2:]).all()
