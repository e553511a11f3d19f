"""Limits at the door: what every request passes before a handler, FastAPI or the proxy, sees it.

Agents are the least trusted callers (an agent Job runs whatever the template says, with a token for its own
rollout), so one agent must not be able to hurt a run. Three checks run in this order, each before the next
costs anything:

1. who is calling: the bearer token, checked from the headers alone, before any body byte is read (FastAPI
   reads and parses a body before it runs a route's dependencies, so the check cannot live there);
2. how many body bytes: counted while they arrive, chunked bodies included, so memory never holds more
   than the limit, and the request is refused (413) as soon as it passes it;
3. what the JSON holds: nesting depth and non-finite numbers (NaN, Infinity, 1e400), so that whatever is
   stored can always be serialized again, as strict JSON, for the trainer's reads.

The route table below is the one place that says which routes an agent token may call; the FastAPI
dependencies in `api.py` repeat the same rule as a second line of defence.
"""

from __future__ import annotations

import hmac
import json
import math
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from asyncrl.gateway.auth import Access, bearer, check_access, pool_token

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
POOL_PATH_PREFIX = "/api/pool/"
_ROLLOUT_READ = re.compile(r"^/api/rollouts/(?P<rollout_id>[^/]+)$")
_ROLLOUT_EVENTS = re.compile(r"^/api/rollouts/(?P<rollout_id>[^/]+)/attempt/[^/]+/events$")
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_FIELD_PARTS_SHOWN = 8


CLIENT_GONE = 499  # the metric's status for a request whose client disconnected (nothing is sent)


class ClientGone(Exception):
    """The client disconnected (mid-body, or while its call was held): there is no one to answer."""


class Refused(Exception):
    """A request answered with an error before (or instead of) its handler; `body` is the JSON sent.

    `rejection_reason`, when set, labels the refusal in the `asyncrl_gateway_rejections_total` metric.
    """

    def __init__(
        self,
        status: int,
        error: str,
        *,
        rejection_reason: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(error)
        self.status = status
        self.rejection_reason = rejection_reason
        self.body: dict[str, Any] = {"error": error, **extra}
        self.headers = headers or {}


# -- who may call what ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouteAccess:
    """What a route needs: nothing (`public`), the gateway key, or a token for `rollout_id`."""

    public: bool = False
    rollout_id: str | None = None  # None and not public: the gateway key
    pool: bool = False  # the agent pool's routes: the gateway key or the pool token (pool_api.py)


def route_access(method: str, path: str) -> RouteAccess:
    """The access a management-API request needs; every path not listed needs the gateway key."""
    if path in PUBLIC_PATHS:
        return RouteAccess(public=True)
    if method == "GET" and (match := _ROLLOUT_READ.match(path)):
        return RouteAccess(rollout_id=match["rollout_id"])
    if method == "POST" and (match := _ROLLOUT_EVENTS.match(path)):
        return RouteAccess(rollout_id=match["rollout_id"])
    if path.startswith(POOL_PATH_PREFIX):
        return RouteAccess(pool=True)
    return RouteAccess()


def authorize(key: str, authorization: str | None, access: RouteAccess) -> None:
    """Return when the caller may proceed; else refuse with 401 (no token) or 403 (wrong token)."""
    if access.public:
        return
    token = bearer(authorization)
    if access.pool and token is not None and hmac.compare_digest(token.encode(), pool_token(key).encode()):
        return
    granted = check_access(key, authorization, access.rollout_id)
    if granted is Access.MANAGEMENT or (granted is Access.ROLLOUT and access.rollout_id is not None):
        return
    if granted is Access.MISSING:
        needed = "the gateway key" if access.rollout_id is None else "the gateway key or this rollout's token"
        raise Refused(
            401,
            f"missing bearer token ({needed})",
            rejection_reason="unauthenticated",
            headers={"www-authenticate": "Bearer"},
        )
    if access.rollout_id is None:
        raise Refused(403, "this route needs the gateway key", rejection_reason="forbidden")
    raise Refused(403, "this token is not valid for this rollout", rejection_reason="forbidden")


# -- how many bytes -------------------------------------------------------------------------------------


def too_large(limit: int) -> Refused:
    return Refused(
        413,
        "request body too large",
        rejection_reason="body_too_large",
        limit_bytes=limit,
        setting="--max-body-bytes",
    )


async def read_body(receive: Receive, *, limit: int, declared_length: str | None) -> bytes:
    """The whole body, refused (413) as soon as it passes `limit` bytes, whether declared or chunked.

    Nothing past the limit is kept; the server discards what the client still sends after the answer.
    """
    if declared_length is not None and declared_length.isdigit() and int(declared_length) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands over the body read at the door, then the connection's own messages.

    After the body, the next message of a request is its disconnect; the claim long-poll waits for it.
    """
    delivered = False

    async def replayed() -> Message:
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


# -- what the JSON holds --------------------------------------------------------------------------------


class _NonFinite:
    """What the parser returns for NaN, Infinity or 1e400, so the checker can name the field holding it."""

    __slots__ = ("literal",)

    def __init__(self, literal: str) -> None:
        self.literal = literal


_INFINITIES = (math.inf, -math.inf)


class _NotFiniteSeen(Exception):
    """Raised by the strict parser's hooks: parse again, marking, to name the field."""


def _refuse(literal: str) -> Any:
    raise _NotFiniteSeen(literal)


def _finite_or_refuse(literal: str) -> float:
    value = float(literal)
    if value in _INFINITIES:
        raise _NotFiniteSeen(literal)
    return value


def _finite_or_mark(literal: str) -> float | _NonFinite:
    value = float(literal)
    return _NonFinite(literal) if value in _INFINITIES else value


# Shared parsers (the hot path makes one per request otherwise): the strict one for every body, the marking
# one only to find the field of a non-finite number the strict one stopped at.
_STRICT = json.JSONDecoder(parse_constant=_refuse, parse_float=_finite_or_refuse)
_MARKING = json.JSONDecoder(parse_constant=_NonFinite, parse_float=_finite_or_mark)


def parse_json(raw: bytes, *, max_depth: int) -> Any:
    """The body as JSON, refused when invalid (400), nested deeper than `max_depth`, or not finite (422).

    Not finite: NaN, Infinity, or a number too large for a float (1e400), which would come back as Infinity.
    The depth is walked only when the bytes hold more brackets than the limit, so ordinary model calls cost
    one parse and two byte scans.
    """
    try:
        text = raw.decode(json.detect_encoding(raw), "surrogatepass")
        try:
            value = _STRICT.decode(text)
        except _NotFiniteSeen:
            value = _MARKING.decode(text)
            not_finite = True
        else:
            not_finite = False
    except RecursionError:
        raise _too_deep(max_depth, path=None) from None
    except ValueError as error:  # JSONDecodeError, bad UTF-8, an integer over Python's 4300 digits
        detail = str(error)
        if "integer string conversion" in detail:
            detail = "an integer has more than 4300 digits"
        raise Refused(
            400, "request body is not valid JSON", rejection_reason="json_invalid", detail=detail[:300]
        ) from error
    if not_finite or raw.count(b"[") + raw.count(b"{") > max_depth:
        problem = find_json_problem(value, max_depth=max_depth)
        if problem is not None:
            kind, path = problem
            if kind == "too_deep":
                raise _too_deep(max_depth, path=path)
            raise Refused(
                422,
                "NaN, Infinity and numbers too large for a float are not accepted; send a finite number",
                rejection_reason="json_not_finite",
                field=field_name(path),
            )
    return value


def find_json_problem(value: Any, *, max_depth: int) -> tuple[str, tuple[str | int, ...]] | None:
    """("too_deep" | "not_finite", path) of the first problem in a parsed value, or None.

    Iterative (a recursive walk is what fails on deep input); the top-level container is depth 1.
    """
    if isinstance(value, _NonFinite):
        return "not_finite", ()
    if not isinstance(value, dict | list):
        return None
    path: list[str | int] = []
    stack = [_members(value)]
    while stack:
        for key, child in stack[-1]:
            if isinstance(child, _NonFinite):
                return "not_finite", (*path, key)
            if isinstance(child, dict | list):
                if len(stack) >= max_depth:
                    return "too_deep", (*path, key)
                path.append(key)
                stack.append(_members(child))
                break
        else:
            stack.pop()
            if path:
                path.pop()
    return None


def _members(value: dict[str, Any] | list[Any]) -> Any:
    return iter(value.items()) if isinstance(value, dict) else enumerate(value)


def field_name(path: tuple[str | int, ...]) -> str:
    """A JSON path as FastAPI names fields (`data.d.0.0`), shortened after a few parts."""
    parts = [str(part) for part in path[:_FIELD_PARTS_SHOWN]]
    if len(path) > _FIELD_PARTS_SHOWN:
        parts.append("…")
    return ".".join(parts) or "(body)"


def _too_deep(max_depth: int, *, path: tuple[str | int, ...] | None) -> Refused:
    return Refused(
        422,
        f"JSON nested deeper than {max_depth} levels",
        rejection_reason="json_too_deep",
        field="(body)" if path is None else field_name(path),
        limit=max_depth,
        setting="--max-json-depth",
    )
