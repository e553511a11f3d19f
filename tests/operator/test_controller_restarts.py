"""A run's controller started again after a failure: when, and how often (operator/handlers.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import kopf
import pytest

from asyncrl.operator import handlers

CLAIM_RETRY_SECONDS = 15  # a delay the failing supervisor asks for


def test_a_temporary_error_that_names_its_delay_is_retried_after_that_delay() -> None:
    claim_wait = kopf.TemporaryError("waiting for the claim", delay=CLAIM_RETRY_SECONDS)
    assert handlers.restart_delay(claim_wait, 37.0) == CLAIM_RETRY_SECONDS


def test_other_failures_take_the_restart_backoff() -> None:
    assert handlers.restart_delay(kopf.TemporaryError("no delay of its own", delay=None), 12.5) == 12.5
    assert handlers.restart_delay(RuntimeError("a bug"), 12.5) == 12.5


def test_the_supervisor_waits_what_the_controller_asked_then_starts_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counted, not timed: the controller runs twice, and the one wait between is the error's delay."""
    calls: list[dict[str, Any]] = []
    waits: list[float] = []

    async def controller(body: dict[str, Any], runtime: Any) -> None:
        calls.append(body)
        if len(calls) == 1:
            raise kopf.TemporaryError("waiting for the claim", delay=CLAIM_RETRY_SECONDS)

    async def read_run(namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": namespace, "name": name, "generation": 2}}

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(handlers, "run_controller", controller)
    monkeypatch.setattr(asyncio, "sleep", no_wait)
    runtime: Any = SimpleNamespace(kube=SimpleNamespace(read_run=read_run))
    body = {"metadata": {"namespace": "ns", "name": "run-a", "generation": 1}}
    asyncio.run(handlers._supervise(runtime, body))
    assert waits == [CLAIM_RETRY_SECONDS]
    assert len(calls) == 2
    assert calls[1]["metadata"]["generation"] == 2  # started again from the run as it is now


def test_a_cancelled_supervisor_stops_without_starting_the_controller_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[dict[str, Any]] = []

    async def controller(body: dict[str, Any], runtime: Any) -> None:
        calls.append(body)
        await asyncio.Event().wait()  # runs until cancelled, as a run's controller does

    async def supervise_then_cancel() -> None:
        body = {"metadata": {"namespace": "ns", "name": "run-a", "generation": 1}}
        task = asyncio.create_task(handlers._supervise(SimpleNamespace(), body))
        while not calls:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    monkeypatch.setattr(handlers, "run_controller", controller)
    asyncio.run(supervise_then_cancel())
    assert len(calls) == 1


def test_a_graceful_stop_cancels_every_run_before_waiting_for_any() -> None:
    """A run's task may take seconds to end once cancelled (its children's last calls). One after another,
    100 of them outlast the pod's grace period and the Lease expires instead of being released: the cleanup
    cancels them all, then waits. Checked by order (each task records when it was cancelled and when it
    ended), not by time."""
    order: list[str] = []

    async def slow_to_stop(name: str, release: asyncio.Event) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            order.append(f"cancelled {name}")
            await release.wait()  # its last calls: done only once every run has been told to stop
            order.append(f"ended {name}")
            raise

    async def stop_three() -> None:
        release = asyncio.Event()
        runs = {
            ("ns", name): handlers._RunTask(uid=name, task=asyncio.create_task(slow_to_stop(name, release)))
            for name in ("a", "b", "c")
        }
        await asyncio.sleep(0)  # the tasks start waiting
        stopped = asyncio.Event()

        class Renderer:
            async def close(self) -> None:
                stopped.set()

        runtime = SimpleNamespace(
            permissions_review=None, health=None, watches=[], runs=runs, renderer=Renderer(), fence=None
        )
        cleanup = asyncio.create_task(handlers._cleanup(kopf.Memo(runtime=runtime)))
        while len(order) < 3 and not cleanup.done():
            await asyncio.sleep(0)
        release.set()
        await cleanup
        assert stopped.is_set()

    asyncio.run(stop_three())
    assert order[:3] == ["cancelled a", "cancelled b", "cancelled c"], order
    assert sorted(order[3:]) == ["ended a", "ended b", "ended c"], order
