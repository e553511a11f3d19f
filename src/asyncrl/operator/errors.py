"""One readable line for an error, for Events and the run's status.

An `ApiException`'s text is a dump (status line, HTTP headers, the JSON body); a user needs the API server's
own message (`Secret "x" not found`), and an Event must never carry headers.
"""

from __future__ import annotations

import json

MAX_MESSAGE_CHARS = 1000


def one_line(error: BaseException) -> str:
    """The API server's message for an ApiException, else the exception's text, on one bounded line."""
    text = _api_message(error) or str(error) or type(error).__name__
    if isinstance(error, KeyError) and text.startswith(("'", '"')):
        text = text[1:-1]  # KeyError quotes its argument
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def api_status(error: BaseException) -> int | None:
    """The HTTP status of an ApiException (None for anything else)."""
    status = getattr(error, "status", None)
    return status if isinstance(status, int) and status > 0 else None


def _api_message(error: BaseException) -> str | None:
    status = api_status(error)
    if status is None:
        return None
    body = getattr(error, "body", None)
    message = None
    if body:
        try:
            message = json.loads(body).get("message")
        except (ValueError, TypeError, AttributeError):
            message = None
    reason = getattr(error, "reason", None) or "error"
    return f"{message} (HTTP {status})" if message else f"HTTP {status} {reason}"
