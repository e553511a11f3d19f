"""`GET /api/rollouts` in bounded pages (issue 24 item 6), against the real gateway process.

One answer of 100,000 rollouts held the gateway's event loop for seconds (11.8 s seen in the issue; see
`benchmarks/rollout_listing.py`), and the trainer's resync asks for it. A page is bounded now, also when no
`limit` is given, and the clients follow `next_page`.
"""

from __future__ import annotations

import asyncio
import collections

import httpx

from asyncrl.gateway_api.client import GatewayClient
from asyncrl.gateway_api.models import DEFAULT_LISTING_PAGE, RolloutCreate
from asyncrl.rollouts import RolloutState
from tests.gateway.conftest import RunningGateway

MANY = 2 * DEFAULT_LISTING_PAGE + 500


def _create(admin: httpx.Client, rollout_ids: list[str]) -> None:
    for start in range(0, len(rollout_ids), 1000):
        body = [
            {"rollout_id": rid, "group_id": f"g-{rid}", "step": 0}
            for rid in rollout_ids[start : start + 1000]
        ]
        response = admin.post("/api/rollouts", json=body)
        assert response.status_code == 201, response.text


def _ids(page: httpx.Response) -> list[str]:
    assert page.status_code == 200, page.text
    return [row["rollout_id"] for row in page.json()["rollouts"]]


def test_a_listing_without_a_limit_is_one_bounded_page_and_names_the_next(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        _create(admin, [f"r{i}" for i in range(MANY)])
        first = admin.get("/api/rollouts")
        assert _ids(first) == [f"r{i}" for i in range(DEFAULT_LISTING_PAGE)]  # in creation order
        assert first.json()["next_page"] is not None
        assert first.json()["cursor"] == 0
        refused = admin.get("/api/rollouts", params={"page": "not-a-page"})
        assert refused.status_code == 422
        assert refused.json()["fields"][0]["field"] == "page"
        assert admin.get("/api/rollouts", params={"limit": 10**6}).status_code == 422


def test_the_pages_show_every_rollout_exactly_once_while_rollouts_come_and_go(
    gateway: RunningGateway,
) -> None:
    with gateway.management() as admin:
        _create(admin, [f"r{i}" for i in range(MANY)])
        seen: list[str] = []
        page = admin.get("/api/rollouts", params={"limit": 700})
        seen += _ids(page)
        # Between pages: some read rows and some unread rows are deleted, new rollouts are created.
        deleted = [f"r{i}" for i in (*range(0, 10), *range(2000, 2010))]
        assert admin.post("/api/rollouts/delete", json={"rollout_ids": deleted}).json() == {"deleted": 20}
        _create(admin, [f"new{i}" for i in range(5)])
        pages = 1
        while (next_page := page.json()["next_page"]) is not None:
            page = admin.get("/api/rollouts", params={"limit": 700, "page": next_page})
            assert len(_ids(page)) <= 700
            seen += _ids(page)
            pages += 1
        counts = collections.Counter(seen)
        assert set(counts.values()) == {1}  # nobody twice
        expected = {f"r{i}" for i in range(MANY)} - set(deleted[10:]) | {f"new{i}" for i in range(5)}
        assert set(seen) == expected  # the unread deleted ones are gone, the new ones are there
        assert pages == -(-len(expected | set(deleted[:10])) // 700)


def test_a_filtered_listing_follows_its_pages_to_every_match(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        _create(admin, [f"r{i}" for i in range(MANY)])
        running = {f"r{i}" for i in range(0, MANY, 7)}
        for rollout_id in running:
            transition = {"state": "running", "attempt_id": "a1"}
            assert admin.post(f"/api/rollouts/{rollout_id}/transition", json=transition).is_success

    async def listed() -> tuple[list[str], list[str]]:
        async with GatewayClient(gateway.url, gateway.key) as client:
            rows, _ = await client.list_rollouts(state=RolloutState.RUNNING)
            everything, _ = await client.list_rollouts()
        return [row.rollout_id for row in rows], [row.rollout_id for row in everything]

    rows, everything = asyncio.run(listed())
    assert sorted(rows) == sorted(running)
    assert len(everything) == len(set(everything)) == MANY


def test_another_request_is_served_while_a_big_listing_is_in_progress(gateway: RunningGateway) -> None:
    """The trainer's resync lists everything; a claim, a model call or a pause is served between its pages,
    and a rollout created while the listing goes on is in its last page."""
    with gateway.management() as admin:
        _create(admin, [f"r{i}" for i in range(MANY)])

    async def scenario() -> tuple[list[str], bool, int, int]:
        headers = {"authorization": f"Bearer {gateway.key}"}
        async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=60) as lister:
            page = (await lister.get("/api/rollouts")).json()
            seen = [row["rollout_id"] for row in page["rollouts"]]
            listing_in_progress = page["next_page"] is not None
            first_cursor = page["cursor"]
            # Served before the listing ends: another client's create, and a completion it causes.
            async with GatewayClient(gateway.url, gateway.key) as other:
                await other.create_rollouts([RolloutCreate(rollout_id="meanwhile", group_id="g2", step=0)])
                await other.transition("meanwhile", RolloutState.CANCELLED)
            while page["next_page"] is not None:
                page = (await lister.get("/api/rollouts", params={"page": page["next_page"]})).json()
                seen += [row["rollout_id"] for row in page["rollouts"]]
            return seen, listing_in_progress, first_cursor, page["cursor"]

    seen, listing_in_progress, first_cursor, last_cursor = asyncio.run(scenario())
    assert listing_in_progress  # the first answer was one page of many
    assert seen[-1] == "meanwhile"  # created, and served, while the listing was in progress
    assert len(seen) == len(set(seen)) == MANY + 1
    assert last_cursor == first_cursor + 1  # its completion too, between the first page and the last
