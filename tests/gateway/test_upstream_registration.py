"""Upstreams registered at run time (PUT /api/upstreams), over real HTTP: real gateway and upstream processes.

With the GPU backend the inference servers pick their ports after the gateway sidecar has started, so the
trainer registers them once they are up; until then model calls get 503 + Retry-After.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr, ValidationError

from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.proxy import Upstreams
from asyncrl.gateway.run_settings import standalone_defaults
from asyncrl.gateway_api.client import GatewayClient, GatewayError
from asyncrl.gateway_api.models import UpstreamsView
from asyncrl.gateway_api.tokens import agent_token
from asyncrl.testing.processes import ServerProcess
from tests.gateway.conftest import KEY, RunningGateway, create_rollouts, launch_gateway, launch_upstream

RUN = standalone_defaults(model="m")
CHAT = {"model": "whatever-the-agent-says", "messages": [{"role": "user", "content": "two words"}]}


@pytest.fixture(scope="module")
def two_upstreams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    servers: list[ServerProcess] = []
    urls: list[str] = []
    try:
        for name in ("a", "b"):
            url, server = launch_upstream(tmp_path_factory.mktemp(f"upstream-{name}"))
            urls.append(url)
            servers.append(server)
        yield urls[0], urls[1]
    finally:
        for server in servers:
            server.stop()


@pytest.fixture
def bare_gateway(tmp_path: Path) -> Iterator[RunningGateway]:
    """A gateway started without any --upstream, as the GPU backend's sidecar is (Reject mode: 503s)."""
    running = launch_gateway([], tmp_path, "--retry-after-seconds", "7", "--pause-mode", "reject")
    yield running
    running.process.stop()
    assert KEY not in running.process.log(), "the gateway key must never be logged"


def _upstream_stats(url: str) -> dict[str, Any]:
    stats: dict[str, Any] = httpx.get(f"{url}/stats").json()
    return stats


def test_without_upstream_model_calls_get_503_with_retry_after_and_leave_nothing_in_flight(
    bare_gateway: RunningGateway,
) -> None:
    with bare_gateway.management() as admin, bare_gateway.agent("r1") as agent:
        create_rollouts(admin, "r1")
        assert admin.get("/api/upstreams").json() == {"upstreams": [], "model": "served-model"}
        for _ in range(3):
            response = agent.post(bare_gateway.proxy_path("r1"), json=CHAT)
            assert response.status_code == 503
            assert response.headers["retry-after"] == "7"
            body = response.json()
            assert body["error"] == "no upstream registered"
            assert "PUT /api/upstreams" in body["detail"]

        state = admin.get("/proxy/state?wait=0").json()
        assert state["inflight"] == 0
        assert state["drained"] is True
        metrics = httpx.get(bare_gateway.url + "/metrics").text
        assert httpx.get(bare_gateway.url + "/readyz").json() == {"ready": True}  # the sidecar is ready
        # Paused wins over "no upstream": agents see the pause contract they know.
        admin.post("/proxy/pause", json={"reason": "update", "retry_after_seconds": 2})
        assert agent.post(bare_gateway.proxy_path("r1"), json=CHAT).status_code == 429
    assert 'asyncrl_gateway_requests_total{code="503",route="proxy"} 3.0' in metrics
    assert "asyncrl_gateway_inflight 0.0" in metrics
    assert "gateway on 127.0.0.1" in bare_gateway.process.log()
    assert "no upstream yet" in bare_gateway.process.log()


def test_registered_upstreams_take_calls_and_replacing_them_lets_calls_in_flight_finish(
    bare_gateway: RunningGateway, two_upstreams: tuple[str, str]
) -> None:
    upstream_a, upstream_b = two_upstreams
    with bare_gateway.management() as admin:
        create_rollouts(admin, "r1", "r2")
        registered = admin.put("/api/upstreams", json={"upstreams": [upstream_a + "/"], "model": "policy-a"})
        assert registered.status_code == 200, registered.text
        assert registered.json() == {"upstreams": [upstream_a], "model": "policy-a"}
        assert admin.get("/api/upstreams").json() == {"upstreams": [upstream_a], "model": "policy-a"}

    with bare_gateway.agent("r1") as agent:
        before = _upstream_stats(upstream_a)["calls"]
        response = agent.post(bare_gateway.proxy_path("r1"), json=CHAT)
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "policy-a"
        stats_a = _upstream_stats(upstream_a)
        assert stats_a["calls"] == before + 1
        assert stats_a["last_model"] == "policy-a"

    async def scenario() -> tuple[httpx.Response, httpx.Response, dict[str, Any], int, int]:
        admin_headers = {"authorization": f"Bearer {bare_gateway.key}"}
        async with httpx.AsyncClient(base_url=bare_gateway.url, timeout=30) as client:

            async def call(rollout_id: str, **knobs: Any) -> httpx.Response:
                headers = {"authorization": f"Bearer {agent_token(bare_gateway.key, rollout_id)}"}
                return await client.post(
                    bare_gateway.proxy_path(rollout_id), json={**CHAT, **knobs}, headers=headers
                )

            calls_a = _upstream_stats(upstream_a)["calls"]
            slow = asyncio.create_task(call("r1", fake_delay_seconds=1.5))
            while (await client.get("/proxy/state", headers=admin_headers)).json()["inflight"] < 1:
                await asyncio.sleep(0.01)
            replaced = await client.put(
                "/api/upstreams", json={"upstreams": [upstream_b], "model": "policy-b"}, headers=admin_headers
            )
            assert replaced.status_code == 200, replaced.text
            calls_b = _upstream_stats(upstream_b)["calls"]
            fast = await call("r2")
            assert not slow.done(), "the slow call should still be in flight on the removed upstream"
            slow_response = await slow
            state = (await client.get("/proxy/state?wait=5", headers=admin_headers)).json()
            moved_a = _upstream_stats(upstream_a)["calls"] - calls_a
            moved_b = _upstream_stats(upstream_b)["calls"] - calls_b
            return slow_response, fast, state, moved_a, moved_b

    slow, fast, state, moved_a, moved_b = asyncio.run(scenario())
    assert slow.status_code == 200, slow.text
    assert slow.json()["model"] == "policy-a"  # forwarded before the change, finished on A
    assert fast.status_code == 200, fast.text
    assert fast.json()["model"] == "policy-b"
    assert (moved_a, moved_b) == (1, 1)  # the slow call on A, the new call on B only
    assert state["inflight"] == 0

    with bare_gateway.management() as admin, bare_gateway.agent("r1") as agent:
        # The release of the call that ended on the removed upstream did not break anything.
        before_b = _upstream_stats(upstream_b)["calls"]
        assert agent.post(bare_gateway.proxy_path("r1"), json=CHAT).status_code == 200
        assert _upstream_stats(upstream_b)["calls"] == before_b + 1
        # Without `model`, the model name stays; both upstreams take calls again.
        both = admin.put("/api/upstreams", json={"upstreams": [upstream_a, upstream_b]}).json()
        assert both == {"upstreams": [upstream_a, upstream_b], "model": "policy-b"}
        assert agent.post(bare_gateway.proxy_path("r1"), json=CHAT).json()["model"] == "policy-b"
        assert admin.get("/proxy/state").json()["inflight"] == 0
    log = bare_gateway.process.log()
    assert f"upstreams registered: {upstream_b} (model policy-b); were: {upstream_a}" in log


def test_invalid_registrations_are_rejected_naming_the_field_and_change_nothing(
    gateway: RunningGateway, upstream_url: str
) -> None:
    with gateway.management() as admin:
        current = admin.get("/api/upstreams").json()
        assert current == {"upstreams": [upstream_url], "model": "served-model"}

        cases: list[tuple[Any, str, str]] = [
            ({"upstreams": ["ftp://10.0.0.5:41231"]}, "upstreams", "must start with http:// or https://"),
            ({"upstreams": [upstream_url, "10.0.0.5:41231"]}, "upstreams", "'10.0.0.5:41231' must start"),
            ({"upstreams": ["http://"]}, "upstreams", "not a URL with a host"),
            ({"upstreams": []}, "upstreams", "at least one upstream"),
            ({"upstreams": upstream_url}, "upstreams", "list"),
            ({"model": "m"}, "upstreams", "required"),
            ({"upstreams": [upstream_url], "model": ""}, "model", "at least 1 character"),
            ({"upstreams": [upstream_url], "models": "m"}, "models", "not permitted"),
        ]
        for body, field, problem in cases:
            response = admin.put("/api/upstreams", json=body)
            assert response.status_code == 422, (body, response.text)
            answer = response.json()
            assert answer["error"] == "invalid request"
            assert any(item["field"] == field and problem in item["problem"] for item in answer["fields"]), (
                body,
                answer,
            )

        not_json = admin.put("/api/upstreams", content=b"{nope", headers={"content-type": "application/json"})
        assert not_json.status_code == 400
        assert admin.get("/api/upstreams").json() == current

        with gateway.agent("r1") as agent:
            create_rollouts(admin, "r1")
            assert agent.post(gateway.proxy_path("r1"), json=CHAT).json()["model"] == "served-model"


def test_upstream_routes_need_the_gateway_key(gateway: RunningGateway, upstream_url: str) -> None:
    body = {"upstreams": ["http://10.0.0.5:41231"]}
    anonymous = httpx.put(gateway.url + "/api/upstreams", json=body)
    assert anonymous.status_code == 401
    assert httpx.get(gateway.url + "/api/upstreams").status_code == 401
    wrong = {"authorization": "Bearer not-the-key"}
    assert httpx.put(gateway.url + "/api/upstreams", json=body, headers=wrong).status_code == 403
    assert httpx.get(gateway.url + "/api/upstreams", headers=wrong).status_code == 403
    with gateway.agent("r1") as agent:  # an agent token is not the gateway key
        assert agent.put("/api/upstreams", json=body).status_code == 403
        assert agent.get("/api/upstreams").status_code == 403
    with gateway.management() as admin:
        assert admin.get("/api/upstreams").json()["upstreams"] == [upstream_url]


def test_client_registers_and_reads_upstreams(
    bare_gateway: RunningGateway, two_upstreams: tuple[str, str]
) -> None:
    upstream_a, upstream_b = two_upstreams

    async def scenario() -> None:
        async with GatewayClient(bare_gateway.url, bare_gateway.key) as client:
            assert await client.upstreams() == UpstreamsView(upstreams=[], model="served-model")
            assert await client.set_upstreams([upstream_a, upstream_b], model="policy") == UpstreamsView(
                upstreams=[upstream_a, upstream_b], model="policy"
            )
            assert await client.set_upstreams(url for url in [upstream_b]) == UpstreamsView(
                upstreams=[upstream_b], model="policy"
            )
            with pytest.raises(GatewayError) as error:
                await client.set_upstreams(["grpc://10.0.0.5:1"])
            assert error.value.status == 422
            assert error.value.body["fields"][0]["field"] == "upstreams"
            with pytest.raises(TypeError, match="list of URLs"):
                await client.set_upstreams(upstream_a)
            assert await client.upstreams() == UpstreamsView(upstreams=[upstream_b], model="policy")

        async with GatewayClient(bare_gateway.url, "wrong-key") as intruder:
            with pytest.raises(GatewayError) as denied:
                await intruder.set_upstreams([upstream_a])
            assert denied.value.status == 403

    asyncio.run(scenario())


def test_the_config_accepts_no_upstream_and_checks_urls_as_the_route_does() -> None:
    key = SecretStr("k")
    assert GatewayConfig(run=RUN, key=key).upstreams == ()
    config = GatewayConfig(upstreams=("http://a:1/", "http://a:1", "https://b"), run=RUN, key=key)
    assert config.upstreams == ("http://a:1", "https://b")
    with pytest.raises(ValidationError, match=r"upstream 'a:1' must start with http:// or https://"):
        GatewayConfig(upstreams=("a:1",), run=RUN, key=key)


def test_an_openai_base_url_ending_in_v1_names_the_same_server_as_its_root() -> None:
    key = SecretStr("k")
    config = GatewayConfig(
        upstreams=("http://a:8000/v1", "http://a:8000/v1/", "http://a:8000", "http://b/openai/v1"),
        run=RUN,
        key=key,
    )
    assert config.upstreams == ("http://a:8000", "http://b/openai")
    with pytest.raises(
        ValidationError, match=r"an endpoint's URL; give the server's base URL, e.g. 'http://a/v1'"
    ):
        GatewayConfig(upstreams=("http://a/v1/chat/completions",), run=RUN, key=key)


def test_an_upstream_registered_with_v1_takes_calls_and_a_wrong_path_is_named_in_the_log(
    bare_gateway: RunningGateway, two_upstreams: tuple[str, str]
) -> None:
    """As vLLM's docs write it (`http://host:8000/v1`): before, calls went to `/v1/v1/chat/completions` and
    the agent got the server's bare 404 with no hint anywhere."""
    upstream, _ = two_upstreams
    create_rollouts(bare_gateway.management(), "r-v1")
    with bare_gateway.management() as management:
        registered = management.put("/api/upstreams", json={"upstreams": [f"{upstream}/v1"]})
        assert registered.status_code == 200, registered.text
        assert registered.json()["upstreams"] == [upstream]
    with bare_gateway.agent("r-v1") as agent:
        answer = agent.post(bare_gateway.proxy_path("r-v1"), json=CHAT)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
    with bare_gateway.management() as management:
        wrong = management.put("/api/upstreams", json={"upstreams": [f"{upstream}/nowhere"]})
        assert wrong.status_code == 200, wrong.text
    with bare_gateway.agent("r-v1") as agent:
        answer = agent.post(bare_gateway.proxy_path("r-v1"), json=CHAT)
        assert answer.status_code == 404
    log = bare_gateway.process.log()
    assert f"upstream {upstream}/nowhere answered 404 to POST {upstream}/nowhere/v1/chat/completions" in log


def test_upstream_counts_stay_exact_when_the_set_is_replaced_under_calls_in_flight() -> None:
    upstreams = Upstreams(("http://a", "http://b"))
    first = upstreams.acquire()
    second = upstreams.acquire()
    assert {first, second} == {"http://a", "http://b"}  # fewest in flight first

    upstreams.replace(("http://c",))
    assert upstreams.urls == ("http://c",)
    assert upstreams.acquire() == "http://c"
    upstreams.release(first)  # a call that ends on a removed upstream: no KeyError
    assert upstreams.inflight(first) == 0

    upstreams.replace(("http://c", second))  # registered again while its call is still in flight
    assert upstreams.inflight(second) == 1
    assert upstreams.acquire() == "http://c"  # one in flight each: the order of the set breaks the tie
    assert upstreams.acquire() == second  # 1 in flight against c's 2
    upstreams.release(second)
    upstreams.release(second)
    assert upstreams.inflight(second) == 0
    assert upstreams.acquire() == second  # c still has two in flight
