"""Retries with backoff for the operator's calls to the API server and the gateway, and one-line reasons.

The rule the operator follows everywhere: a transient failure (no connection, a timeout, HTTP 429 or 5xx)
is retried with capped exponential backoff and jitter; a rejection (any other 4xx, or a body the client
refused before sending) is final and is reported as one readable line, never an exception dump with headers.
The retrying itself is stamina's (jittered exponential backoff, a total deadline, async-aware); this module
adds what the operator needs around it: which failures are transient, one log line per retry with its
reason, and `GaveUp` with the last reason once the deadline has passed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypedDict, TypeVar

import httpx
import pydantic
import stamina

from asyncrl.gateway_api.client import GatewayError

logger = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT_HTTP_STATUSES = frozenset({408, 429})


class StaminaWaits(TypedDict):
    """`stamina.retry_context`'s delay arguments, typed one by one: since stamina 26.2 it also takes
    `name: str`, so a `dict[str, float]` spread into it no longer type-checks."""

    wait_initial: float
    wait_max: float
    wait_exp_base: float
    wait_jitter: float


@dataclass(frozen=True)
class Backoff:
    """stamina's delays: `first_seconds`, growing by `factor` up to `max_seconds`, each plus up to
    `jitter_seconds` (spreads the retries of many rollouts hitting the same outage)."""

    first_seconds: float = 0.5
    max_seconds: float = 10.0
    factor: float = 2.0
    jitter_seconds: float = 0.5

    def nominal_seconds(self, attempt: int) -> float:
        """The delay after failed attempt number `attempt` (1-based), without its jitter."""
        return min(self.max_seconds, self.first_seconds * self.factor ** min(attempt - 1, 64))

    def stamina_waits(self) -> StaminaWaits:
        """The keyword arguments of `stamina.retry_context` that set these delays."""
        return {
            "wait_initial": self.first_seconds,
            "wait_max": self.max_seconds,
            "wait_exp_base": self.factor,
            "wait_jitter": self.jitter_seconds,
        }


class GaveUp(RuntimeError):
    """Transient failures lasted past the deadline; `reason` is the last one, as one line."""

    def __init__(self, reason: str, *, attempts: int, seconds: float) -> None:
        super().__init__(f"still failing after {attempts} attempts in {seconds:.0f} s: {reason}")
        self.reason = reason
        self.attempts = attempts


KUBE_BACKOFF = Backoff(first_seconds=0.5, max_seconds=10.0)  # the API server's transient errors


async def retry_transient(
    call: Callable[[], Awaitable[T]],
    *,
    is_transient: Callable[[BaseException], bool],
    what: str,
    backoff: Backoff = Backoff(),
    deadline_seconds: float | None = None,
    on_retry: Callable[[BaseException], None] | None = None,
) -> T:
    """`await call()` until it succeeds or fails for good.

    A failure that `is_transient` accepts is retried after stamina's next backoff delay; any other failure
    is raised at once. With `deadline_seconds`, a transient failure after the deadline raises `GaveUp`.
    """
    started = time.monotonic()
    attempts = 0

    def retry_if_transient(error: BaseException) -> bool:
        if not is_transient(error):
            return False
        if deadline_seconds is not None and time.monotonic() - started >= deadline_seconds:
            return True  # stamina's deadline has passed too: it gives up, and so do we below
        logger.info(
            "%s failed (attempt %d), retrying in about %.1f s: %s",
            what,
            attempts,
            backoff.nominal_seconds(attempts),
            one_line_reason(error),
        )
        if on_retry is not None:
            on_retry(error)
        return True

    try:
        async for attempt in stamina.retry_context(
            on=retry_if_transient, attempts=None, timeout=deadline_seconds, **backoff.stamina_waits()
        ):
            attempts = attempt.num
            with attempt:
                return await call()
    except Exception as error:
        if deadline_seconds is None or not is_transient(error):
            raise
        raise GaveUp(one_line_reason(error), attempts=attempts, seconds=time.monotonic() - started) from error
    raise AssertionError("stamina ended its attempts without an outcome")  # never: attempts=None


def kube_error_is_transient(error: BaseException) -> bool:
    """The API server was unreachable, overloaded or failing (0, 408, 429, 5xx); not a rejection."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(error, ApiException):
        status = int(error.status or 0)
        return status == 0 or status in TRANSIENT_HTTP_STATUSES or status >= 500
    import urllib3.exceptions

    return isinstance(error, OSError | TimeoutError | urllib3.exceptions.HTTPError)


def gateway_error_is_transient(error: BaseException) -> bool:
    """The gateway was unreachable (starting, restarting) or answered 408/429/5xx."""
    if isinstance(error, GatewayError):
        return error.status in TRANSIENT_HTTP_STATUSES or error.status >= 500
    return isinstance(error, httpx.TransportError)


def one_line_reason(error: BaseException) -> str:
    """What went wrong, in one line: the API server's own message and code, never the response headers."""
    from kubernetes.client.exceptions import ApiException

    if isinstance(error, GaveUp):
        text = str(error)
    elif isinstance(error, ApiException):
        text = _api_exception_reason(error)
    elif isinstance(error, GatewayError):
        text = f"gateway answered {error.status}: {error.error}"
    elif isinstance(error, pydantic.ValidationError):  # the Kubernetes client refused the body before sending
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}"
            for problem in error.errors()
        )
        text = f"invalid {error.title} request: {problems}"
    else:
        text = str(error).strip() or type(error).__name__
        first = text.splitlines()[0]
        text = first if first.startswith(type(error).__name__) else f"{type(error).__name__}: {first}"
    return " ".join(text.split())[:1000]


def _api_exception_reason(error: object) -> str:
    status = getattr(error, "status", None) or 0
    message = str(getattr(error, "reason", None) or "").strip()
    body = getattr(error, "body", None)
    if body:
        try:
            parsed = json.loads(body)
        except (TypeError, ValueError):
            parsed = None
        if isinstance(parsed, dict) and parsed.get("message"):
            message = str(parsed["message"])
            if parsed.get("reason"):
                return f"{parsed['reason']} ({status}): {message}"
    if status == 0:
        return f"no answer from the API server: {message.splitlines()[0] if message else 'connection failed'}"
    return f"HTTP {status}: {message or 'no message'}"


async def kube_call(call: Callable[[], Awaitable[T]], *, what: str) -> T:
    """An API server call, its transient failures retried for up to a minute (then `GaveUp`)."""
    return await retry_transient(
        call, is_transient=kube_error_is_transient, what=what, backoff=KUBE_BACKOFF, deadline_seconds=60
    )
