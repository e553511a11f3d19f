"""Every HTTP path the gateway serves, defined once: its routes, its client, its access table and the agents
all read them here, so a path cannot be spelled two ways.

The constants are the routes' templates (`{rollout_id}` as FastAPI and Starlette read it); a path with
parameters has a typed helper that fills it. The per-rollout model URL an agent is given
(`AGL_OPENAI_BASE_URL`) is built and parsed here too: the operator and local mode give it to each agent, and
the gateway's proxy reads the rollout, attempt and mode back out of every model call's path. Pure: no I/O.
"""

from __future__ import annotations

from typing import NamedTuple

# Probes and Prometheus (no credential).
HEALTHZ = "/healthz"
READYZ = "/readyz"
METRICS = "/metrics"

# Pauses around a weight update (Agent Lightning's contract) and the inference servers calls go to.
PAUSE = "/proxy/pause"
PAUSE_RENEW = "/proxy/pause/renew"
RESUME = "/proxy/resume"
PAUSE_STATE = "/proxy/state"
UPSTREAMS = "/api/upstreams"

# The rollout store.
ROLLOUTS = "/api/rollouts"
ROLLOUTS_CLAIM = "/api/rollouts/claim"
ROLLOUTS_DELETE = "/api/rollouts/delete"
ROLLOUTS_EVENTS = "/api/rollouts/events"  # many rollouts' events documents in one answer
ROLLOUT = "/api/rollouts/{rollout_id}"
ROLLOUT_TRANSITION = "/api/rollouts/{rollout_id}/transition"
ROLLOUT_LAUNCH = "/api/rollouts/{rollout_id}/launch"
ROLLOUT_EVENTS = "/api/rollouts/{rollout_id}/events"
ATTEMPT_EVENTS = "/api/rollouts/{rollout_id}/attempt/{attempt_id}/events"  # where an agent posts its reward

# What the trainer and the operator read and report.
STATS = "/api/stats"
COMPLETIONS = "/api/completions"
WINDOW_SUMMARY = "/api/window/summary"
TRAINER_REPORT = "/api/trainer/report"

# The agent pool's pods (claim, report) and the operator's release of gone pods' rollouts.
POOL_CLAIM = "/api/pool/claim"
POOL_TRANSITION = "/api/pool/rollouts/{rollout_id}/transition"
POOL_RELEASE = "/api/pool/release"

# The agents' model calls: served by the proxy in front of the router, not by a route.
PROXY_PREFIX = "/proxy/rollout/"
PROXY_CALLS = PROXY_PREFIX + "{rollout_id}/{call:path}"  # every model call of one rollout
OPENAI_SUFFIX = "openai/v1"
ENDPOINTS = frozenset({"chat/completions", "completions"})
MODES = frozenset({"train", "val"})


def rollout_path(rollout_id: str) -> str:
    return ROLLOUT.format(rollout_id=rollout_id)


def rollout_transition_path(rollout_id: str) -> str:
    return ROLLOUT_TRANSITION.format(rollout_id=rollout_id)


def rollout_launch_path(rollout_id: str) -> str:
    return ROLLOUT_LAUNCH.format(rollout_id=rollout_id)


def rollout_events_path(rollout_id: str) -> str:
    return ROLLOUT_EVENTS.format(rollout_id=rollout_id)


def pool_transition_path(rollout_id: str) -> str:
    return POOL_TRANSITION.format(rollout_id=rollout_id)


def events_path(*, rollout_id: str, attempt_id: str) -> str:
    """Where the agent of one rollout attempt posts its events (its reward)."""
    return ATTEMPT_EVENTS.format(rollout_id=rollout_id, attempt_id=attempt_id)


class ProxyPath(NamedTuple):
    """What a model call's path says: whose call it is, in which mode, to which OpenAI endpoint."""

    rollout_id: str
    attempt_id: str
    mode: str
    endpoint: str


def proxy_base_path(*, rollout_id: str, attempt_id: str, mode: str) -> str:
    """The OpenAI base path of one rollout attempt (the agent appends `/chat/completions` and the like)."""
    return f"{PROXY_PREFIX}{rollout_id}/attempt/{attempt_id}/mode/{mode}/{OPENAI_SUFFIX}"


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
