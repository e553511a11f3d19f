"""The many-runs benchmark (benchmarks/many_runs.py): its bookkeeping on made-up observations. The script
itself needs a control plane and minutes per size; its figures are in docs/benchmarks.md."""

from __future__ import annotations

import argparse
from types import ModuleType

import pytest

from tests.support.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def many_runs() -> ModuleType:
    return load_benchmark("many_runs")


def _run(name: str, step: int | None, phase: str = "Running") -> dict[str, object]:
    status: dict[str, object] = {"phase": phase}
    if step is not None:
        status["step"] = step
    return {"metadata": {"name": name}, "status": status}


def test_a_step_the_status_jumped_over_counts_as_shown_when_a_later_one_was(many_runs: ModuleType) -> None:
    watch = many_runs.StepWatch(api=None)
    watch._note("ADDED", _run("a", None), 1.0)
    watch._note("MODIFIED", _run("a", 1), 2.0)
    watch._note("MODIFIED", _run("a", 3), 5.0)  # steps 2 and 3 in one status write
    watch._note("MODIFIED", _run("a", 3), 9.0)  # seen again: the first time stands
    assert [watch.first_seen("a", step) for step in (1, 2, 3, 4)] == [2.0, 5.0, 5.0, None]
    assert watch.phase_counts() == {"Running": 1}
    watch._note("DELETED", _run("a", 3), 10.0)
    assert watch.phase_counts() == {}


def test_lag_quantiles_are_nearest_rank(many_runs: ModuleType) -> None:
    result = many_runs.SizeResult(runs=1, lags=[float(value) for value in range(1, 101)])
    assert result.lag(0.5) == 50.0
    assert result.lag(0.99) == 99.0
    assert result.lag(1.0) == 100.0


def test_the_report_holds_the_targets_to_the_largest_size(
    many_runs: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    def size(runs: int, *, lag: float, mib: int, cpu_per_run: float) -> object:
        return many_runs.SizeResult(
            runs=runs,
            window_seconds=60.0,
            lags=[lag] * 10,
            steps_posted=10,
            operator_cpu=cpu_per_run * runs,
            operator_peak_bytes=mib << 20,
            requests={("get", "secrets"): 2.0 * runs},
            operator_requests={("get", "secrets"): 2.0 * runs},
        )

    assert many_runs.report(
        [size(10, lag=0.1, mib=200, cpu_per_run=0.1), size(100, lag=1.0, mib=400, cpu_per_run=0.1)]
    )
    assert not many_runs.report(
        [size(10, lag=0.1, mib=200, cpu_per_run=0.1), size(100, lag=6.0, mib=400, cpu_per_run=0.1)]
    )
    assert not many_runs.report(
        [size(10, lag=0.1, mib=200, cpu_per_run=0.1), size(100, lag=1.0, mib=2000, cpu_per_run=0.1)]
    )
    # Faster than linear growth: CPU per run-minute twice that at 10 runs.
    assert not many_runs.report(
        [size(10, lag=0.1, mib=200, cpu_per_run=0.1), size(100, lag=1.0, mib=400, cpu_per_run=0.2)]
    )
    assert "NOT MET" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["", "0,10", "ten", "1,,x"])
def test_sizes_must_be_counts(many_runs: ModuleType, text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="--runs"):
        many_runs.parse_sizes(text)


def test_an_operator_without_the_request_counter_is_reported_not_crashed_on(
    many_runs: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """An older operator (the side-by-side run against a previous commit) exports no request counter."""
    result = many_runs.SizeResult(runs=20, window_seconds=60.0, lags=[0.1], steps_posted=1, operator_cpu=1.0)
    result.requests = {("get", "services"): 120.0}
    many_runs.report([result])
    assert "(none counted" in capsys.readouterr().out


def test_failover_lags_count_only_the_steps_posted_after_the_new_leaders_first_write(
    many_runs: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    watch = many_runs.StepWatch(api=None)
    watch._note("ADDED", _run("a", 0), 1.0)
    killed_at = 2.0
    watch._note("MODIFIED", _run("a", 0, phase="Running"), 2.5)  # unchanged: no write seen
    watch._note("MODIFIED", _run("a", 1), 12.0)  # the new leader's first write: step 1 posted during it
    watch._note("MODIFIED", _run("a", 2), 16.0)
    firsts = watch.first_changes_after(killed_at + many_runs.IN_FLIGHT_SECONDS)
    assert firsts == {"a": 12.0}
    handle = many_runs.RunHandle("a", posted={1: 3.0, 2: 15.0, 3: 20.0})
    result = many_runs.FailoverResult(runs=1, failover_seconds=firsts["a"] - killed_at)
    result.after = many_runs.SizeResult(runs=1)
    many_runs._split_lags([handle], watch, firsts["a"], result)
    assert result.during == [9.0]
    assert (result.after.lags, result.after.steps_posted, result.after.unseen_steps) == ([1.0], 2, 1)
    assert not many_runs.report_failover([result])  # step 3 never shown
    assert "failover under 15 s" in capsys.readouterr().out
