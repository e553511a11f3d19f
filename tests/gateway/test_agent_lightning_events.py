"""Agent Lightning v1.0 agents post their reward with extra fields; the real gateway takes it unchanged.

Their agents send `{"event_type": "reward", "data": {"value": ..., "source": ..., "reason": ...}}` (and some a
`metadata` object). The reward must be the number in `data.value`, and the other fields kept with the event,
so a migrated agent needs no change (docs/migrating-from-agent-lightning.md).
"""

from __future__ import annotations

from tests.gateway.conftest import RunningGateway, create_rollouts


def test_agent_lightning_reward_event_with_extra_fields(gateway: RunningGateway) -> None:
    data = {"value": 0.5, "source": "agent", "reason": "correct", "metadata": {"task_id": "t-7", "turns": 3}}
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        posted = agent.post("/api/rollouts/r1/attempt/a1/events", json={"event_type": "reward", "data": data})
        assert posted.status_code == 201, posted.text
        stored = admin.get("/api/rollouts/r1/events").json()
        assert stored["rollout"]["reward"] == 0.5
        (event,) = stored["events"]
        assert event["event_type"] == "reward"
        assert event["data"] == data
