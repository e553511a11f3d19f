"""Who may call which route: the one table that admission, the routes' own check and the proxy all read.

Four callers exist: anyone (the kubelet, Prometheus), a rollout's agent (its own token), the agent pool's pods
(the pool token) and the trainer and operator (the gateway key, which opens everything). `ROUTES` lists every
route that asks less than the gateway key; a route not listed asks for the key. Before this table the rule
was said four times (admission's path patterns, two FastAPI dependencies, and the pool routes' own token
checks), and the pool's copy let the pool token's body be read on a route that then refused it.

Paths are matched by Starlette's own path compiler, so a template here means what it means to the router.
Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, IntEnum

from starlette.routing import compile_path

from asyncrl.gateway_api import paths

ANY_METHOD = "*"


class Caller(IntEnum):
    """Who a request proved to be, in increasing trust; the connection keeps the highest it has seen."""

    ANYONE = 0  # no credential, or a token that proves nothing on this route
    AGENT = 1  # a rollout's agent token, on that rollout's routes: the budgets apply
    POOL = 2  # the agent pool's token
    KEY = 3  # the gateway key: the trainer and the operator


class Needs(Enum):
    """What a route asks of its caller; the value names the credential in a refusal."""

    NOTHING = "nothing"
    GATEWAY_KEY = "the gateway key"
    ROLLOUT_TOKEN = "the gateway key or this rollout's token"
    POOL_TOKEN = "the gateway key or the agent pool token"

    def admits(self, caller: Caller) -> bool:
        return caller in ADMITTED[self]


ADMITTED: Mapping[Needs, frozenset[Caller]] = {
    Needs.NOTHING: frozenset(Caller),
    Needs.GATEWAY_KEY: frozenset({Caller.KEY}),
    Needs.ROLLOUT_TOKEN: frozenset({Caller.KEY, Caller.AGENT}),
    Needs.POOL_TOKEN: frozenset({Caller.KEY, Caller.POOL}),
}


@dataclass(frozen=True)
class RouteRule:
    """One route that asks less than the gateway key: its method (`ANY_METHOD`: all), its path template
    (`{rollout_id}` names the rollout whose token it takes), and whether its body is an agent's event."""

    method: str
    path: str
    needs: Needs
    event: bool = False
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", compile_path(self.path)[0])


ROUTES: tuple[RouteRule, ...] = (
    # The agents' model calls (the proxy's hot path, first so that it is matched first).
    RouteRule("POST", paths.PROXY_CALLS, Needs.ROLLOUT_TOKEN),
    # The kubelet's probes and Prometheus.
    RouteRule(ANY_METHOD, paths.HEALTHZ, Needs.NOTHING),
    RouteRule(ANY_METHOD, paths.READYZ, Needs.NOTHING),
    RouteRule(ANY_METHOD, paths.METRICS, Needs.NOTHING),
    # An agent reads its rollout (is it cancelled?) and posts its events (its reward).
    RouteRule("GET", paths.ROLLOUT, Needs.ROLLOUT_TOKEN),
    RouteRule("POST", paths.ATTEMPT_EVENTS, Needs.ROLLOUT_TOKEN, event=True),
    # The agent pool's pods take rollouts and report them; releasing other pods' rollouts is the operator's.
    RouteRule("POST", paths.POOL_CLAIM, Needs.POOL_TOKEN),
    RouteRule("POST", paths.POOL_TRANSITION, Needs.POOL_TOKEN),
)


@dataclass(frozen=True)
class RouteAccess:
    """What one request needs: its route's `Needs`, the rollout its path names (None: none), and whether its
    body is an agent's event (bounded by the event limit, not the body limit)."""

    needs: Needs = Needs.GATEWAY_KEY
    rollout_id: str | None = None
    event: bool = False


def route_access(method: str, path: str) -> RouteAccess:
    """The access a request needs: its first rule in `ROUTES`, or the gateway key."""
    for rule in ROUTES:
        if rule.method != ANY_METHOD and rule.method != method:
            continue
        if match := rule.pattern.match(path):
            rollout_id = match.groupdict().get("rollout_id")
            return RouteAccess(needs=rule.needs, rollout_id=rollout_id, event=rule.event)
    return RouteAccess()
