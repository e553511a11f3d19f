"""The rollout store over real HTTP: idempotent creation, claims, transitions, feeds, events, summary."""

from __future__ import annotations

import contextlib
import threading
import time

import httpx

from asyncrl.testing.waiting import wait_for
from tests.gateway.conftest import RunningGateway, create_rollouts


def _transition(client: httpx.Client, rollout_id: str, state: str, **fields: object) -> httpx.Response:
    return client.post(f"/api/rollouts/{rollout_id}/transition", json={"state": state, **fields})


def test_creating_the_same_rollout_twice_is_idempotent_but_different_content_conflicts(
    gateway: RunningGateway,
) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1", "r2")
        create_rollouts(admin, "r1", "r2")
        assert len(admin.get("/api/rollouts").json()["rollouts"]) == 2

        conflict = admin.post("/api/rollouts", json=[{"rollout_id": "r1", "group_id": "other", "step": 0}])
        assert conflict.status_code == 409
        assert "different content" in conflict.json()["error"]

        invalid = admin.post("/api/rollouts", json=[{"rollout_id": "bad id!", "group_id": "g", "step": -1}])
        assert invalid.status_code == 422
        assert {problem["field"] for problem in invalid.json()["fields"]} == {"0.rollout_id", "0.step"}


def test_claim_long_polls_until_a_rollout_is_queued_and_leases_it(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        result: dict[str, object] = {}

        def claimer() -> None:
            with gateway.management() as own:
                result["sent_at"] = time.monotonic()
                response = own.post("/api/rollouts/claim", json={"wait_seconds": 10, "lease_seconds": 60})
                result["returned_at"] = time.monotonic()
                result["ids"] = [r["rollout_id"] for r in response.json()["rollouts"]]

        thread = threading.Thread(target=claimer)
        thread.start()
        wait_for(lambda: "sent_at" in result, timeout=30, what="the claim to be sent")
        time.sleep(0.5)  # not a correctness wait: gives the claim time to be waiting at the gateway
        created_at = time.monotonic()
        create_rollouts(admin, "r1")
        thread.join(timeout=30)
        # The claim was sent before the rollout existed and came back with it (a timeout would bring none).
        assert result["ids"] == ["r1"]
        assert result["sent_at"] < created_at <= result["returned_at"]  # type: ignore[operator]

        # Leased: a second claim does not get it again while the lease holds.
        again = admin.post("/api/rollouts/claim", json={"wait_seconds": 0}).json()["rollouts"]
        assert again == []


def test_an_expired_lease_offers_the_rollout_again(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
        first = admin.post("/api/rollouts/claim", json={"wait_seconds": 0, "lease_seconds": 0.3}).json()
        assert [r["rollout_id"] for r in first["rollouts"]] == ["r1"]
        time.sleep(0.4)
        second = admin.post("/api/rollouts/claim", json={"wait_seconds": 0}).json()
        assert [r["rollout_id"] for r in second["rollouts"]] == ["r1"]


def test_a_claimer_that_disconnects_during_the_long_poll_leases_nothing(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        with contextlib.suppress(httpx.TimeoutException):  # the claimer goes away mid long-poll
            httpx.post(
                gateway.url + "/api/rollouts/claim",
                json={"wait_seconds": 5, "lease_seconds": 600},
                headers={"authorization": f"Bearer {gateway.key}"},
                timeout=0.5,
            )
        create_rollouts(admin, "r1")  # wakes the abandoned long-poll
        # The gateway may notice the disconnect a while after the wake on a busy machine: claim until r1 comes
        # back. Leased to the claimer that left, it would not for 600 s, and the deadline fails the test.
        deadline = time.monotonic() + 30
        claimed: list[dict[str, object]] = []
        while not claimed and time.monotonic() < deadline:
            claimed = admin.post("/api/rollouts/claim", json={"wait_seconds": 1}).json()["rollouts"]
        assert [r["rollout_id"] for r in claimed] == ["r1"]


def test_a_takeover_claim_takes_rollouts_leased_by_a_claimer_that_is_gone(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1")
        admin.post("/api/rollouts/claim", json={"wait_seconds": 0, "lease_seconds": 600})
        assert admin.post("/api/rollouts/claim", json={"wait_seconds": 0}).json()["rollouts"] == []
        taken = admin.post("/api/rollouts/claim", json={"wait_seconds": 0, "takeover": True}).json()
        assert [r["rollout_id"] for r in taken["rollouts"]] == ["r1"]


def test_state_transitions_are_validated(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1", "r2")
        assert _transition(admin, "r1", "succeeded").status_code == 409  # queued cannot succeed directly
        assert _transition(admin, "r1", "running", attempt_id="a1").json()["state"] == "running"
        assert _transition(admin, "r1", "running").status_code == 200  # repeating a state is a no-op
        assert _transition(admin, "r1", "succeeded").json()["state"] == "succeeded"
        late = _transition(admin, "r1", "cancelled")
        assert late.status_code == 409
        assert "cannot go from succeeded to cancelled" in late.json()["error"]
        assert _transition(admin, "r2", "cancelled").json()["state"] == "cancelled"
        assert _transition(admin, "missing", "running").status_code == 404
        assert _transition(admin, "r2", "exploded").status_code == 422


def test_completion_feed_delivers_each_terminal_rollout_once_per_cursor(gateway: RunningGateway) -> None:
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1", "r2", "r3")
        for rid in ("r1", "r2"):
            _transition(admin, rid, "running")
        agent.post(
            "/api/rollouts/r1/attempt/a1/events", json={"event_type": "reward", "data": {"value": 0.75}}
        )
        _transition(admin, "r1", "succeeded")
        _transition(admin, "r2", "failed", message="agent crashed")

        page = admin.get("/api/completions", params={"after": 0, "wait": 0}).json()
        assert [(e["rollout_id"], e["state"], e["reward"]) for e in page["entries"]] == [
            ("r1", "succeeded", 0.75),
            ("r2", "failed", None),
        ]
        assert page["entries"][1]["message"] == "agent crashed"
        assert page["entries"][0]["run_seconds"] >= 0
        assert page["entries"][0]["queue_wait_seconds"] >= 0
        cursor = page["cursor"]

        empty = admin.get("/api/completions", params={"after": cursor, "wait": 0}).json()
        assert empty == {"entries": [], "cursor": cursor}

        # A long-poll wakes as soon as the next rollout ends.
        def finish_later() -> None:
            time.sleep(0.5)
            with gateway.management() as own:
                _transition(own, "r3", "cancelled")

        threading.Thread(target=finish_later).start()
        started = time.monotonic()
        woken = admin.get("/api/completions", params={"after": cursor, "wait": 10}).json()
        assert [e["rollout_id"] for e in woken["entries"]] == ["r3"]
        assert time.monotonic() - started < 3


def test_running_rollout_times_out_after_its_timeout(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "r1", timeout_seconds=0.5)
        _transition(admin, "r1", "running")
        page = admin.get("/api/completions", params={"after": 0, "wait": 10}).json()
        (entry,) = page["entries"]
        assert entry["state"] == "timed_out"
        assert "timeout_seconds=0.5" in entry["message"]


def test_reward_events_need_a_numeric_value_and_consumed_rollouts_can_be_deleted(
    gateway: RunningGateway,
) -> None:
    with gateway.management() as admin, gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        bad = agent.post(
            "/api/rollouts/r1/attempt/a1/events", json={"event_type": "reward", "data": {"value": "x"}}
        )
        assert bad.status_code == 422
        assert bad.json()["field"] == "data.value"
        ok = agent.post(
            "/api/rollouts/r1/attempt/a1/events", json={"event_type": "reward", "data": {"value": 1}}
        )
        assert ok.status_code == 201
        events = admin.get("/api/rollouts/r1/events").json()
        assert events["rollout"]["reward"] == 1.0
        assert events["events"][0]["event_type"] == "reward"

        assert admin.post("/api/rollouts/delete", json={"rollout_ids": ["r1", "nope"]}).json() == {
            "deleted": 1
        }
        assert admin.get("/api/rollouts/r1").status_code == 404
        assert (
            agent.post("/api/rollouts/r1/attempt/a1/events", json={"event_type": "reward"}).status_code == 404
        )


def test_window_summary_long_poll_returns_the_next_step(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        assert admin.get("/api/window/summary").status_code == 204
        admin.put(
            "/api/window/summary", json={"step": 0, "metrics": {"training/async/n_completed_rollouts": 8}}
        )

        def post_later() -> None:
            time.sleep(0.5)
            with gateway.management() as own:
                own.put("/api/window/summary", json={"step": 1, "active_groups": 4})

        threading.Thread(target=post_later).start()
        summary = admin.get("/api/window/summary", params={"after_step": 0, "wait": 10}).json()
        assert summary["step"] == 1
        assert summary["active_groups"] == 4


def test_a_step_redone_after_a_trainer_restart_comes_through_the_posted_long_poll(
    gateway: RunningGateway,
) -> None:
    """`after_step` never returns a step again; `after_posted` returns every update, numbered by the gateway
    (local mode shows a redone step with it, issue 37 item 4)."""
    with gateway.management() as admin:
        for step in (0, 1):
            posted = admin.put("/api/window/summary", json={"step": step}).json()
            assert posted["posted"] == step + 1
        assert admin.get("/api/window/summary", params={"after_posted": 2, "wait": 0.2}).json()["posted"] == 2

        def redo_later() -> None:
            time.sleep(0.5)
            with gateway.management() as own:
                own.put("/api/window/summary", json={"step": 1, "reward_mean": 0.5, "posted": 99})

        threading.Thread(target=redo_later).start()
        redone = admin.get("/api/window/summary", params={"after_posted": 2, "wait": 10}).json()
        assert (redone["step"], redone["reward_mean"], redone["posted"]) == (1, 0.5, 3)  # the gateway numbers
        # A count from an earlier gateway instance (higher than this one's) answers at once, with the latest.
        started = time.monotonic()
        assert admin.get("/api/window/summary", params={"after_posted": 40, "wait": 60}).json()["posted"] == 3
        assert time.monotonic() - started < 30  # not the whole wait
        # The step long-poll still waits for a later step: the redo of step 1 is not one.
        assert admin.get("/api/window/summary", params={"after_step": 1, "wait": 0.3}).json()["step"] == 1


def test_a_malformed_posted_count_is_refused_naming_the_parameter(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        for bad in ("-1", "x", "1.5", ""):
            answer = admin.get("/api/window/summary", params={"after_posted": bad, "wait": 0})
            assert answer.status_code == 422, (bad, answer.text)
            assert "after_posted" in answer.text, answer.text
        # A count no gateway reached is one from elsewhere: answered at once (nothing yet: 204), no error.
        huge = admin.get("/api/window/summary", params={"after_posted": "9" * 400, "wait": 60})
        assert huge.status_code == 204
        # The trainer cannot number its own summary: the gateway's number wins.
        assert admin.put("/api/window/summary", json={"step": 0, "posted": 7}).json()["posted"] == 1
        assert admin.put("/api/window/summary", json={"step": 1, "posted": -3}).status_code == 422


def test_listing_rollouts_filters_by_state_and_group(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "a1", "a2", group_id="ga")
        create_rollouts(admin, "b1", group_id="gb")
        _transition(admin, "a1", "running")
        running = admin.get("/api/rollouts", params={"state": "running"}).json()["rollouts"]
        assert [r["rollout_id"] for r in running] == ["a1"]
        group = admin.get("/api/rollouts", params={"group_id": "ga"}).json()["rollouts"]
        assert sorted(r["rollout_id"] for r in group) == ["a1", "a2"]
