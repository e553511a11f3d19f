"""`agents.maxJobsPerMinute` is a sliding window: at most N Job creations in any 60-second window, with the
first N at once. A leaky bucket (aiolimiter) lets 2N - 1 through in the first minute; see ratelimit.py."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from asyncrl.operator.dispatcher.ratelimit import SlidingWindowLimiter


def _creations(limiter: SlidingWindowLimiter, attempts: list[float]) -> list[float]:
    """When a caller that creates whenever the limiter allows it created, trying at each of `attempts` (as
    many as it may then)."""
    created: list[float] = []
    for now in sorted(attempts):
        # Bounded, so a limiter that always says "now" fails the test instead of hanging it.
        for _ in range(limiter.per_minute + 1):
            if limiter.delay(now) != 0.0:
                break
            limiter.record(now)
            created.append(now)
        else:
            raise AssertionError(f"the limiter allowed more than {limiter.per_minute} creations at t={now!r}")
    return created


@given(
    per_minute=st.integers(min_value=1, max_value=20),
    attempts=st.lists(st.floats(min_value=0.0, max_value=300.0), max_size=200),
)
@example(per_minute=1, attempts=[70.02382045824767, 130.02382045824766])  # a rounding edge: see ratelimit.py
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


def test_a_creation_still_in_the_window_always_gives_a_positive_wait() -> None:
    """70.02382045824767 + 60 rounds to 130.02382045824766, but 130.02382045824766 - 60 is below
    70.02382045824767: the window's edge must be decided by one expression, or the wait comes out 0.0 while
    the creation is still counted (CI was killed looping on this)."""
    limiter = SlidingWindowLimiter(1)
    limiter.record(70.02382045824767)
    wait = limiter.delay(130.02382045824766)
    assert wait == 0.0
    limiter.record(130.02382045824766)
    assert limiter.delay(130.02382045824766) > 0.0
