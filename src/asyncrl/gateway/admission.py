"""Limits at admission: what every request passes before a handler, FastAPI or the proxy, sees it.

Agents are the least trusted callers (an agent Job runs whatever the template says, with a token for its own
rollout), so one agent must not be able to hurt a run. Three checks run in this order, each before the next
costs anything:

1. who is calling: the bearer token, checked from the headers alone, before any body byte is read (FastAPI
   reads and parses a body before it runs a route's dependencies, so the check cannot live there);
2. how many body bytes: counted while they arrive, chunked bodies included, against the route's own limit
   (an agent's event body cannot be larger than the event data its rollout may store), so memory never
   holds more than the limit, and the request is refused (413) as soon as it passes it; a body that does
   not arrive within its timeout is refused (408);
3. what the JSON holds: nesting depth, measured on the bytes before anything is parsed, then one parse
   (msgspec, in C) that also refuses non-finite numbers (NaN, Infinity, 1e400), so that whatever is stored
   can always be serialized again, as strict JSON, for the trainer's reads.

Between 1 and 2, an agent token's budget (`budgets.py`: requests in flight, body bytes per second) is
charged, so one agent cannot take the event loop from the others.

Which caller may call which route is `access.py`'s table; the routes' own check (`routes/common.py`) reads
the same table as a second line of defence.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import msgspec

from asyncrl.gateway.access import Caller, Needs, RouteAccess
from asyncrl.gateway.auth import identify
from asyncrl.gateway.budgets import VALUE_COST_BYTES, AgentBudgets, OverBudget, json_values
from asyncrl.gateway.connections import record_caller
from asyncrl.gateway.pause_state import header_seconds

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_FIELD_PARTS_SHOWN = 8
# An event's body beyond its data: `event_type` (64 characters at most), the keys, some whitespace.
EVENT_ENVELOPE_BYTES = 4096
# The parsed body, handed to the route in the request's scope so that it is not parsed a second time.
PARSED_BODY_SCOPE_KEY = "asyncrl.parsed_body"


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


# -- who is calling (which caller may call which route: `access.py`) ------------------------------------

# A refused credential ends the connection after the answer: it is not kept open for another guess.
_CLOSE = {"connection": "close"}


def authorize(key: str, authorization: str | None, access: RouteAccess) -> Caller:
    """Who the caller is when `access` admits it; else refuse with 401 (no token) or 403 (wrong token)."""
    if access.needs is Needs.NOTHING:
        return Caller.ANYONE
    caller = identify(key, authorization, access.rollout_id)
    if caller is None:
        raise Refused(
            401,
            f"missing bearer token ({access.needs.value})",
            rejection_reason="unauthenticated",
            headers={"www-authenticate": "Bearer", **_CLOSE},
        )
    if access.needs.admits(caller):
        return caller
    if access.needs is Needs.ROLLOUT_TOKEN:
        error = "this token is not valid for this rollout"
    else:
        error = f"this route needs {access.needs.value}"
    raise Refused(403, error, rejection_reason="forbidden", headers=_CLOSE)


# -- how many bytes -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BodyLimit:
    """The most bytes a route's body may have, and the flag that sets it (named in the 413)."""

    limit_bytes: int
    setting: str


def body_limit(access: RouteAccess, *, max_body_bytes: int, max_event_bytes: int) -> BodyLimit:
    """An agent's event carries at most the event data its rollout may store (plus its envelope): a larger
    body could never be stored, so it is refused while it arrives instead of after it was parsed."""
    if access.event and max_event_bytes + EVENT_ENVELOPE_BYTES < max_body_bytes:
        return BodyLimit(max_event_bytes + EVENT_ENVELOPE_BYTES, "--max-event-bytes")
    return BodyLimit(max_body_bytes, "--max-body-bytes")


def too_large(limit: BodyLimit) -> Refused:
    return Refused(
        413,
        "request body too large",
        rejection_reason="body_too_large",
        headers=_CLOSE,  # the rest of the body is not read: the connection ends with the answer
        limit_bytes=limit.limit_bytes,
        setting=limit.setting,
    )


def declared_size(declared_length: str | None) -> int | None:
    """The Content-Length as a number; None when absent (chunked) or not a number (the server refuses it)."""
    if declared_length is not None and declared_length.isdigit():
        return int(declared_length)
    return None


async def read_body(
    receive: Receive, *, limit: BodyLimit, declared_length: str | None, timeout_seconds: float
) -> bytes:
    """The whole body, refused (413) as soon as it passes its limit, whether declared or chunked, and (408)
    when it has not all arrived within `timeout_seconds` of the headers.

    Nothing past the limit is kept; the connection is closed with the answer.
    """
    declared = declared_size(declared_length)
    if declared is not None and declared > limit.limit_bytes:
        raise too_large(limit)
    try:
        async with asyncio.timeout(timeout_seconds):
            return await _read_chunks(receive, limit)
    except TimeoutError:
        raise Refused(
            408,
            f"request body not received within {timeout_seconds:g} s",
            rejection_reason="body_timeout",
            headers=_CLOSE,
            setting="--body-timeout-seconds",
        ) from None


async def _read_chunks(receive: Receive, limit: BodyLimit) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit.limit_bytes:
            raise too_large(limit)
        if chunk:
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# -- the connection cap ---------------------------------------------------------------------------------

# How long a caller refused for the connection cap waits: held calls end with the next resume (seconds).
CAPACITY_RETRY_AFTER_SECONDS = 1.0


def admit_connection(scope: MutableMapping[str, Any], caller: Caller) -> None:
    """Record the caller on its connection; 429 + Retry-After (and the connection closed) when the connection
    came above the cap (every slot in a request or the key's) and the caller is not the gateway key."""
    if record_caller(scope, caller):
        return
    raise Refused(
        429,
        "the gateway is at its connection cap: every connection is in a request (calls held through a "
        "pause count); retry after the Retry-After",
        rejection_reason="connection_cap",
        headers={
            "retry-after": header_seconds(CAPACITY_RETRY_AFTER_SECONDS),
            "retry-after-ms": str(round(CAPACITY_RETRY_AFTER_SECONDS * 1000)),
            **_CLOSE,
        },
        setting="--max-connections",
    )


# -- each agent's share ---------------------------------------------------------------------------------

_BUDGET_SETTINGS = {"requests": "--agent-max-requests", "bytes": "--agent-bytes-per-second"}


def over_budget(error: OverBudget) -> Refused:
    if error.budget == "burst":
        return Refused(
            413,
            f"request body costs more than an agent's whole budget: its bytes plus {VALUE_COST_BYTES} bytes "
            "per JSON value exceed --agent-burst-bytes; send fewer values",
            rejection_reason="agent_burst_exceeded",
            headers=_CLOSE,
            setting="--agent-burst-bytes",
        )
    seconds = error.retry_after_seconds
    what = "requests in flight" if error.budget == "requests" else "body bytes per second"
    return Refused(
        429,
        f"this agent token is over its budget of {what}; retry after the Retry-After",
        rejection_reason=f"agent_{error.budget}_budget",
        # Closed with the answer: a body the refusal did not read is not received (and paid for) after all.
        headers={
            "retry-after": header_seconds(seconds),
            "retry-after-ms": str(round(seconds * 1000)),
            **_CLOSE,
        },
        setting=_BUDGET_SETTINGS[error.budget],
    )


def enter_share(budgets: AgentBudgets, rollout_id: str | None) -> None:
    """Count an agent's request in flight (`rollout_id` None: not an agent, nothing counted); 429 when over.
    Every successful call is paired with `budgets.leave(rollout_id)`."""
    if rollout_id is None:
        return
    try:
        budgets.enter(rollout_id)
    except OverBudget as error:
        raise over_budget(error) from None


async def read_charged_body(
    receive: Receive,
    *,
    budgets: AgentBudgets,
    rollout_id: str | None,
    limit: BodyLimit,
    declared_length: str | None,
    timeout_seconds: float,
) -> bytes:
    """`read_body`, with an agent's body charged to its budget: its bytes before it is read when its length
    is declared (else once it has arrived), and its JSON values once it has arrived, before it is parsed.
    `rollout_id` None: not an agent's."""
    declared = declared_size(declared_length)
    if declared is not None and declared > limit.limit_bytes:
        raise too_large(limit)
    charged = 0  # taken before the body was read; refunded if the request is refused after all
    try:
        if rollout_id is not None and declared is not None:
            budgets.charge(rollout_id, declared)
            charged = declared
        body = await read_body(
            receive, limit=limit, declared_length=declared_length, timeout_seconds=timeout_seconds
        )
        if rollout_id is not None:
            values_cost = VALUE_COST_BYTES * json_values(body) if body else 0
            budgets.charge_all(rollout_id, charged, values_cost + (len(body) if declared is None else 0))
    except OverBudget as error:
        raise over_budget(error) from None
    except BaseException:
        if charged:  # the body never came (timeout, too large, client gone): nothing was used
            budgets.refund(rollout_id, charged)  # type: ignore[arg-type]
        raise
    return body


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands over the body read at admission, then the connection's own messages.

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


_DECODER = msgspec.json.Decoder()
# A \uD800-\uDBFF escape not followed by a \uDC00-\uDFFF one, or one of those not preceded by the first kind:
# msgspec refuses it as "Input data was truncated", which would send a client looking in the wrong place.
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)
# A refused body this small is parsed again (by the standard parser) to name its field; a larger one is not.
NAMING_PARSE_MAX_BYTES = 64 * 1024
# Byte maps of the depth measure: every bracket becomes ( or ), everything else is deleted.
_TO_PARENS = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")


def nested_deeper_than(raw: bytes, max_depth: int) -> bool:
    """Whether valid JSON `raw` nests containers more than `max_depth` deep, from its bytes alone.

    String contents are dropped first (escaped backslashes and quotes, then every other quoted piece), the
    brackets left are reduced to parentheses, and each pass removes the innermost pairs: after `max_depth`
    passes, something is left only when the JSON was deeper. Every step is a C loop over bytes, so a body of
    millions of containers costs milliseconds, not the seconds a walk of its parsed value took. Bodies that
    are not valid JSON may be measured wrongly; the parser refuses them anyway.
    """
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return False
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    structure = b"".join(unescaped.split(b'"')[::2]).translate(_TO_PARENS, _NOT_BRACKETS)
    for _ in range(max_depth):
        reduced = structure.replace(b"()", b"")
        if not reduced or reduced == structure:  # done, or unbalanced (invalid JSON: the parser says so)
            return False
        structure = reduced
    return True


def parse_json(raw: bytes, *, max_depth: int, count_parsed: Callable[[int], None] | None = None) -> Any:
    """The body as JSON, refused when invalid (400), nested deeper than `max_depth`, or not finite (422).

    Not finite: NaN, Infinity, or a number too large for a float (1e400), which would come back as Infinity.
    The depth is measured on the bytes first, then the body is parsed once, in C (msgspec). A refused body is
    parsed again by the slower standard parser to name the field at fault only when it is small; a larger
    one too deep is refused unparsed. `count_parsed` is told the size of every body handed to a parser.
    """
    too_deep = nested_deeper_than(raw, max_depth)
    if too_deep and len(raw) > NAMING_PARSE_MAX_BYTES:
        raise _too_deep(max_depth, path=None)
    if count_parsed is not None:
        count_parsed(len(raw))
    if not too_deep:
        try:
            return _DECODER.decode(raw)
        except RecursionError:  # unbalanced brackets deeper than msgspec goes: named below
            pass
        except msgspec.DecodeError as error:
            detail = str(error)
            if "truncated" in detail and (lone := _LONE_SURROGATE.search(raw)) is not None:
                detail = (
                    f"a string holds the escape {lone.group().decode()} without its pair: a lone UTF-16 "
                    "surrogate is not a Unicode character; send the character as UTF-8, or both escapes of "
                    "its surrogate pair"
                )
            if b"NaN" not in raw and b"Infinity" not in raw and "out of range" not in detail:
                raise Refused(
                    400,
                    "request body is not valid JSON",
                    rejection_reason="json_invalid",
                    detail=detail[:300],
                ) from error
    return _parse_naming_the_field(raw, max_depth=max_depth)


def _parse_naming_the_field(raw: bytes, *, max_depth: int) -> Any:
    """The standard library's parse, which names the field of a non-finite number or a too-deep value."""
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
