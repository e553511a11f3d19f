"""Local mode loses no agent's outcome: a state report lost on its way to the gateway is sent again.

Found by the soak (benchmarks/soak.py, docs/benchmarks.md): with faults between local mode and the gateway,
150 agents that exited 0 were recorded `timed_out` (their `succeeded` report was reset and only logged), and
3 groups ran twice (a lost `running` report made the later `succeeded` a 409 from `queued`, so the rollout
stayed queued for the 600 s lease and was claimed again). Here the reports are lost on purpose by a real TCP
proxy between local mode's runner and the real gateway process (`tests/support/answer_dropper.py`, losing the
request before the gateway sees it); the agents are real processes that count their executions.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from asyncrl.gateway_api.client import GatewayClient
from asyncrl.gateway_api.models import RolloutCreate
from asyncrl.local.agents import LocalAgents
from asyncrl.rollouts import RolloutState
from tests.gateway.conftest import RunningGateway
from tests.gateway.test_lost_claims import _until_async
from tests.support.answer_dropper import dropping_answers
from tests.support.kube import counting_agent_template, executions_per_rollout

TRANSITION = b"POST /api/rollouts/r1/transition"
ROLLOUT_TIMEOUT_SECONDS = 60  # a lost final report used to leave the rollout running until this timeout
OUTCOME_DEADLINE_SECONDS = 45  # well within it, and far from the 600 s lease a lost `running` cost


@pytest.mark.slow
@pytest.mark.parametrize(
    ("skip", "lost"),
    [(1, "the succeeded report"), (0, "the running report")],
)
def test_a_lost_state_report_is_sent_again_and_the_agent_runs_once(
    gateway: RunningGateway, tmp_path: Path, skip: int, lost: str
) -> None:
    executions = tmp_path / "executions.log"
    with dropping_answers(
        gateway.url, request_prefix=TRANSITION, marker=b"", lose_requests=True, skip=skip
    ) as proxy:

        async def scenario() -> RolloutState:
            async with (
                GatewayClient(proxy.url, gateway.key) as runner_client,
                GatewayClient(gateway.url, gateway.key) as trainer,
            ):
                agents = LocalAgents(
                    gateway=runner_client,
                    gateway_url=gateway.url,  # the agents' own calls do not pass the proxy
                    gateway_key=gateway.key,
                    template=counting_agent_template(executions),
                    run_name="reports",
                    timeout_seconds=ROLLOUT_TIMEOUT_SECONDS,
                    max_active=4,
                    log_dir=tmp_path,
                )
                runner = asyncio.create_task(agents.run())
                try:
                    await trainer.create_rollouts(
                        [
                            RolloutCreate(
                                rollout_id="r1",
                                group_id="g",
                                step=0,
                                input={"behaviour": "ok"},
                                timeout_seconds=ROLLOUT_TIMEOUT_SECONDS,
                            )
                        ]
                    )

                    async def ended() -> bool:
                        return (await trainer.get_rollout("r1")).state.is_terminal

                    await _until_async(ended, OUTCOME_DEADLINE_SECONDS, f"r1 to end after {lost} was lost")
                    return (await trainer.get_rollout("r1")).state
                finally:
                    runner.cancel()
                    await asyncio.gather(runner, return_exceptions=True)

        state = asyncio.run(scenario())
    assert len(proxy.dropped) == 1, lost  # the report was lost once, before the gateway saw it
    assert state is RolloutState.SUCCEEDED, lost
    assert executions_per_rollout(executions) == {"r1": 1}
