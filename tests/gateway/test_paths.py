"""Every gateway path is defined once, in `gateway_api/paths.py`: the routes, the clients and the access table
name it from there (an AST scan finds a spelled-out path), and every path defined there is served."""

from __future__ import annotations

import ast
from pathlib import Path

import asyncrl
from asyncrl.gateway.app import build_gateway
from asyncrl.gateway.config import GatewayConfig
from asyncrl.gateway.run_settings import standalone_defaults
from asyncrl.gateway_api import paths

PACKAGE = Path(asyncrl.__file__).parent
# The gateway's own path roots. Not `/v1`: the gateway serves none; `/v1/...` is where it forwards a model
# call on its upstream (vLLM's OpenAI server), a path of that server's.
GATEWAY_PATH_ROOTS = ("/api", "/proxy", "/healthz", "/readyz", "/metrics")
# Where the gateway's paths are served, called or ruled on: the server, its wire contract (client included)
# and the agent pool's runner, which calls the pool routes.
SCANNED = [
    *sorted((PACKAGE / "gateway").rglob("*.py")),
    *sorted(path for path in (PACKAGE / "gateway_api").glob("*.py") if path.name != "paths.py"),
    PACKAGE / "agent_pool.py",
]
PROXY_PATHS = {paths.PROXY_PREFIX, paths.PROXY_CALLS}  # the proxy's, in front of the router


def spelled_paths(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant in `source` that starts with a gateway path root, f-strings'
    literal parts included; docstrings are prose and left out."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith(GATEWAY_PATH_ROOTS)
        and id(node) not in docstrings
    )


def test_the_scan_finds_a_path_spelled_in_a_call_an_fstring_or_a_decorator() -> None:
    source = '''
"""/api/stats in a module docstring is prose."""
@router.get("/api/stats")
async def stats(client, rollout_id):
    """`GET /api/rollouts/{rollout_id}`, prose too."""
    await client.get(f"/api/rollouts/{rollout_id}/events")
    return "/healthz"
'''
    assert sorted(text for _, text in spelled_paths(source)) == ["/api/rollouts/", "/api/stats", "/healthz"]


def test_no_route_client_or_access_rule_spells_a_gateway_path() -> None:
    spelled = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for path in SCANNED
        for line, text in spelled_paths(path.read_text())
    ]
    assert spelled == [], "use asyncrl.gateway_api.paths instead of:\n" + "\n".join(spelled)


def _defined_paths() -> set[str]:
    return {
        value
        for name, value in vars(paths).items()
        if name.isupper() and isinstance(value, str) and value.startswith("/")
    }


def _served_paths() -> set[str]:
    """The path template of every route of the gateway's FastAPI router, as its OpenAPI document lists them
    (no route of the gateway is left out of the document)."""
    api = build_gateway(GatewayConfig(run=standalone_defaults(model="m"), key="k" * 32)).api
    return set(api.openapi()["paths"])


def test_every_path_defined_is_served_by_the_router_and_every_route_is_defined() -> None:
    assert _defined_paths() - PROXY_PATHS == _served_paths()


def test_no_route_sits_under_the_proxy_prefix_where_the_proxy_would_take_its_calls() -> None:
    assert [path for path in _served_paths() if path.startswith(paths.PROXY_PREFIX)] == []


def test_the_path_helpers_fill_their_templates() -> None:
    assert paths.rollout_path("r1") == "/api/rollouts/r1"
    assert paths.rollout_transition_path("r1") == "/api/rollouts/r1/transition"
    assert paths.rollout_launch_path("r1") == "/api/rollouts/r1/launch"
    assert paths.rollout_events_path("r1") == "/api/rollouts/r1/events"
    assert paths.pool_transition_path("r1") == "/api/pool/rollouts/r1/transition"
    assert paths.events_path(rollout_id="r1", attempt_id="a1") == "/api/rollouts/r1/attempt/a1/events"
    base = paths.proxy_base_path(rollout_id="r1", attempt_id="a1", mode="train")
    assert paths.parse_proxy_path(base + "/chat/completions") == ("r1", "a1", "train", "chat/completions")
