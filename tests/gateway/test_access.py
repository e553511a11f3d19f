"""Who may call which route: `access.py`'s one table, read by the door, by every route's own check and by the
proxy. Without HTTP sockets: the pure rules, then the FastAPI app alone (no door in front of it)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from asyncrl.gateway import access
from asyncrl.gateway.access import ANY_METHOD, ROUTES, Caller, Needs, RouteAccess, route_access
from asyncrl.gateway.admission import Refused, authorize
from asyncrl.gateway.app import build_gateway
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.run_settings import standalone_defaults
from asyncrl.gateway_api.paths import events_path, proxy_base_path
from asyncrl.gateway_api.tokens import agent_token, pool_token

KEY = "k" * 32
POOL = pool_token(KEY)
AGENT_R1 = agent_token(KEY, "r1")


def _bearer(token: str) -> str:
    return f"Bearer {token}"


def test_route_access_lets_an_agent_token_reach_only_its_rollout_routes() -> None:
    assert route_access("GET", "/metrics") == RouteAccess(Needs.NOTHING)
    assert route_access("POST", "/healthz") == RouteAccess(Needs.NOTHING)  # any method: FastAPI says 405
    assert route_access("GET", "/api/rollouts/r1") == RouteAccess(Needs.ROLLOUT_TOKEN, rollout_id="r1")
    assert route_access("POST", events_path(rollout_id="r1", attempt_id="a1")) == RouteAccess(
        Needs.ROLLOUT_TOKEN, rollout_id="r1", event=True
    )
    proxied = proxy_base_path(rollout_id="r1", attempt_id="a1", mode="train") + "/chat/completions"
    assert route_access("POST", proxied) == RouteAccess(Needs.ROLLOUT_TOKEN, rollout_id="r1")
    for method, path in [
        ("GET", "/api/rollouts/r1/events"),
        ("POST", "/api/rollouts/r1/transition"),
        ("POST", "/api/rollouts/claim"),
        ("GET", "/api/rollouts"),
        ("POST", "/proxy/pause"),
        ("GET", "/no/such/route"),
    ]:
        assert route_access(method, path) == RouteAccess(Needs.GATEWAY_KEY), (method, path)


def test_the_pool_token_opens_claim_and_report_and_release_needs_the_gateway_key() -> None:
    claim = route_access("POST", "/api/pool/claim")
    report = route_access("POST", "/api/pool/rollouts/r1/transition")
    release = route_access("POST", "/api/pool/release")
    assert claim.needs is report.needs is Needs.POOL_TOKEN
    assert release.needs is Needs.GATEWAY_KEY
    for opened in (claim, report):
        assert authorize(KEY, _bearer(POOL), opened) is Caller.POOL
        assert authorize(KEY, _bearer(KEY), opened) is Caller.KEY
    refusals = [
        (release, POOL, "this route needs the gateway key"),
        (route_access("GET", "/api/stats"), POOL, "this route needs the gateway key"),
        (route_access("GET", "/api/rollouts/r1"), POOL, "this token is not valid for this rollout"),
        (claim, AGENT_R1, "this route needs the gateway key or the agent pool token"),
        (report, AGENT_R1, "this route needs the gateway key or the agent pool token"),  # even r1's own token
        (route_access("GET", "/api/pool/claim"), POOL, "this route needs the gateway key"),  # POST only
    ]
    for needed, token, error in refusals:
        with pytest.raises(Refused) as refused:
            authorize(KEY, _bearer(token), needed)
        assert (refused.value.status, refused.value.body) == (403, {"error": error}), (needed, token[:5])
    with pytest.raises(Refused) as missing:
        authorize(KEY, None, claim)
    assert (missing.value.status, missing.value.body) == (
        401,
        {"error": "missing bearer token (the gateway key or the agent pool token)"},
    )


def _app_routes() -> set[tuple[str, str]]:
    """(method, path template) of every FastAPI route, as its OpenAPI document lists them."""
    api = build_gateway(GatewayConfig(run=standalone_defaults(model="m"), key=KEY)).api
    return {
        (method.upper(), path) for path, operations in api.openapi()["paths"].items() for method in operations
    }


def test_every_rule_of_the_table_names_a_route_the_gateway_serves() -> None:
    served = _app_routes()
    served_paths = {path for _, path in served}
    for rule in ROUTES:
        if rule.path.startswith("/proxy/rollout/"):  # the proxy's, outside FastAPI: its own test checks it
            continue
        if rule.method == ANY_METHOD:
            assert rule.path in served_paths, rule
        else:
            assert (rule.method, rule.path) in served, rule


def _call(method: str, path: str, token: str | None, body: Any = None) -> httpx.Response:
    """One request to the FastAPI app alone, without the door in front: only the routes' own check runs."""
    api = build_gateway(GatewayConfig(run=standalone_defaults(model="m"), key=KEY)).api

    async def call() -> httpx.Response:
        headers = {} if token is None else {"authorization": _bearer(token)}
        transport = httpx.ASGITransport(app=api)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            return await client.request(method, path, json=body, headers=headers)

    return asyncio.run(call())


CLAIM = {"worker": "pod-1", "wait_seconds": 0}
RELEASE = {"live_workers": [], "min_age_seconds": 0}


def test_without_the_door_the_routes_own_check_reads_the_same_table_for_the_pool_routes() -> None:
    assert _call("POST", "/api/pool/claim", POOL, CLAIM).json()["rollout"] is None
    refused = _call("POST", "/api/pool/claim", AGENT_R1, CLAIM)
    assert (refused.status_code, refused.json()) == (
        403,
        {"error": "this route needs the gateway key or the agent pool token"},
    )
    assert refused.headers["connection"] == "close"
    for method, path, body in (("POST", "/api/pool/release", RELEASE), ("GET", "/api/stats", None)):
        refused = _call(method, path, POOL, body)
        assert (refused.status_code, refused.json()) == (403, {"error": "this route needs the gateway key"})
    assert _call("POST", "/api/pool/release", KEY, RELEASE).json() == {"failed": []}
    assert _call("POST", "/api/pool/claim", None, CLAIM).status_code == 401


def test_a_pool_route_taken_out_of_the_table_is_closed_to_the_pool_token_at_the_door_and_the_route(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(access, "ROUTES", tuple(rule for rule in ROUTES if rule.path != "/api/pool/claim"))
    with pytest.raises(Refused) as at_the_door:
        authorize(KEY, _bearer(POOL), route_access("POST", "/api/pool/claim"))
    assert at_the_door.value.body == {"error": "this route needs the gateway key"}
    at_the_route = _call("POST", "/api/pool/claim", POOL, CLAIM)
    assert (at_the_route.status_code, at_the_route.json()) == (403, at_the_door.value.body)
