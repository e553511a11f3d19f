"""The Job counters' ledger: counts never go down across operator restarts, TTL deletion, gateway restarts."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from asyncrl.gateway.models import LaunchTotals
from asyncrl.operator.ledger import JobCountsSeen, JobLedger


def _totals(launched: int, failed: int = 0) -> LaunchTotals:
    return LaunchTotals(launched=launched, failed=failed)


def test_an_operator_restart_with_the_same_gateway_counts_every_launch_even_ones_the_status_missed() -> None:
    ledger = JobLedger().for_instance("g1", _totals(0), shown=JobCountsSeen(0, 0))
    stored = JobLedger.from_annotation(ledger.to_annotation())
    # The status said 9 (written a second before the kill); the gateway recorded 12 launches.
    restarted = stored.for_instance("g1", _totals(12, 2), shown=JobCountsSeen(9, 1))
    assert restarted.counts(_totals(12, 2), at_least=JobCountsSeen(9, 1)) == JobCountsSeen(12, 2)


def test_a_gateway_restart_keeps_what_earlier_instances_counted() -> None:
    ledger = JobLedger().for_instance("g1", _totals(0), shown=JobCountsSeen(0, 0))
    shown = ledger.counts(_totals(8, 3), at_least=JobCountsSeen(0, 0))
    after = ledger.for_instance("g2", _totals(0), shown=shown)
    assert after.counts(_totals(0), at_least=shown) == JobCountsSeen(8, 3)
    assert after.counts(_totals(4, 1), at_least=shown) == JobCountsSeen(12, 4)


def test_a_run_from_an_older_operator_starts_from_its_stored_status() -> None:
    ledger = JobLedger.from_annotation(None).for_instance("g1", _totals(0), shown=JobCountsSeen(5, 2))
    assert ledger.counts(_totals(1), at_least=JobCountsSeen(5, 2)) == JobCountsSeen(6, 2)


def test_an_unreadable_annotation_is_an_empty_ledger() -> None:
    for text in ("", "{", "[]", '{"createdBefore": "x"}', "null"):
        assert JobLedger.from_annotation(text) == JobLedger()


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(0, 5)), min_size=1, max_size=30))
def test_counts_never_go_down(events: list[tuple[bool, int, int]]) -> None:
    """Any sequence of launches, failures and gateway restarts: created and failed only grow."""
    ledger, instance, totals = JobLedger(), 0, _totals(0)
    shown = JobCountsSeen(0, 0)
    ledger = ledger.for_instance(str(instance), totals, shown=shown)
    for restart, launches, failures in events:
        if restart:
            instance += 1
            totals = _totals(0)
            ledger = ledger.for_instance(str(instance), totals, shown=shown)
        launched = totals.launched + launches
        totals = _totals(launched, min(launched, totals.failed + failures))
        counts = ledger.counts(totals, at_least=shown)
        assert counts.created >= shown.created
        assert counts.failed >= shown.failed
        shown = counts
