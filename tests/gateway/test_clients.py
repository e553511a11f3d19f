"""The trainer/operator client and the agent helper against a real gateway process."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from asyncrl.agent import AgentEnvironment, AgentEnvironmentError, chat, openai_client, report_reward
from asyncrl.gateway_api.client import GatewayClient, GatewayError
from asyncrl.gateway_api.models import RolloutCreate, WindowSummary
from asyncrl.rollouts import RolloutState
from tests.gateway.conftest import RunningGateway


def _agent_env(gateway: RunningGateway, rollout_id: str) -> AgentEnvironment:
    return AgentEnvironment.for_rollout(
        gateway_url=gateway.url, gateway_key=gateway.key, rollout_id=rollout_id, attempt_id="a1"
    )


def test_client_drives_a_rollout_from_creation_to_the_completion_feed(gateway: RunningGateway) -> None:
    async def scenario() -> None:
        async with GatewayClient(gateway.url, gateway.key) as client:
            created = await client.create_rollouts(
                [RolloutCreate(rollout_id=f"r{i}", group_id="g", step=0, input={"i": i}) for i in range(2)]
            )
            assert [r.state for r in created] == [RolloutState.QUEUED] * 2
            claimed = await client.claim(wait_seconds=1)
            assert {r.rollout_id for r in claimed} == {"r0", "r1"}
            for rollout in claimed:
                await client.transition(rollout.rollout_id, RolloutState.RUNNING, attempt_id="a1")
                await client.transition(rollout.rollout_id, RolloutState.SUCCEEDED)
            page = await client.completions(after=0, wait_seconds=1)
            assert [e.rollout_id for e in page.entries] == ["r0", "r1"]
            stats = await client.stats()
            assert stats.rollouts[RolloutState.SUCCEEDED] == 2
            assert stats.rollouts[RolloutState.QUEUED] == 0
            assert stats.finished_totals[RolloutState.SUCCEEDED] == 2
            assert stats.cursor == page.cursor
            listed, cursor = await client.list_rollouts(state=RolloutState.SUCCEEDED)
            assert len(listed) == 2
            assert cursor == page.cursor
            assert await client.delete_rollouts(["r0", "r1"]) == 2

            with pytest.raises(GatewayError) as error:
                await client.get_rollout("r0")
            assert error.value.status == 404

            await client.put_summary(WindowSummary(step=3, active_groups=2))
            summary = await client.summary()
            assert summary is not None
            assert summary.step == 3
            drained = await client.pause(reason="update", wait_seconds=5)
            assert drained.drained
            assert drained.inflight_at_pause == 0
            assert (await client.resume(model_version=4)).model_version == 4

    asyncio.run(scenario())


def test_agent_helper_waits_out_a_pause_and_reports_its_reward(reject_gateway: RunningGateway) -> None:
    with reject_gateway.management() as admin:
        admin.post("/api/rollouts", json=[{"rollout_id": "r1", "group_id": "g", "step": 0}])
        admin.post("/proxy/pause", json={"reason": "update", "retry_after_seconds": 1})
        threading.Timer(1.5, lambda: reject_gateway.management().post("/proxy/resume")).start()
        env = _agent_env(reject_gateway, "r1")
        started = time.monotonic()
        answer = chat([{"role": "user", "content": "hello there"}], env)
        assert time.monotonic() - started >= 1.0  # it waited for the resume
        assert answer["choices"][0]["message"]["content"].startswith("echo 2 words")

        report_reward(0.5, env)
        assert admin.get("/api/rollouts/r1").json()["reward"] == 0.5
        metrics = admin.get("/metrics").text
    rejections = next(
        line for line in metrics.splitlines() if line.startswith("asyncrl_gateway_paused_rejections_total")
    )
    assert float(rejections.split()[1]) >= 1  # the agent did meet the pause and retried


def test_openai_client_from_the_helper_retries_429_with_retry_after(reject_gateway: RunningGateway) -> None:
    with reject_gateway.management() as admin:
        admin.post("/api/rollouts", json=[{"rollout_id": "r1", "group_id": "g", "step": 0}])
        admin.post("/proxy/pause", json={"reason": "update", "retry_after_seconds": 1})
        threading.Timer(1.5, lambda: reject_gateway.management().post("/proxy/resume")).start()
        client = openai_client(_agent_env(reject_gateway, "r1"))
        completion = client.chat.completions.create(
            model="anything", messages=[{"role": "user", "content": "one two three"}]
        )
    assert completion.choices[0].message.content is not None
    assert completion.choices[0].message.content.startswith("echo 3 words")


def test_agent_environment_names_missing_variables() -> None:
    with pytest.raises(AgentEnvironmentError, match="AGL_EVENT_URL, AGL_KEY"):
        AgentEnvironment.from_env({"AGL_OPENAI_BASE_URL": "http://x"})
    env = AgentEnvironment.for_rollout(
        gateway_url="http://gw:8090/", gateway_key="k", rollout_id="r", attempt_id="a"
    )
    assert AgentEnvironment.from_env(env.as_env()) == env
    assert env.openai_base_url == "http://gw:8090/proxy/rollout/r/attempt/a/mode/train/openai/v1"
