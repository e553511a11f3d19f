"""Claims lose nothing: an answer the claimer never read is asked for again with the same claim key (issue 24
item 2).

Before, a claim answer lost to a reset connection or a client timeout left its rollouts leased to nobody for
the whole lease (600 s in local mode, 120 s for the operator): one quickstart step took 603.8 s instead of 6.
The answers are lost here on purpose by a real TCP proxy (`tests/support/answer_dropper.py`) between the
claimer and the real gateway process; the agents are real processes that count their executions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import pytest
from fastapi import Request

from asyncrl.gateway.routes.common import unless_disconnected
from asyncrl.gateway.store import RolloutStore
from asyncrl.gateway_api.client import GatewayClient
from asyncrl.gateway_api.models import RolloutCreate
from asyncrl.local.agents import LocalAgents
from asyncrl.rollouts import RolloutState
from tests.gateway.conftest import RunningGateway, create_rollouts
from tests.support.answer_dropper import dropping_answers
from tests.support.kube import counting_agent_template, executions_per_rollout

CLAIM = b"POST /api/rollouts/claim"
A_ROLLOUT = b'"rollout_id"'  # an answer that hands out at least one rollout
LAUNCH_DEADLINE_SECONDS = 30  # the lease a lost answer used to cost: 600 s locally, 120 s in the operator
FINISH_DEADLINE_SECONDS = 120


def _ids(answer: dict[str, list[dict[str, object]]]) -> list[object]:
    return [rollout["rollout_id"] for rollout in answer["rollouts"]]


def test_a_repeated_claim_key_gets_the_rollouts_it_holds_and_no_others(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1", "r2")
        first = {"limit": 1, "wait_seconds": 0, "lease_seconds": 600, "claim_key": "claim-a"}
        assert _ids(admin.post("/api/rollouts/claim", json=first).json()) == ["r1"]
        # The answer was lost: the same key again gets r1 back, not r2 and not nothing.
        assert _ids(admin.post("/api/rollouts/claim", json=first).json()) == ["r1"]
        # r1 stays leased to that claim: another claimer gets the rest.
        other = {"limit": 10, "wait_seconds": 0, "lease_seconds": 600, "claim_key": "claim-b"}
        assert _ids(admin.post("/api/rollouts/claim", json=other).json()) == ["r2"]
        # Once launched, a rollout is no longer handed out, not even to the key that took it.
        assert admin.post("/api/rollouts/r1/launch", json={"launch_id": "l1"}).status_code == 200
        assert _ids(admin.post("/api/rollouts/claim", json=first).json()) == []
        # A takeover (a restarted operator) moves a lease to its own key; the old key holds nothing then.
        takeover = {"wait_seconds": 0, "takeover": True, "claim_key": "claim-c"}
        assert _ids(admin.post("/api/rollouts/claim", json=takeover).json()) == ["r2"]
        assert _ids(admin.post("/api/rollouts/claim", json=other).json()) == []
        bad = admin.post("/api/rollouts/claim", json={"claim_key": "has spaces"})
        assert bad.status_code == 422
        assert bad.json()["fields"][0]["field"] == "claim_key"


def test_a_claim_whose_answer_is_lost_is_answered_again_by_the_client(gateway: RunningGateway) -> None:
    """The trainer's and operator's client: the reset claim is resent with its key and gets the rollout."""
    with dropping_answers(gateway.url, request_prefix=CLAIM, marker=A_ROLLOUT) as proxy:

        async def scenario() -> tuple[list[str], list[str]]:
            async with (
                GatewayClient(proxy.url, gateway.key) as client,
                GatewayClient(gateway.url, gateway.key) as direct,
            ):
                await direct.create_rollouts([RolloutCreate(rollout_id="r1", group_id="g", step=0)])
                claimed = await client.claim(wait_seconds=5, lease_seconds=600)
                offered_again = await direct.claim(wait_seconds=0)
                return [r.rollout_id for r in claimed], [r.rollout_id for r in offered_again]

        claimed, offered_again = asyncio.run(scenario())
    assert len(proxy.dropped) == 1  # the gateway did answer r1, and that answer was lost
    assert b'"r1"' in proxy.dropped[0]
    assert claimed == ["r1"]
    assert offered_again == []  # held by the claim that read it: not handed to anyone else


def test_a_claim_whose_answer_never_comes_is_asked_for_again_after_the_timeout(
    gateway: RunningGateway,
) -> None:
    """The other way an answer is lost: it never arrives, and the client times out (a gateway under load)."""
    with dropping_answers(gateway.url, request_prefix=CLAIM, marker=A_ROLLOUT, swallow=True) as proxy:

        async def scenario() -> list[str]:
            async with (
                GatewayClient(proxy.url, gateway.key, timeout_seconds=5) as client,
                GatewayClient(gateway.url, gateway.key) as direct,
            ):
                await direct.create_rollouts([RolloutCreate(rollout_id="r1", group_id="g", step=0)])
                return [r.rollout_id for r in await client.claim(wait_seconds=0, lease_seconds=600)]

        claimed = asyncio.run(scenario())
    assert len(proxy.dropped) == 1  # the first answer (r1) never reached the client
    assert claimed == ["r1"]


def test_a_claim_still_waiting_under_a_key_that_was_answered_meanwhile_takes_nothing_more() -> None:
    """A request whose client left unnoticed (its key was answered to the client's retry) must not lease new
    rollouts to nobody once the answered ones are launched. The store in-process, on one event loop."""

    async def scenario() -> tuple[list[str], list[str]]:
        store = RolloutStore()
        store.create([RolloutCreate(rollout_id="r1", group_id="g", step=0)])
        await store.claim(limit=1, wait_seconds=0, lease_seconds=600, claim_key="claim-gone")
        forgotten = asyncio.create_task(
            store.claim(limit=10, wait_seconds=30, lease_seconds=600, claim_key="claim-k")
        )
        await asyncio.sleep(0)  # it waits: r1 is leased
        retried = await store.claim(
            limit=10, wait_seconds=0, lease_seconds=600, takeover=True, claim_key="claim-k"
        )
        assert [r.rollout_id for r in retried] == ["r1"]
        # It returns at once with what its key holds (it would wait 30 s, then lease r2 to nobody).
        forgotten_got = [r.rollout_id for r in await asyncio.wait_for(forgotten, timeout=10)]
        store.launch("r1", launch_id="l1")
        store.create([RolloutCreate(rollout_id="r2", group_id="g", step=0)])
        offered = await store.claim(limit=10, wait_seconds=0, lease_seconds=600, claim_key="claim-next")
        return forgotten_got, [r.rollout_id for r in offered]

    forgotten_got, offered = asyncio.run(scenario())
    assert forgotten_got == ["r1"]  # what its key held; it took nothing more
    assert offered == ["r2"]  # r2 is not leased to nobody


class _LeavingClient:
    """An ASGI request whose client leaves the moment `leave()` is called (what `receive()` then answers)."""

    def __init__(self) -> None:
        self.left = asyncio.Event()

    async def receive(self) -> dict[str, str]:
        await self.left.wait()
        return {"type": "http.disconnect"}


@pytest.mark.parametrize("claim_key", [None, "claim-k"])
def test_a_claim_woken_in_the_same_turn_as_its_claimers_disconnect_gives_its_lease_back(
    claim_key: str | None,
) -> None:
    """The wake-up that ends a long-poll (a new rollout) and the closed connection of a claimer that gave up
    can be read in the same loop turn: the claim then ended as the disconnect was seen, and the rollout was
    leased to a claimer that would never read it (600 s). Seen in CI: `test_a_claimer_that_disconnects_during_
    the_long_poll_leases_nothing` got nothing for 30 s. The store and the route's race in-process."""

    async def scenario() -> tuple[object, list[str]]:
        store = RolloutStore()
        client = _LeavingClient()
        waiting = asyncio.create_task(
            unless_disconnected(
                cast(Request, client),
                store.claim(limit=1, wait_seconds=30, lease_seconds=600, claim_key=claim_key),
                undo=store.release,
            )
        )
        for _ in range(5):
            await asyncio.sleep(0)  # the claim waits on the queue and the request on its disconnect
        client.left.set()  # the claimer is gone, and in the same turn a rollout arrives
        store.create([RolloutCreate(rollout_id="r1", group_id="g", step=0)])
        answered = await asyncio.wait_for(waiting, timeout=10)
        offered = await store.claim(limit=10, wait_seconds=0, lease_seconds=600, claim_key="claim-next")
        return answered, [r.rollout_id for r in offered]

    answered, offered = asyncio.run(scenario())
    assert answered is None  # nothing is answered to a claimer that is gone
    assert offered == ["r1"]  # and r1 is not leased to it


def test_releasing_a_claim_offers_its_unlaunched_rollouts_at_once_and_leaves_launched_ones() -> None:
    async def scenario() -> list[str]:
        store = RolloutStore()
        store.create([RolloutCreate(rollout_id=r, group_id="g", step=0) for r in ("r1", "r2")])
        claimed = await store.claim(limit=10, wait_seconds=0, lease_seconds=600)
        store.launch("r1", launch_id="l1")
        assert store.release(claimed) == 1
        return [r.rollout_id for r in await store.claim(limit=10, wait_seconds=0, lease_seconds=600)]

    assert asyncio.run(scenario()) == ["r2"]


@pytest.mark.slow
def test_local_agents_launch_a_rollout_whose_claim_answer_was_lost_at_once_and_exactly_once(
    gateway: RunningGateway, tmp_path: Path
) -> None:
    """Local mode's runner (`local/agents.py`) claims through the proxy; its agents run as real processes."""
    executions = tmp_path / "executions.log"
    with dropping_answers(gateway.url, request_prefix=CLAIM, marker=A_ROLLOUT) as proxy:

        async def scenario() -> dict[str, int]:
            async with (
                GatewayClient(proxy.url, gateway.key) as claimer,
                GatewayClient(gateway.url, gateway.key) as trainer,
            ):
                agents = LocalAgents(
                    gateway=claimer,
                    gateway_url=gateway.url,  # the agents' own calls do not pass the proxy
                    gateway_key=gateway.key,
                    template=counting_agent_template(executions),
                    run_name="lost",
                    timeout_seconds=120,
                    max_active=4,
                    log_dir=tmp_path,
                )
                runner = asyncio.create_task(agents.run())
                try:
                    await trainer.create_rollouts(
                        [RolloutCreate(rollout_id="r1", group_id="g", step=0, input={"behaviour": "ok"})]
                    )
                    await _until(
                        lambda: executions_per_rollout(executions)["r1"] > 0,
                        LAUNCH_DEADLINE_SECONDS,
                        "the agent of r1 to start (a lost claim answer used to cost the 600 s lease)",
                    )

                    async def finished() -> bool:
                        return (await trainer.get_rollout("r1")).state is RolloutState.SUCCEEDED

                    await _until_async(finished, FINISH_DEADLINE_SECONDS, "r1 to succeed")
                finally:
                    runner.cancel()
                    await asyncio.gather(runner, return_exceptions=True)
            return dict(executions_per_rollout(executions))

        counted = asyncio.run(scenario())
    assert len(proxy.dropped) == 1  # r1's claim answer was lost
    assert b'"r1"' in proxy.dropped[0]
    assert counted == {"r1": 1}  # launched once, from the repeated claim


async def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    async def check() -> bool:
        return condition()

    await _until_async(check, timeout, what)


async def _until_async(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    """Wait for `condition` on the running loop (the agents' runner shares it), checking every 0.2 s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.2)
