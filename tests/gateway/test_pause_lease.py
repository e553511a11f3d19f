"""A pause with a lease: the gateway resumes by itself when the trainer that paused it stops renewing.

Real gateway and fake-upstream processes on 127.0.0.1. Before the lease, a gateway paused by a trainer that
then died or lost its connection held every agent's model call until the hold timeout, and stayed paused
until some trainer resumed it. Conditions are awaited with generous deadlines, never fixed sleeps; the one
wait below checks that something does *not* happen, against a deadline an hour away.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx

from tests.gateway.conftest import RunningGateway, create_rollouts
from tests.gateway.test_pauses import CHAT, DEADLINE_SECONDS, metric

EXPIRED = "asyncrl_gateway_pause_lease_expirations_total"


def _state(admin: httpx.Client) -> dict[str, Any]:
    state: dict[str, Any] = admin.get("/proxy/state").json()
    return state


def _until_open(admin: httpx.Client) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while (state := _state(admin))["paused"]:
        assert time.monotonic() < deadline, f"the gateway stayed paused: {state}"
        time.sleep(0.05)
    return state


def test_a_pause_whose_lease_runs_out_resumes_and_releases_the_held_call(gateway: RunningGateway) -> None:
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        admin.post("/proxy/resume", json={"model_version": 5})
        paused = admin.post("/proxy/pause", json={"reason": "update, step 5", "lease_seconds": 1})
        assert paused.status_code == 200, paused.text
        assert 0 < paused.json()["lease_seconds_left"] <= 1
        answers: list[httpx.Response] = []
        call = threading.Thread(
            target=lambda: answers.append(agent.post(gateway.proxy_path("r1"), json=CHAT))
        )
        call.start()  # held: the gateway is paused in Hold mode (the default)
        state = _until_open(admin)
        call.join(timeout=DEADLINE_SECONDS)
    assert [answer.status_code for answer in answers] == [200]  # released by the lease's end, not refused
    assert "lease_seconds_left" not in state
    assert state["model_version"] == 5  # what the servers held; a lease's end changes no version
    assert metric(gateway, EXPIRED) == 1
    assert metric(gateway, "asyncrl_gateway_paused") == 0
    assert "the pause (update, step 5) ran out of its lease" in gateway.process.log()


def test_a_renewal_moves_the_lease_and_never_pauses_an_open_gateway(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        renewed = admin.post("/proxy/pause/renew", json={"lease_seconds": 60})
        assert renewed.status_code == 200, renewed.text
        assert renewed.json()["paused"] is False  # nothing to renew: the gateway stays open
        assert _state(admin)["paused"] is False

        paused_at = time.monotonic()
        admin.post("/proxy/pause", json={"reason": "update", "lease_seconds": 1})
        assert (
            admin.post("/proxy/pause/renew", json={"lease_seconds": 3600}).json()["lease_seconds_left"] > 3000
        )
        time.sleep(max(0.0, paused_at + 1.5 - time.monotonic()))  # past the first lease's end
        assert _state(admin)["paused"] is True  # the first lease's timer did not end the renewed pause

        admin.post("/proxy/pause", json={"reason": "checkpoint"})  # the last pause decides: no lease now
        state = _state(admin)
        assert (state["paused"], "lease_seconds_left" in state) == (True, False)
        admin.post("/proxy/resume")
        late = admin.post(
            "/proxy/pause/renew", json={"lease_seconds": 60}
        ).json()  # a renewal after the resume
        assert (late["paused"], _state(admin)["paused"]) == (False, False)
    assert metric(gateway, EXPIRED) == 0


def test_a_bad_lease_is_refused_naming_the_field_and_changes_nothing(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        for path, body in [
            ("/proxy/pause", {"reason": "update", "lease_seconds": 0}),
            ("/proxy/pause", {"reason": "update", "lease_seconds": "soon"}),
            ("/proxy/pause", {"reason": "update", "lease_seconds": 86401}),
            ("/proxy/pause/renew", {}),
            ("/proxy/pause/renew", {"lease_seconds": 60, "lease": 60}),
        ]:
            refused = admin.post(path, json=body)
            assert refused.status_code == 422, (path, body, refused.text)
            assert "lease" in refused.text, refused.text
        assert _state(admin)["paused"] is False
    with gateway.agent("r1") as agent:  # an agent's token cannot renew (or pause) the gateway
        assert agent.post("/proxy/pause/renew", json={"lease_seconds": 60}).status_code in (401, 403)
