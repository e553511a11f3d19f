"""The dispatcher's reports of agent Job outcomes and its judgement of launches without a Job, against a real
gateway process.

No control plane here: the Job watch's events are handed to the dispatcher as the watch delivers them, and
the agent Jobs the API server would list are given by a stand-in (the control-plane tests cover both for
real, e.g. `test_reconcile_controlplane.py`, whose recreated trainer once waited 300 s for a rollout the
first test here names, and `test_leader_election_controlplane.py`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import httpx
import pytest

from asyncrl.agent_templates.renderer import TemplateRenderer
from asyncrl.api import load_run
from asyncrl.gateway_api.client import GatewayClient
from asyncrl.operator.dispatcher import vanished_launches
from asyncrl.operator.dispatcher.controller import RunController
from asyncrl.operator.dispatcher.job_state import ReportBook
from asyncrl.operator.dispatcher.shared import ANNOTATION_GATEWAY_INSTANCE
from asyncrl.operator.kube import Kube
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.operator.run_link.gateway_link import GatewayLink
from asyncrl.operator.run_link.job_counters import JobCountsSeen
from asyncrl.operator.run_link.run_context import RunContext
from asyncrl.rollouts import RolloutState
from asyncrl.workloads import names
from tests.gateway.conftest import RunningGateway, create_rollouts, gateway, upstream_url
from tests.support.kube import run_manifest

__all__ = ["gateway", "upstream_url"]  # the real gateway process and its upstream, as fixtures

RUNNING = {"active": 1, "ready": 1}
COMPLETE = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
ROLLOUT = "s2-g0-r0"


class _ListedJobs:
    """What the API server lists of the run's agent Jobs, one answer per listing (the last one repeats)."""

    def __init__(self, *answers: list[dict[str, Any]]) -> None:
        self.answers = list(answers)

    async def list_agent_jobs(self, namespace: str, run: str) -> list[dict[str, Any]]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _controller(running: RunningGateway, kube: object = None) -> RunController:
    manifest = run_manifest("reports")
    manifest["metadata"]["namespace"] = "default"
    spec = load_run(manifest).spec
    context = RunContext(
        run={**manifest, "status": {}},
        spec=spec,
        gateway_url=running.url,
        agent_gateway_url=running.url,
        gateway_key=running.key,
        template_source="",
    )
    # Reports use the gateway link and nothing of the API server: no Kube, no renderer.
    gateway = GatewayClient(context.gateway_url, context.gateway_key)
    controller: RunController | None = None

    def restarted() -> None:
        assert controller is not None
        controller.gateway_restarted()

    link = GatewayLink(
        context,
        kube=cast(Kube, kube),
        client=gateway,
        shown=JobCountsSeen(created=0, failed=0),
        on_change=lambda: None,
        on_restart=restarted,
    )
    controller = RunController(
        context,
        kube=cast(Kube, kube),
        metrics=OperatorMetrics(),
        renderer=cast(TemplateRenderer, None),
        gateway=gateway,
        link=link,
        changed=lambda: None,
    )
    return controller


def _job(uid: str, rollout_id: str, instance: str, status: dict[str, Any]) -> dict[str, Any]:
    annotations = {names.ANNOTATION_ROLLOUT_ID: rollout_id, ANNOTATION_GATEWAY_INSTANCE: instance}
    name = names.agent_job_name("reports", rollout_id)  # one name per rollout id, whichever launch
    return {"metadata": {"name": name, "uid": uid, "annotations": annotations}, "status": status}


def _state(admin: httpx.Client, rollout_id: str) -> str:
    return str(admin.get(f"/api/rollouts/{rollout_id}").json()["state"])


def test_a_new_job_under_the_name_of_an_old_one_reports_running_before_its_success(
    gateway: RunningGateway,
) -> None:
    """A restarted trainer creates the same rollout ids again; their Jobs get the old Jobs' names. The old
    Job's `running` was remembered by name, so the new Job's success went alone and the gateway refused it
    (a queued rollout cannot succeed): the rollout stayed queued and the trainer waited for good."""
    with gateway.management() as admin:
        create_rollouts(admin, ROLLOUT)

        async def scenario() -> None:
            controller = _controller(gateway)
            try:
                instance = (await controller.io.link.read_stats()).instance_id
                await controller.reporter.report("MODIFIED", _job("uid-old", "s2-g0-r0", instance, RUNNING))
                # The old launch ends with its trainer; the new trainer's rollout of the same id is queued.
                assert (
                    admin.post("/api/rollouts/delete", json={"rollout_ids": ["s2-g0-r0"]}).status_code == 200
                )
                create_rollouts(admin, "s2-g0-r0")
                await controller.reporter.report("MODIFIED", _job("uid-new", "s2-g0-r0", instance, COMPLETE))
            finally:
                await controller.io.gateway.close()

        asyncio.run(scenario())
        assert _state(admin, ROLLOUT) == "succeeded"


def test_an_outcome_meant_for_a_gateway_instance_that_restarted_is_refused(gateway: RunningGateway) -> None:
    """A report still retrying while the gateway restarts reaches the new gateway, whose rollout of the same
    id is another rollout: bound to the old instance, it is refused and changes nothing."""
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
        instance = admin.get("/api/stats").json()["instance_id"]
        stale = admin.post(
            "/api/rollouts/r1/transition", json={"state": "failed", "instance_id": "0123456789abcdef"}
        )
        assert stale.status_code == 409
        assert "the gateway restarted" in stale.json()["error"]
        assert _state(admin, "r1") == "queued"
        current = admin.post(
            "/api/rollouts/r1/transition", json={"state": "running", "instance_id": instance}
        )
        assert current.status_code == 200
        assert _state(admin, "r1") == "running"


def test_the_report_book_sends_each_state_once_per_job_and_running_before_an_unseen_success() -> None:
    book = ReportBook()
    assert book.to_report("a", RolloutState.SUCCEEDED) == [RolloutState.RUNNING, RolloutState.SUCCEEDED]
    book.record("a", RolloutState.RUNNING)
    assert book.to_report("a", RolloutState.RUNNING) == []
    assert book.to_report("a", RolloutState.SUCCEEDED) == [RolloutState.SUCCEEDED]
    assert book.to_report("b", RolloutState.FAILED) == [RolloutState.FAILED]
    book.forget("a")
    assert book.to_report("a", RolloutState.SUCCEEDED) == [RolloutState.RUNNING, RolloutState.SUCCEEDED]


def _launched_without_job(admin: httpx.Client, rollout_id: str) -> float:
    create_rollouts(admin, rollout_id)
    answer = admin.post(f"/api/rollouts/{rollout_id}/launch", json={"launch_id": "another-operator"})
    assert answer.status_code == 200, answer.text
    return float(admin.get(f"/api/rollouts/{rollout_id}").json()["launched_at"])


def _resolve_vanished_launches(running: RunningGateway, listed: _ListedJobs) -> None:
    """One dispatcher judges the run's launches without a Job, the API server listing `listed`."""

    async def scenario() -> None:
        controller = _controller(running, listed)
        try:
            await asyncio.wait_for(vanished_launches.resolve_vanished_launches(controller.io), timeout=60)
        finally:
            await controller.io.gateway.close()

    asyncio.run(scenario())


def test_a_launch_without_a_job_is_judged_only_once_its_launcher_could_no_longer_be_creating_it(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Judged at once, a launch another operator was between recording and creating its Job for was failed
    (two operators at once, about 1 run in 15); now it is failed only when no Job came in that time."""
    monkeypatch.setattr(vanished_launches, "VANISHED_AFTER_SECONDS", 2.0)  # 130 s in the operator
    with gateway.management() as admin:
        launched_at = _launched_without_job(admin, ROLLOUT)
        _resolve_vanished_launches(gateway, _ListedJobs([]))
        rollout = admin.get(f"/api/rollouts/{ROLLOUT}").json()
    assert (rollout["state"], rollout["message"]) == ("failed", vanished_launches.VANISHED_WITHOUT_REWARD)
    assert rollout["finished_at"] >= launched_at + 2.0  # not at once
    assert time.time() - launched_at < 60


def test_a_launch_whose_job_appears_while_it_is_young_is_left_to_that_job(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vanished_launches, "VANISHED_AFTER_SECONDS", 2.0)
    with gateway.management() as admin:
        _launched_without_job(admin, ROLLOUT)
        job = _job("uid-other", ROLLOUT, "instance-of-the-other-operator", RUNNING)
        # The first listing is taken before the other operator's Job exists, the next one after.
        _resolve_vanished_launches(gateway, _ListedJobs([], [job]))
        assert _state(admin, ROLLOUT) == "queued"  # its Job reports its outcome; nothing was failed


def test_a_launch_whose_agent_reported_is_judged_at_once(
    gateway: RunningGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an operator restart, rollouts that finished while nobody watched (their Jobs removed, TTL 0) end
    with their rewards at once: their agents ran, so their Jobs existed; no launcher can still be at work."""
    monkeypatch.setattr(vanished_launches, "VANISHED_AFTER_SECONDS", 3600.0)
    with gateway.management() as admin, gateway.agent(ROLLOUT) as agent:
        _launched_without_job(admin, ROLLOUT)
        reward = {"event_type": "reward", "data": {"value": 0.75}}
        assert agent.post(f"/api/rollouts/{ROLLOUT}/attempt/a1/events", json=reward).status_code == 201
        _resolve_vanished_launches(gateway, _ListedJobs([]))
        rollout = admin.get(f"/api/rollouts/{ROLLOUT}").json()
    assert (rollout["state"], rollout["reward"]) == ("succeeded", 0.75)
    assert rollout["message"] == vanished_launches.VANISHED_WITH_REWARD
