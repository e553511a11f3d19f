"""The rollout as its own launch record (`POST /api/rollouts/{id}/launch`), over real HTTP.

What makes agent launches at-most-once across operator restarts: one launch id wins, forever; a launched
rollout is never claimed again; the totals survive the trainer deleting consumed rollouts.
"""

from __future__ import annotations

from tests.gateway.conftest import RunningGateway, create_rollouts


def test_one_launch_wins_and_a_launched_rollout_is_never_claimed_again(gateway: RunningGateway) -> None:
    with gateway.management() as client:
        create_rollouts(client, "r1", "r2")
        claim = {"limit": 10, "wait_seconds": 0, "lease_seconds": 0.1}
        assert {
            r["rollout_id"] for r in client.post("/api/rollouts/claim", json=claim).json()["rollouts"]
        } == {
            "r1",
            "r2",
        }
        first = client.post("/api/rollouts/r1/launch", json={"launch_id": "op1-x"})
        assert first.status_code == 200, first.text
        receipt = first.json()
        assert receipt["rollout"]["launched_at"] is not None
        assert receipt["totals"] == {"launched": 1, "failed": 0}
        assert receipt["instance_id"] == client.get("/api/stats").json()["instance_id"]
        # The same launch id again (a retry whose answer was lost) is a no-op; any other id is refused.
        again = client.post("/api/rollouts/r1/launch", json={"launch_id": "op1-x"})
        assert again.status_code == 200
        assert again.json()["totals"]["launched"] == 1
        other = client.post("/api/rollouts/r1/launch", json={"launch_id": "op2-y"})
        assert other.status_code == 409
        assert "already launched" in other.json()["error"]
        # Leases expired; even a takeover claim (a restarted operator) offers only the unlaunched one.
        takeover = {"limit": 10, "wait_seconds": 0, "takeover": True}
        offered = client.post("/api/rollouts/claim", json=takeover).json()["rollouts"]
        assert [r["rollout_id"] for r in offered] == ["r2"]


def test_launch_totals_count_failures_of_launched_rollouts_and_survive_deletion(
    gateway: RunningGateway,
) -> None:
    with gateway.management() as client:
        create_rollouts(client, "ok", "bad", "late", "never")
        for rollout_id in ("ok", "bad", "late"):
            assert (
                client.post(f"/api/rollouts/{rollout_id}/launch", json={"launch_id": "l1"}).status_code == 200
            )
        for rollout_id, states in {
            "ok": ["running", "succeeded"],
            "bad": ["failed"],
            "late": ["timed_out"],
        }.items():
            for state in states:
                assert client.post(f"/api/rollouts/{rollout_id}/transition", json={"state": state}).is_success
        # A rollout failed before any launch (a template error) is not a failed Job.
        assert client.post("/api/rollouts/never/transition", json={"state": "failed"}).is_success
        deleted = client.post("/api/rollouts/delete", json={"rollout_ids": ["ok", "bad", "late", "never"]})
        assert deleted.json() == {"deleted": 4}
        assert client.get("/api/stats").json()["launches"] == {"launched": 3, "failed": 2}


def test_a_rollout_that_is_not_queued_cannot_be_launched(gateway: RunningGateway) -> None:
    with gateway.management() as client:
        create_rollouts(client, "gone")
        assert client.post("/api/rollouts/gone/transition", json={"state": "cancelled"}).is_success
        refused = client.post("/api/rollouts/gone/launch", json={"launch_id": "l1"})
        assert refused.status_code == 409
        assert "cancelled" in refused.json()["error"]
        missing = client.post("/api/rollouts/nope/launch", json={"launch_id": "l1"})
        assert missing.status_code == 404
        bad_id = client.post("/api/rollouts/gone/launch", json={"launch_id": "has spaces"})
        assert bad_id.status_code == 422
        assert bad_id.json()["fields"][0]["field"] == "launch_id"
    with gateway.agent("gone") as agent:  # an agent's token may not launch anything
        assert agent.post("/api/rollouts/gone/launch", json={"launch_id": "l2"}).status_code == 403
