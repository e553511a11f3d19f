"""The Job counters' offset for earlier gateway instances: counts never go down across operator restarts,
TTL deletion and gateway restarts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from asyncrl.gateway_api.models import LaunchTotals
from asyncrl.operator.run_link.job_counters import JobCounterOffset, JobCountsSeen


def _totals(launched: int, failed: int = 0) -> LaunchTotals:
    return LaunchTotals(launched=launched, failed=failed)


def test_an_operator_restart_with_the_same_gateway_counts_every_launch_even_ones_the_status_missed() -> None:
    offset = JobCounterOffset().for_instance("g1", _totals(0), shown=JobCountsSeen(0, 0))
    stored = JobCounterOffset.from_annotation(offset.to_annotation())
    # The status said 9 (written a second before the kill); the gateway recorded 12 launches.
    restarted = stored.for_instance("g1", _totals(12, 2), shown=JobCountsSeen(9, 1))
    assert restarted.counts(_totals(12, 2), at_least=JobCountsSeen(9, 1)) == JobCountsSeen(12, 2)


def test_a_gateway_restart_keeps_what_earlier_instances_counted() -> None:
    offset = JobCounterOffset().for_instance("g1", _totals(0), shown=JobCountsSeen(0, 0))
    shown = offset.counts(_totals(8, 3), at_least=JobCountsSeen(0, 0))
    after = offset.for_instance("g2", _totals(0), shown=shown)
    assert after.counts(_totals(0), at_least=shown) == JobCountsSeen(8, 3)
    assert after.counts(_totals(4, 1), at_least=shown) == JobCountsSeen(12, 4)


def test_a_run_from_an_older_operator_starts_from_its_stored_status() -> None:
    offset = JobCounterOffset.from_annotation(None).for_instance("g1", _totals(0), shown=JobCountsSeen(5, 2))
    assert offset.counts(_totals(1), at_least=JobCountsSeen(5, 2)) == JobCountsSeen(6, 2)


def test_an_unreadable_annotation_is_a_zero_offset() -> None:
    for text in ("", "{", "[]", '{"createdBefore": "x"}', "null"):
        assert JobCounterOffset.from_annotation(text) == JobCounterOffset()


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=30))
def test_counts_never_go_down(events: list[tuple[bool, int, int]]) -> None:
    """Any sequence of launches, failures and gateway restarts: created and failed only grow."""
    offset, instance, totals = JobCounterOffset(), 0, _totals(0)
    shown = JobCountsSeen(0, 0)
    offset = offset.for_instance(str(instance), totals, shown=shown)
    for restart, launches, failures in events:
        if restart:
            instance += 1
            totals = _totals(0)
            offset = offset.for_instance(str(instance), totals, shown=shown)
        launched = totals.launched + launches
        totals = _totals(launched, min(launched, totals.failed + failures))
        counts = offset.counts(totals, at_least=shown)
        assert counts.created >= shown.created
        assert counts.failed >= shown.failed
        shown = counts
