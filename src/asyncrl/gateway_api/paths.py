"""The per-rollout URLs an agent is given, built and parsed in one place.

The operator and local mode give each agent its model URL (`AGL_OPENAI_BASE_URL`) and event URL
(`AGL_EVENT_URL`); the gateway's proxy reads the rollout, attempt and mode back out of every model call's
path. Both directions live here so the two sides cannot drift apart. Pure: no I/O.
"""

from __future__ import annotations

from typing import NamedTuple

PROXY_PREFIX = "/proxy/rollout/"
OPENAI_SUFFIX = "openai/v1"
ENDPOINTS = frozenset({"chat/completions", "completions"})
MODES = frozenset({"train", "val"})


class ProxyPath(NamedTuple):
    """What a model call's path says: whose call it is, in which mode, to which OpenAI endpoint."""

    rollout_id: str
    attempt_id: str
    mode: str
    endpoint: str


def proxy_base_path(*, rollout_id: str, attempt_id: str, mode: str) -> str:
    """The OpenAI base path of one rollout attempt (the agent appends `/chat/completions` and the like)."""
    return f"{PROXY_PREFIX}{rollout_id}/attempt/{attempt_id}/mode/{mode}/{OPENAI_SUFFIX}"


def events_path(*, rollout_id: str, attempt_id: str) -> str:
    """Where the agent of one rollout attempt posts its events (its reward)."""
    return f"/api/rollouts/{rollout_id}/attempt/{attempt_id}/events"


def parse_proxy_path(path: str) -> ProxyPath | None:
    """The parts of a proxy path built by `proxy_base_path` + endpoint, or None when it is not one of ours."""
    if not path.startswith(PROXY_PREFIX):
        return None
    parts = path[len(PROXY_PREFIX) :].split("/")
    # {rid} attempt {aid} mode {mode} openai v1 {endpoint...}
    if len(parts) < 8 or parts[1] != "attempt" or parts[3] != "mode" or "/".join(parts[5:7]) != OPENAI_SUFFIX:
        return None
    endpoint = "/".join(parts[7:])
    if not parts[0] or not parts[2] or parts[4] not in MODES or endpoint not in ENDPOINTS:
        return None
    return ProxyPath(parts[0], parts[2], parts[4], endpoint)
