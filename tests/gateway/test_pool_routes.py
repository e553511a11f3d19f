"""The agent pool's routes (`/api/pool/*`, `agents.mode: Pool`) over real HTTP against a gateway process.

What they promise: a claim launches the rollout it hands out, so under concurrent claims from several pool
pods each rollout goes to exactly one pod, once; the pool token opens the pool routes and nothing else; only
the pod that launched a rollout reports its outcome; the operator's release fails only the rollouts of pods
that are gone, and spares recent launches (a pod too new to be in the operator's list).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import httpx

from asyncrl.gateway_api.tokens import agent_token, pool_token
from tests.gateway.conftest import KEY, RunningGateway, create_rollouts

POOL = pool_token(KEY)


def _pool(gateway: RunningGateway, token: str = POOL) -> httpx.Client:
    return httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {token}"}, timeout=30)


def _claim(client: httpx.Client, worker: str, wait_seconds: float = 0) -> dict[str, Any]:
    response = client.post("/api/pool/claim", json={"worker": worker, "wait_seconds": wait_seconds})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _report(client: httpx.Client, worker: str, rollout_id: str, state: str) -> httpx.Response:
    return client.post(f"/api/pool/rollouts/{rollout_id}/transition", json={"worker": worker, "state": state})


def test_concurrent_claims_from_eight_pods_hand_each_of_twenty_rollouts_out_exactly_once(
    gateway: RunningGateway,
) -> None:
    ids = [f"r{index}" for index in range(20)]
    with gateway.management() as management:
        for rollout_id in ids:  # a group each: nothing holds one back
            create_rollouts(management, rollout_id, group_id=f"g-{rollout_id}")
    taken: list[tuple[str, str]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)
    lock = threading.Lock()

    def pod(worker: str) -> None:
        try:
            with _pool(gateway) as client:
                start.wait(timeout=30)
                while (assignment := _claim(client, worker))["rollout"] is not None:
                    rollout_id = assignment["rollout"]["rollout_id"]
                    assert assignment["agent_key"] == agent_token(KEY, rollout_id)
                    assert assignment["launch_id"].startswith(f"pool:{worker}:")
                    with lock:
                        taken.append((worker, rollout_id))
                    for state in ("running", "succeeded"):
                        assert _report(client, worker, rollout_id, state).status_code == 200
        except BaseException as error:  # surfaced below: a thread's assert must fail the test
            errors.append(error)

    threads = [threading.Thread(target=pod, args=(f"pod-{index}",)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    counted = collections.Counter(rollout_id for _, rollout_id in taken)
    assert counted == collections.Counter(ids), f"claimed more or less than once: {counted}"
    assert len({worker for worker, _ in taken}) > 1, "the claims did not overlap at all"
    with gateway.management() as management:
        stats = management.get("/api/stats").json()
        assert stats["launches"]["launched"] == 20
        for rollout_id in ids:
            rollout = management.get(f"/api/rollouts/{rollout_id}").json()
            assert rollout["state"] == "succeeded"
            assert rollout["launched_at"] is not None
        # Launched by the pool, so the operator's Job launch of the same rollout is refused: at most once.
        again = management.post(f"/api/rollouts/{ids[0]}/launch", json={"launch_id": "op-x"})
        assert again.status_code == 409, again.text


def test_a_pod_that_did_not_take_its_answer_gets_the_same_rollout_and_a_started_one_is_failed_not_rerun(
    gateway: RunningGateway,
) -> None:
    with gateway.management() as management:
        create_rollouts(management, "a", group_id="ga")
        create_rollouts(management, "b", group_id="gb")
    with _pool(gateway) as pool:
        first = _claim(pool, "pod-1")["rollout"]["rollout_id"]
        # The answer was lost (the runner restarted before reading it): the same rollout again, not another.
        assert _claim(pool, "pod-1")["rollout"]["rollout_id"] == first
        assert _report(pool, "pod-1", first, "running").status_code == 200
        # Restarted mid-rollout: its next claim fails the started rollout and hands out the other one.
        again = _claim(pool, "pod-1")
        assert again["interrupted"] == [first]
        assert again["rollout"]["rollout_id"] != first
    with gateway.management() as management:
        failed = management.get(f"/api/rollouts/{first}").json()
        assert failed["state"] == "failed"
        assert "not rerun" in failed["message"]


def test_the_pool_token_opens_only_the_pool_routes_and_only_the_pool_token_or_key_opens_them(
    gateway: RunningGateway,
) -> None:
    with gateway.management() as management:
        create_rollouts(management, "r1")
    claim = {"worker": "pod-1", "wait_seconds": 0}
    # An agent's token, a wrong pool-looking token, no token: refused on the claim, nothing launched.
    for token in (agent_token(KEY, "r1"), "aglp-" + "0" * 64, KEY + "x"):
        with _pool(gateway, token) as client:
            refused = client.post("/api/pool/claim", json=claim)
            assert refused.status_code == 403, (token[:6], refused.text)
    assert httpx.post(f"{gateway.url}/api/pool/claim", json=claim, timeout=30).status_code == 401
    with gateway.management() as management:
        assert management.get("/api/rollouts/r1").json()["launched_at"] is None
    with _pool(gateway) as pool:
        # The pool token is refused off the pool routes: the management API, a rollout's reads, the proxy.
        assert pool.get("/api/stats").status_code == 403
        assert pool.get("/api/rollouts/r1").status_code == 403
        new = [{"rollout_id": "x", "group_id": "gx", "step": 0, "input": {}}]
        assert pool.post("/api/rollouts", json=new).status_code == 403
        assert pool.post("/api/rollouts/r1/transition", json={"state": "cancelled"}).status_code == 403
        chat = {"model": "served-model", "messages": [{"role": "user", "content": "hi"}]}
        proxied = pool.post(gateway.proxy_path("r1"), json=chat)
        assert proxied.status_code == 403, proxied.text
        # ... and on the operator's release: a pool pod must not fail other pods' rollouts.
        released = pool.post("/api/pool/release", json={"live_workers": [], "min_age_seconds": 0})
        assert released.status_code == 403, released.text
        assert released.json() == {"error": "this route needs the gateway key"}  # the door's, body unread
        # Its own routes open, and the gateway key (the operator's) opens them too.
        assert _claim(pool, "pod-1")["rollout"]["rollout_id"] == "r1"
    with gateway.management() as management:
        assert management.post("/api/pool/claim", json={"worker": "pod-2", "wait_seconds": 0}).is_success
        # The rollout's own token, handed to the agent, reads its rollout (how the runner sees it cancelled).
    with gateway.agent("r1") as agent:
        assert agent.get("/api/rollouts/r1").json()["state"] == "queued"


def test_hostile_pool_bodies_are_refused_naming_the_field(gateway: RunningGateway) -> None:
    with _pool(gateway) as pool:
        for body, field in (
            ({"worker": "../etc/passwd"}, "worker"),
            ({"worker": "pod-1", "wait_seconds": 10_000}, "wait_seconds"),
            ({"worker": "pod-1", "extra": 1}, "extra"),
            ({}, "worker"),
        ):
            refused = pool.post("/api/pool/claim", json=body)
            assert refused.status_code == 422, refused.text
            assert field in refused.text
        outcome = {"worker": "pod-1", "state": "exploded"}
        assert pool.post("/api/pool/rollouts/r1/transition", json=outcome).status_code == 422
        assert _report(pool, "pod-1", "nope", "running").status_code == 404


def test_pool_errors_have_the_shape_of_every_route_and_name_the_rollout_as_given(
    gateway: RunningGateway,
) -> None:
    # They were HTTPExceptions, lowercased by the error handler: "Mixed-Case-1" came back "mixed-case-1".
    with gateway.management() as management:
        create_rollouts(management, "Mixed-Case-1")
    with _pool(gateway) as pool:
        missing = _report(pool, "pod-1", "Nope-1", "running")
        assert (missing.status_code, missing.json()) == (
            404,
            {"error": "rollout 'Nope-1' not found", "rollout_id": "Nope-1"},
        )
        not_its_own = _report(pool, "pod-1", "Mixed-Case-1", "running")
        assert (not_its_own.status_code, not_its_own.json()) == (
            409,
            {"error": "rollout Mixed-Case-1 was not launched by pool worker pod-1"},
        )


def test_only_the_pod_that_launched_a_rollout_reports_its_outcome(gateway: RunningGateway) -> None:
    with gateway.management() as management:
        create_rollouts(management, "r1")
        create_rollouts(management, "jobbed", group_id="gj")
        assert management.post("/api/rollouts/jobbed/launch", json={"launch_id": "op-1"}).is_success
    with _pool(gateway) as pool:
        assert _claim(pool, "pod-1")["rollout"]["rollout_id"] == "r1"
        for worker, rollout_id in (("pod-2", "r1"), ("pod-1", "jobbed"), ("pod-10", "r1"), ("pod", "r1")):
            refused = _report(pool, worker, rollout_id, "running")
            assert refused.status_code == 409, (worker, rollout_id, refused.text)
            assert "not launched by pool worker" in refused.text
        with gateway.management() as management:
            assert management.get("/api/rollouts/r1").json()["state"] == "queued"
        assert _report(pool, "pod-1", "r1", "running").status_code == 200
        assert _report(pool, "pod-1", "r1", "succeeded").status_code == 200
        # Terminal stays terminal: a late or repeated outcome is refused, the first one kept.
        assert _report(pool, "pod-1", "r1", "failed").status_code == 409
    with gateway.management() as management:
        assert management.get("/api/rollouts/r1").json()["state"] == "succeeded"


def test_release_fails_only_the_rollouts_of_pods_that_are_gone_and_spares_recent_launches(
    gateway: RunningGateway,
) -> None:
    with gateway.management() as management:
        for rollout_id in ("a", "b", "jobbed"):
            create_rollouts(management, rollout_id, group_id=f"g-{rollout_id}")
        assert management.post("/api/rollouts/jobbed/launch", json={"launch_id": "op-1"}).is_success
    with _pool(gateway) as pool:
        kept = _claim(pool, "pod-live")["rollout"]["rollout_id"]
        gone = _claim(pool, "pod-gone")["rollout"]["rollout_id"]
        assert {kept, gone} == {"a", "b"}
        assert _report(pool, "pod-gone", gone, "running").status_code == 200
    with gateway.management() as management:
        create_rollouts(management, "waiting", group_id="g-waiting")  # launched by no one
        # Launched just now: spared, whatever the list says (the pod may be too new to be listed).
        recent = management.post("/api/pool/release", json={"live_workers": [], "min_age_seconds": 60})
        assert recent.json() == {"failed": []}
        released = management.post(
            "/api/pool/release", json={"live_workers": ["pod-live"], "min_age_seconds": 0}
        )
        assert released.status_code == 200, released.text
        assert released.json() == {"failed": [gone]}
        states = {
            rollout_id: management.get(f"/api/rollouts/{rollout_id}").json()
            for rollout_id in (kept, gone, "waiting", "jobbed")
        }
        assert states[gone]["state"] == "failed"
        assert "pod-gone" in states[gone]["message"]
        assert "not rerun" in states[gone]["message"]
        assert states[kept]["state"] == "queued"  # its pod lives
        assert states["jobbed"]["state"] == "queued"  # a Job's launch: not the pool's to release
        assert states["waiting"]["state"] == "queued"
        # Released again with no pod alive: only the live pod's rollout now; terminal ones are left alone.
        again = management.post("/api/pool/release", json={"live_workers": [], "min_age_seconds": 0})
        assert again.json() == {"failed": [kept]}
