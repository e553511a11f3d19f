"""No write after the Lease is released: a fence in the API client's REST layer.

A graceful stop cancels every run's task, but a call already in a worker thread (`asyncio.to_thread`) cannot
be cancelled: it may reach the API server after the leader has released its Lease and a standby has taken
over, which is two writers again. The fence counts the writes in flight (every request but GET) on the
operator's client; `close()` refuses new ones and waits, bounded, for those in flight to end. The cleanup
closes it and only then releases the Lease.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

READS = frozenset({"GET", "HEAD", "OPTIONS"})


class FenceClosed(RuntimeError):
    """A write attempted after the operator began to stop (it holds no Lease, or is about to release it)."""


class WriteFence:
    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._in_flight = 0
        self._closed = False

    @classmethod
    def install(cls, api_client: Any) -> WriteFence:
        """Wrap `api_client`'s REST layer (every API class made from it, every thread) with a new fence."""
        fence = cls()
        rest = api_client.rest_client
        request = rest.request

        def fenced(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            if method.upper() in READS:
                return request(method, url, *args, **kwargs)
            fence._enter(method, url)
            try:
                return request(method, url, *args, **kwargs)
            finally:
                fence._leave()

        rest.request = fenced
        return fence

    @property
    def in_flight(self) -> int:
        with self._condition:
            return self._in_flight

    def close(self, timeout: float) -> int:
        """Refuse new writes; wait up to `timeout` s for those in flight. Returns how many still were."""
        deadline = time.monotonic() + timeout
        with self._condition:
            self._closed = True
            while self._in_flight and (left := deadline - time.monotonic()) > 0:
                self._condition.wait(left)
            still = self._in_flight
        if still:
            logger.warning("%d API write(s) in flight after %.0f s; the Lease goes anyway", still, timeout)
        return still

    def _enter(self, method: str, url: str) -> None:
        with self._condition:
            if self._closed:
                raise FenceClosed(f"{method} {url}: refused, operator stopping (no write after its Lease)")
            self._in_flight += 1

    def _leave(self) -> None:
        with self._condition:
            self._in_flight -= 1
            self._condition.notify_all()
