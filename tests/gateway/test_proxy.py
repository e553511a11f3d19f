"""The model-call proxy over real HTTP: wire contract, pause/drain, capture, auth and errors."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx

from tests.gateway.conftest import RunningGateway, create_rollouts, launch_gateway

CHAT = {"model": "whatever-the-agent-says", "messages": [{"role": "user", "content": "two words"}]}


def test_chat_call_is_forwarded_with_our_model_and_captured_with_token_ids(
    full_capture_gateway: RunningGateway,
) -> None:
    gateway = full_capture_gateway  # the request JSON is shown in Full capture
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        admin.post("/proxy/resume", json={"model_version": 7})
        response = agent.post(gateway.proxy_path("r1"), json=CHAT)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "served-model"
        assert response.json()["choices"][0]["message"]["content"].startswith("echo 2 words")

        events = admin.get("/api/rollouts/r1/events").json()
    (call,) = events["model_calls"]
    assert call["attempt_id"] == "a1"
    assert call["status"] == 200
    assert call["model_version"] == 7
    assert call["request"]["messages"] == CHAT["messages"]
    assert len(call["prompt_token_ids"]) == 2
    assert len(call["response_token_ids"]) == len(call["response_logprobs"]) > 0
    assert call["latency_seconds"] >= 0


def test_completions_endpoint_captures_token_logprobs(gateway: RunningGateway) -> None:
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        response = agent.post(gateway.proxy_path("r1", "completions"), json={"prompt": "a b c"})
        assert response.status_code == 200
        (call,) = admin.get("/api/rollouts/r1/events").json()["model_calls"]
    assert call["endpoint"] == "completions"
    assert len(call["response_logprobs"]) == len(call["response_token_ids"])


def test_paused_gateway_answers_429_with_retry_after_and_resume_is_idempotent(
    reject_gateway: RunningGateway,
) -> None:
    with reject_gateway.management() as admin, reject_gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        paused = admin.post("/proxy/pause", json={"reason": "weight update", "retry_after_seconds": 3}).json()
        assert paused["paused"] is True
        assert paused["reason"] == "weight update"

        rejected = agent.post(reject_gateway.proxy_path("r1"), json=CHAT)
        assert rejected.status_code == 429
        assert rejected.headers["retry-after"] == "3"
        assert rejected.headers["x-agl-paused"] == "true"
        assert rejected.json() == {"error": "gateway paused", "reason": "weight update"}

        state = admin.get("/proxy/state").json()
        assert state == {
            "paused": True,
            "retry_after_seconds": 3,
            "reason": "weight update",
            "inflight": 0,
            "model_version": None,
        }
        for _ in range(2):
            resumed = admin.post("/proxy/resume").json()
            assert resumed["paused"] is False
            assert resumed["retry_after_seconds"] == 5
        assert agent.post(reject_gateway.proxy_path("r1"), json=CHAT).status_code == 200


def test_pause_with_wait_returns_when_the_last_inflight_call_finishes(gateway: RunningGateway) -> None:
    rollouts = [f"r{i}" for i in range(8)]
    with gateway.management() as admin:
        create_rollouts(admin, *rollouts)

    async def scenario() -> tuple[list[int], dict[str, object], float, dict[str, object]]:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
            admin_headers = {"authorization": f"Bearer {gateway.key}"}

            async def call(rollout_id: str, delay: float) -> int:
                from asyncrl.gateway_api.tokens import agent_token

                headers = {"authorization": f"Bearer {agent_token(gateway.key, rollout_id)}"}
                body = {**CHAT, "fake_delay_seconds": delay}
                response = await client.post(gateway.proxy_path(rollout_id), json=body, headers=headers)
                return response.status_code

            calls = [asyncio.create_task(call(rid, 0.4 + 0.1 * i)) for i, rid in enumerate(rollouts)]
            while (await client.get("/proxy/state", headers=admin_headers)).json()["inflight"] < len(
                rollouts
            ):
                await asyncio.sleep(0.01)
            inflight = (await client.get("/proxy/state", headers=admin_headers)).json()
            started = time.monotonic()
            drained = await client.post(
                "/proxy/pause?wait=30", json={"reason": "update"}, headers=admin_headers
            )
            waited = time.monotonic() - started
            statuses = await asyncio.gather(*calls)
            return statuses, drained.json(), waited, inflight

    statuses, drained, waited, inflight = asyncio.run(scenario())
    assert inflight["inflight"] == len(rollouts)
    assert statuses == [200] * len(rollouts)
    assert drained["drained"] is True
    assert drained["inflight"] == 0
    assert drained["inflight_at_pause"] == len(rollouts)
    # The slowest call sleeps 1.1 s upstream; the wait ends when it does, not on a polling tick later.
    assert 0.3 < float(drained["drain_seconds"]) < 1.5  # type: ignore[arg-type]
    assert waited < 2.0


def test_inflight_returns_to_zero_when_clients_disconnect_or_upstream_fails(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1", "r2")

    async def scenario() -> None:
        from asyncrl.gateway_api.tokens import agent_token

        async with httpx.AsyncClient(base_url=gateway.url, timeout=30) as client:
            headers = {"authorization": f"Bearer {agent_token(gateway.key, 'r1')}"}
            slow = asyncio.create_task(
                client.post(gateway.proxy_path("r1"), json={**CHAT, "fake_delay_seconds": 5}, headers=headers)
            )
            await asyncio.sleep(0.5)
            slow.cancel()  # the client goes away mid-call
            failing = await client.post(
                gateway.proxy_path("r1"), json={**CHAT, "fake_status": 500}, headers=headers
            )
            assert failing.status_code == 500

    asyncio.run(scenario())
    with gateway.management() as admin:
        drained = admin.get("/proxy/state?wait=10").json()
    assert drained["inflight"] == 0


def test_agent_tokens_are_scoped_to_their_rollout(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1", "r2")
    anonymous = httpx.post(gateway.url + gateway.proxy_path("r1"), json=CHAT)
    assert anonymous.status_code == 401
    with gateway.agent("r2") as other:
        assert other.post(gateway.proxy_path("r1"), json=CHAT).status_code == 403
        assert (
            other.post("/api/rollouts/r1/attempt/a1/events", json={"event_type": "reward"}).status_code == 403
        )
        assert other.get("/proxy/state").status_code == 403
        assert other.post("/proxy/pause").status_code == 403


def test_bad_requests_get_clear_errors(gateway: RunningGateway) -> None:
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        invalid = agent.post(
            gateway.proxy_path("r1"), content=b"{not json", headers={"content-type": "application/json"}
        )
        assert invalid.status_code == 400
        assert invalid.json()["error"] == "request body is not valid JSON"

        streaming = agent.post(gateway.proxy_path("r1"), json={**CHAT, "stream": "please"})
        assert streaming.status_code == 400  # streaming is relayed (test_streaming.py); a bad flag is not
        assert streaming.json()["field"] == "stream"

        assert agent.post(gateway.proxy_path("r1", mode="eval"), json=CHAT).status_code == 404
        assert agent.post(gateway.proxy_path("r1", endpoint="embeddings"), json=CHAT).status_code == 404
        assert admin.post(gateway.proxy_path("missing"), json=CHAT).json() == {
            "error": "unknown rollout",
            "rollout_id": "missing",
        }

        huge = {"messages": [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]}
        assert agent.post(gateway.proxy_path("r1"), json=huge).status_code == 413
        assert admin.post("/api/rollouts", content=b"[" + b" " * (9 * 1024 * 1024) + b"]").status_code == 413
        assert (
            admin.post(
                "/api/rollouts", content=b"[{", headers={"content-type": "application/json"}
            ).status_code
            == 400
        )

        # The gateway is still healthy after all of that.
        assert agent.post(gateway.proxy_path("r1"), json=CHAT).status_code == 200


def test_unreachable_upstream_is_retried_then_502(tmp_path: Path) -> None:
    from asyncrl.testing.controlplane import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    running = launch_gateway([dead], tmp_path)
    try:
        with running.management() as admin, running.agent("r1") as agent:
            create_rollouts(admin, "r1")
            started = time.monotonic()
            response = agent.post(running.proxy_path("r1"), json=CHAT)
            assert response.status_code == 502
            assert response.json()["error"] == "upstream unavailable"
            assert response.json()["attempts"] == 4
            assert time.monotonic() - started >= 0.3  # backoff 0.1 + 0.2 + 0.4 between attempts
            assert admin.get("/proxy/state").json()["inflight"] == 0
    finally:
        running.process.stop()


def test_slow_upstream_gives_504(upstream_url: str, tmp_path: Path) -> None:
    running = launch_gateway([upstream_url], tmp_path, "--upstream-timeout-seconds", "0.5")
    try:
        with running.management() as admin, running.agent("r1") as agent:
            create_rollouts(admin, "r1")
            response = agent.post(running.proxy_path("r1"), json={**CHAT, "fake_delay_seconds": 3})
            assert response.status_code == 504
            assert response.json()["error"] == "upstream timeout"
    finally:
        running.process.stop()


def test_metrics_health_and_readiness(reject_gateway: RunningGateway) -> None:
    with reject_gateway.management() as admin, reject_gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        agent.post(reject_gateway.proxy_path("r1"), json=CHAT)
        admin.post("/proxy/pause")
        agent.post(reject_gateway.proxy_path("r1"), json=CHAT)
        metrics = httpx.get(reject_gateway.url + "/metrics").text
        assert httpx.get(reject_gateway.url + "/healthz").status_code == 200
        assert httpx.get(reject_gateway.url + "/readyz").json() == {"ready": True}
    assert 'asyncrl_gateway_requests_total{code="200",route="proxy"} 1.0' in metrics
    assert 'asyncrl_gateway_requests_total{code="429",route="proxy"} 1.0' in metrics
    assert "asyncrl_gateway_paused_rejections_total 1.0" in metrics
    assert "asyncrl_gateway_paused 1.0" in metrics
    assert 'asyncrl_gateway_rollouts{state="queued"} 1.0' in metrics
    assert "asyncrl_gateway_proxy_latency_seconds_count 2.0" in metrics
