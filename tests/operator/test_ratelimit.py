"""`agents.maxJobsPerMinute` is a sliding window: at most N Job creations in any 60-second window, with the
first N at once. A leaky bucket (aiolimiter) lets 2N - 1 through in the first minute; see ratelimit.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from asyncrl.operator.ratelimit import SlidingWindowLimiter


def _creations(limiter: SlidingWindowLimiter, attempts: list[float]) -> list[float]:
    """When a caller that creates whenever the limiter allows it created, trying at each of `attempts` (as
    many as it may then)."""
    created = []
    for now in sorted(attempts):
        while limiter.delay(now) == 0.0:
            limiter.record(now)
            created.append(now)
    return created


@given(
    per_minute=st.integers(min_value=1, max_value=20),
    attempts=st.lists(st.floats(min_value=0.0, max_value=300.0), max_size=200),
)
def test_no_60_second_window_holds_more_than_n_creations(per_minute: int, attempts: list[float]) -> None:
    created = _creations(SlidingWindowLimiter(per_minute), attempts)
    for index, start in enumerate(created):
        in_window = [t for t in created[index:] if t < start + 60.0]
        assert len(in_window) <= per_minute


def test_the_first_minute_holds_exactly_n_the_first_n_at_once() -> None:
    """Trying every 10 ms for 3 minutes: N at t=0, then one each time the oldest leaves the window. A leaky
    bucket of the same rate (aiolimiter's AsyncLimiter(4, 60)) let 7 through in the first minute."""
    created = _creations(SlidingWindowLimiter(4), [tick / 100 for tick in range(18_000)])
    assert created[:4] == [0.0] * 4
    assert sum(1 for t in created if t < 60.0) == 4
    assert len(created) == 12  # N per minute in the long run, as a leaky bucket's
