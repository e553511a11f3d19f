"""The trainer's pauses carry a lease it renews while it holds them (asyncrl.trainer.pause_holding).

Against a real gateway process on 127.0.0.1, and a real trainer-side process killed with SIGKILL: before the
lease, a gateway paused by a trainer that died stayed paused, every agent's model call held until the hold
timeout, until a new trainer came and resumed it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.gateway_api.models import PauseView
from asyncrl.trainer.pause_holding import PauseHoldingClient
from tests.gateway.conftest import KEY, RunningGateway, launch_gateway
from tests.gateway.test_pauses import DEADLINE_SECONDS, metric

EXPIRED = "asyncrl_gateway_pause_lease_expirations_total"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[RunningGateway]:
    running = launch_gateway([], tmp_path)
    yield running
    running.process.stop()


def _state(gateway: RunningGateway) -> dict[str, Any]:
    with gateway.management() as admin:
        state: dict[str, Any] = admin.get("/proxy/state").json()
    return state


def _until(gateway: RunningGateway, holds: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not holds(state := _state(gateway)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {state}"
        time.sleep(0.05)
    return state


def _lease_end(state: dict[str, Any]) -> float:
    """When the lease ends, on this process's monotonic clock (the gateway's reading, give or take the
    answer's transit): a renewal moves it later, while the seconds left never exceed the lease."""
    return time.monotonic() + float(state["lease_seconds_left"])


def test_the_lease_is_renewed_while_held_and_no_longer_once_resumed(gateway: RunningGateway) -> None:
    reports: list[bool] = []

    async def scenario() -> None:
        async with PauseHoldingClient(
            gateway.url, KEY, report=reports.append, lease_seconds=30, renew_every_seconds=0.1
        ) as client:
            await client.pause(reason="update", wait_seconds=1)
            state = _state(gateway)
            assert 0 < state["lease_seconds_left"] <= 30
            first = _lease_end(state)
            # A renewal reached the gateway: the lease's end moved later than the pause set it.
            await asyncio.to_thread(
                _until, gateway, lambda state: _lease_end(state) > first + 0.05, "a renewal"
            )
            await client.resume(model_version=1)
            # Paused again by someone else with a short lease: a renewal still running would keep it paused.
            with gateway.management() as admin:
                admin.post("/proxy/pause", json={"reason": "by hand", "lease_seconds": 1})
            await asyncio.to_thread(_until, gateway, lambda state: not state["paused"], "the lease's end")

    asyncio.run(scenario())
    assert reports == [True, False]
    assert metric(gateway, EXPIRED) == 1  # the pause by hand, not the trainer's


def test_a_gateway_opened_under_a_held_pause_is_warned_of_once(
    gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, every renewal (every 10 s) repeated the warning for as long as the trainer held the pause."""
    answers: list[bool] = []  # `paused` as each renewal's answer said it

    class Counting(PauseHoldingClient):
        async def renew_pause(self, *, lease_seconds: float) -> PauseView:
            view = await super().renew_pause(lease_seconds=lease_seconds)
            answers.append(view.paused)
            return view

    async def scenario() -> None:
        async with Counting(
            gateway.url, KEY, report=lambda held: None, lease_seconds=30, renew_every_seconds=0.05
        ) as client:
            await client.pause(reason="update", wait_seconds=1)
            with gateway.management() as admin:  # opened by hand while the trainer still holds the pause
                assert admin.post("/proxy/resume", json={}).status_code == 200
            deadline = time.monotonic() + DEADLINE_SECONDS
            while answers.count(False) < 4:
                assert time.monotonic() < deadline, f"timed out waiting for renewals: {answers}"
                await asyncio.sleep(0.05)
            await client.resume(model_version=1)

    caplog.set_level(logging.WARNING, logger="asyncrl.trainer.pause_holding")
    asyncio.run(scenario())
    warnings = [r for r in caplog.records if "is open while the trainer holds its pause" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from asyncrl.trainer.pause_holding import PauseHoldingClient

    async def main() -> None:
        async with PauseHoldingClient(
            sys.argv[1], sys.argv[2], report=lambda held: None, lease_seconds=5, renew_every_seconds=0.2
        ) as client:
            await client.pause(reason="update, step 7", wait_seconds=1)
            print("paused", flush=True)
            await asyncio.Event().wait()  # updating, until killed

    asyncio.run(main())
    """
)


@pytest.mark.slow
def test_a_trainer_killed_while_it_holds_the_pause_leaves_a_gateway_that_resumes_by_itself(
    gateway: RunningGateway,
) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd() / "src"), str(Path.cwd())])}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, gateway.url, KEY], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "paused"
        first = _lease_end(_state(gateway))
        _until(gateway, lambda state: _lease_end(state) > first + 0.05, "a renewal")
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=DEADLINE_SECONDS)
        state = _until(gateway, lambda state: not state["paused"], "the gateway to resume by itself")
    finally:
        holder.kill()
        holder.wait()
    assert "lease_seconds_left" not in state
    assert metric(gateway, EXPIRED) == 1
    assert "the pause (update, step 7) ran out of its lease" in gateway.process.log()


def test_a_lease_shorter_than_its_renewal_period_is_refused() -> None:
    with pytest.raises(ValueError, match="renew_every_seconds"):
        PauseHoldingClient("http://127.0.0.1:9", KEY, report=print, lease_seconds=5, renew_every_seconds=5)
