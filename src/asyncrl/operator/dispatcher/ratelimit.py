"""At most N agent Jobs created in any 60-second window (the default is 100 per minute).

`agents.maxJobsPerMinute` protects the API server, and the docs promise "Job creations in any 60-second
window" (docs/tuning-the-window.md): a run starts with up to N creations at once, then one more each time the
oldest leaves the window. We keep this sliding window rather than aiolimiter (issue 26 §5), whose
`AsyncLimiter(N, 60)` is a leaky bucket: a burst of N, then a drain of N per minute, so N - 1 more fit in the
same first minute. Measured with both limiters on a fake clock and a caller that creates whenever allowed
(2026-12-04, aiolimiter 1.3.0): N = 4 gives 7 creations in the first minute (ours 4), N = 100 gives 199
(ours 100); the long-run rate is N per minute for both. `AsyncLimiter(1, 60 / N)` keeps within N + 1 per
minute but loses the start-up burst (32 Jobs would take 19 s at the default instead of none). Two more
differences: aiolimiter takes capacity before the call, where we count only Jobs the API server created
(`record` after the create), and it fixes its drain rate at construction, where a spec edit of
`maxJobsPerMinute` applies here at once with the window's history kept.
"""

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
        # One expression decides both "has left the window" and the wait, so a creation still in the window
        # always gives a positive wait. With `recent[0] <= now - window` here, float rounding kept
        # 70.02382045824767 in the window at now = 130.02382045824766 yet reported a wait of 0.0: a caller
        # that creates when the wait is 0 went over the limit (and a test's loop never ended).
        while self._recent and self._recent[0] + self.window_seconds <= now:
            self._recent.popleft()
        if len(self._recent) < self.per_minute:
            return 0.0
        return self._recent[0] + self.window_seconds - now

    def record(self, now: float) -> None:
        self._recent.append(now)
