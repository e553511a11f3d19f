"""`POST /api/rollouts/events`: many rollouts' events documents in one request, bounded in count and bytes.

The trainer reads a completed group's data with it while agents keep working, so it must give exactly what
the per-rollout route gives, never grow past its byte bound (beyond the one document it always sends), say
which ids it does not hold or left out, and answer only the gateway key.
"""

from __future__ import annotations

import asyncio
import json

import httpx

from asyncrl.gateway_api.client import EventsBatch, GatewayClient
from asyncrl.gateway_api.events import EventsDocument
from asyncrl.gateway_api.models import MAX_EVENTS_BATCH_ROLLOUTS
from tests.gateway.conftest import RunningGateway, create_rollouts

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}


def _finished(gateway: RunningGateway, admin: httpx.Client, rollout_id: str, *, calls: int) -> None:
    """A rollout that made `calls` model calls through the proxy, posted a reward and succeeded."""
    running = {"state": "running", "attempt_id": "a1"}
    assert admin.post(f"/api/rollouts/{rollout_id}/transition", json=running).status_code == 200
    with gateway.agent(rollout_id) as agent:
        for _ in range(calls):
            assert agent.post(gateway.proxy_path(rollout_id), json=CHAT).status_code == 200
        reward = {"event_type": "reward", "data": {"value": 0.5}}
        assert agent.post(f"/api/rollouts/{rollout_id}/attempt/a1/events", json=reward).status_code == 201
    done = admin.post(f"/api/rollouts/{rollout_id}/transition", json={"state": "succeeded"})
    assert done.status_code == 200, done.text


def test_a_batch_holds_each_rollouts_own_document_and_names_the_ids_it_lacks(gateway: RunningGateway) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "b1", "b2", "b3")
        for rollout_id, calls in (("b1", 2), ("b2", 0), ("b3", 1)):
            _finished(gateway, admin, rollout_id, calls=calls)
        answer = admin.post("/api/rollouts/events", json={"rollout_ids": ["b3", "nope", "b1", "b2", "b1"]})
        assert answer.status_code == 200, answer.text
        batch = EventsBatch.parse(answer.content)
        single = {
            rid: EventsDocument.model_validate_json(admin.get(f"/api/rollouts/{rid}/events").content)
            for rid in ("b1", "b2", "b3")
        }
        stats = admin.get("/api/stats").json()

    assert [document.rollout.rollout_id for document in batch.documents] == ["b3", "b1", "b2"]
    for document in batch.documents:  # the same document as the per-rollout route, duplicates sent once
        assert document == single[document.rollout.rollout_id]
    assert [len(document.model_calls) for document in batch.documents] == [1, 2, 0]
    assert batch.missing == ["nope"]
    assert batch.omitted == []
    assert batch.instance_id == stats["instance_id"]


def test_the_byte_bound_leaves_out_documents_that_do_not_fit_and_always_sends_the_first(
    gateway: RunningGateway,
) -> None:
    ids = [f"big{index}" for index in range(4)]
    with gateway.management() as admin:
        create_rollouts(admin, *ids)
        for rollout_id in ids:
            _finished(gateway, admin, rollout_id, calls=3)
        sizes = [len(admin.get(f"/api/rollouts/{rid}/events").content) for rid in ids]
        tiny = EventsBatch.parse(
            admin.post("/api/rollouts/events", json={"rollout_ids": ids, "max_bytes": 1}).content
        )
        two = sizes[0] + sizes[1] + 1
        bounded = admin.post("/api/rollouts/events", json={"rollout_ids": ids, "max_bytes": two})
        batch = EventsBatch.parse(bounded.content)

    assert [document.rollout.rollout_id for document in tiny.documents] == ["big0"]
    assert tiny.omitted == ids[1:]
    assert [document.rollout.rollout_id for document in batch.documents] == ["big0", "big1"]
    assert batch.omitted == ["big2", "big3"]
    assert batch.size_bytes < two + 200  # the documents plus the envelope


def test_the_client_reads_every_document_across_omissions(gateway: RunningGateway) -> None:
    ids = [f"c{index}" for index in range(5)]
    with gateway.management() as admin:
        create_rollouts(admin, *ids)
        for rollout_id in ids:
            _finished(gateway, admin, rollout_id, calls=1)

    async def read_all() -> tuple[list[str], int]:
        seen: list[str] = []
        requests = 0
        async with GatewayClient(gateway.url, gateway.key) as client:
            wanted = list(ids)
            while wanted:
                batch = await client.rollout_events_batch(wanted, max_bytes=1)
                requests += 1
                seen += [document.rollout.rollout_id for document in batch.documents]
                wanted = batch.omitted
        return seen, requests

    seen, requests = asyncio.run(read_all())
    assert seen == ids
    assert requests == len(ids)  # one document per answer at a 1-byte bound, none lost, none repeated


def test_only_the_gateway_key_may_read_a_batch_and_bad_requests_name_the_field(
    gateway: RunningGateway,
) -> None:
    with gateway.management() as admin:
        create_rollouts(admin, "own1")
        _finished(gateway, admin, "own1", calls=1)
        with gateway.agent("own1") as agent:  # an agent's token, even for a rollout in the batch
            forbidden = agent.post("/api/rollouts/events", json={"rollout_ids": ["own1"]})
        anonymous = httpx.post(f"{gateway.url}/api/rollouts/events", json={"rollout_ids": ["own1"]})
        empty = admin.post("/api/rollouts/events", json={"rollout_ids": []})
        too_many = admin.post(
            "/api/rollouts/events",
            json={"rollout_ids": [f"r{i}" for i in range(MAX_EVENTS_BATCH_ROLLOUTS + 1)]},
        )
        huge_bound = admin.post("/api/rollouts/events", json={"rollout_ids": ["own1"], "max_bytes": 10**12})
        not_a_list = admin.post("/api/rollouts/events", json={"rollout_ids": "own1"})
        extra = admin.post("/api/rollouts/events", json={"rollout_ids": ["own1"], "sneaky": 1})
        still_fine = admin.post("/api/rollouts/events", json={"rollout_ids": ["own1"]})

    assert forbidden.status_code == 403
    assert "gateway key" in forbidden.json()["error"]
    assert anonymous.status_code == 401
    for answer, field in (
        (empty, "rollout_ids"),
        (too_many, "rollout_ids"),
        (huge_bound, "max_bytes"),
        (not_a_list, "rollout_ids"),
        (extra, "sneaky"),
    ):
        assert answer.status_code == 422, answer.text
        assert [problem["field"] for problem in answer.json()["fields"]] == [field]
    assert still_fine.status_code == 200
    assert len(EventsBatch.parse(still_fine.content).documents) == 1


def test_a_malformed_document_costs_only_its_own_rollout() -> None:
    """The batch is validated in one pass; one document that does not validate is named, the rest kept."""
    good = {
        "rollout": {
            "rollout_id": "ok", "group_id": "g1", "step": 0, "input": None, "mode": "train",
            "state": "succeeded", "attempt_id": "a1", "timeout_seconds": None, "created_at": 0.0,
            "started_at": 1.0, "finished_at": 2.0, "reward": 1.0, "message": None, "n_model_calls": 1,
        },
        "model_calls": [{"status": 200, "started_at": 1.0, "prompt_token_ids": [1], "response_token_ids": [2],
                         "response_logprobs": [-0.5]}],
    }  # fmt: skip
    bad = {**good, "rollout": {**good["rollout"], "rollout_id": "bad"}, "model_calls": [{"status": "two"}]}
    body = json.dumps({"instance_id": "i1", "missing": ["gone"], "omitted": [], "documents": [good, bad]})
    batch = EventsBatch.parse(body.encode())
    assert [document.rollout.rollout_id for document in batch.documents] == ["ok"]
    assert batch.documents[0].model_calls[0].response_logprobs == (-0.5,)
    assert list(batch.malformed) == ["bad"]
    assert "model_calls" in batch.malformed["bad"]
    assert (batch.instance_id, batch.missing) == ("i1", ["gone"])
