"""At most N agent Jobs created in any 60-second window (the seed's default is 100 per minute)."""

from __future__ import annotations

from collections import deque


class SlidingWindowLimiter:
    """Pure bookkeeping; the caller supplies the clock, so tests need no sleeping."""

    def __init__(self, per_minute: int, window_seconds: float = 60.0) -> None:
        if per_minute < 1:
            raise ValueError(f"maxJobsPerMinute must be >= 1, got {per_minute}")
        self.per_minute = per_minute
        self.window_seconds = window_seconds
        self._recent: deque[float] = deque()

    def delay(self, now: float) -> float:
        """Seconds to wait before the next creation is allowed (0 when allowed now)."""
        while self._recent and self._recent[0] <= now - self.window_seconds:
            self._recent.popleft()
        if len(self._recent) < self.per_minute:
            return 0.0
        return self._recent[0] + self.window_seconds - now

    def record(self, now: float) -> None:
        self._recent.append(now)
