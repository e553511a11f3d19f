"""Waiting for a condition in tests and tools, with a timeout that names what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The awaited condition did not hold in time; the message names it and the last value seen."""


def wait_for(probe: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.2) -> T:
    """Call `probe` until it returns something truthy and return that; `WaitTimeout` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while True:
        last = probe()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what} (last seen: {last!r})")
        time.sleep(interval)
