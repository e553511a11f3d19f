"""Which status changes are written at once and which wait (status_writes.write_due, pure)."""

from __future__ import annotations

from typing import Any

from asyncrl.operator.reconciliation.status_writes import COUNTS_MIN_INTERVAL_SECONDS, write_due

RUNNING: dict[str, Any] = {
    "phase": "Running",
    "progress": "3/16",
    "rollouts": {"running": 4, "succeeded": 10},
    "jobs": {"active": 4, "created": 14},
}


def _with(**changes: Any) -> dict[str, Any]:
    return {**RUNNING, **changes}


def test_the_first_status_is_written_and_an_equal_one_never_is() -> None:
    assert write_due(None, RUNNING, seconds_since_write=0.0)
    assert not write_due(RUNNING, dict(RUNNING), seconds_since_write=3600.0)


def test_counts_alone_wait_for_the_interval_since_the_last_write() -> None:
    counts = _with(rollouts={"running": 3, "succeeded": 11}, jobs={"active": 3, "created": 14})
    assert not write_due(RUNNING, counts, seconds_since_write=0.0)
    assert not write_due(RUNNING, counts, seconds_since_write=COUNTS_MIN_INTERVAL_SECONDS - 0.1)
    assert write_due(RUNNING, counts, seconds_since_write=COUNTS_MIN_INTERVAL_SECONDS)


def test_anything_a_user_sees_is_written_at_once_counts_with_it() -> None:
    for change in (
        {"progress": "4/16"},
        {"phase": "Suspended"},
        {"message": "the gateway does not answer"},
        {"conditions": [{"type": "Ready", "status": "False"}]},
        {"activeGroups": 3},
        {"reward": {"last": 0.5, "best": 0.5}},
    ):
        changed = _with(jobs={"active": 1, "created": 15}, **change)
        assert write_due(RUNNING, changed, seconds_since_write=0.0), change


def test_a_field_that_appears_or_goes_is_a_change_too() -> None:
    assert write_due(RUNNING, _with(rayCluster="ready (1/1 workers ready)"), seconds_since_write=0.0)
    without = {key: value for key, value in RUNNING.items() if key != "progress"}
    assert write_due(RUNNING, without, seconds_since_write=0.0)


def test_an_ended_run_writes_its_last_counts_at_once() -> None:
    ended = _with(phase="Succeeded")
    final_counts = {
        **ended,
        "rollouts": {"running": 0, "succeeded": 14},
        "jobs": {"active": 0, "created": 14},
    }
    assert write_due(ended, final_counts, seconds_since_write=0.0)
