"""The soak (benchmarks/soak.py): its checks on made-up observations, then a short soak of the real loop.

The short soak runs `asyncrl local run` (gateway, trainer, agents: real processes) for about 2.5 minutes with
a real Toxiproxy (scripts/provision-toxiproxy.sh) between each pair of components, injecting resets,
latency, slow closes and timeouts. It asserts the correctness targets only (nothing lost or doubled, never
paused without an update) and that traffic really went through every proxy; the timing figures are printed.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def soak() -> ModuleType:
    return load_benchmark("soak")


def test_the_fault_schedule_is_seeded_and_switches_one_fault_at_a_time_per_proxy(soak: ModuleType) -> None:
    faults = soak.fault_schedule(7, duration=3600, mean_gap=5)
    assert faults == soak.fault_schedule(7, duration=3600, mean_gap=5)
    assert faults != soak.fault_schedule(8, duration=3600, mean_gap=5)
    assert {fault.kind for fault in faults} == set(soak.FAULT_KINDS)
    assert {fault.proxy for fault in faults} == set(soak.PROXIES)
    for proxy in soak.PROXIES:
        mine = [fault for fault in faults if fault.proxy == proxy]
        assert all(a.at + a.seconds <= b.at for a, b in itertools.pairwise(mine))


def test_a_pause_with_no_update_in_it_is_counted(soak: ModuleType) -> None:
    update = soak.StepRecord(step=0, seen_at=11.0, step_seconds=5.0, update_seconds=1.0)
    samples = [(9.9, False), (10.0, True), (11.0, True), (11.2, False), (20.0, True), (40.0, False)]
    pauses, still_open = soak.paused_intervals(samples)
    assert pauses == [soak.Interval(10.0, 11.2), soak.Interval(20.0, 40.0)]
    assert still_open is None
    total, longest, without = soak.paused_without_update(pauses, [update])
    assert without == 1  # the second pause: 20 s with no update
    assert longest == pytest.approx(20.0)
    assert total == pytest.approx(20.2)  # and 0.2 s after the first update (the resume)


def test_rollouts_never_run_or_run_late_are_lost(soak: ModuleType) -> None:
    seen = soak.RolloutSeen
    rollouts = [
        seen("ran", created_at=0.0, state="succeeded", started_at=1.0, last_seen=5.0),
        seen("never-ran", created_at=0.0, state="timed_out", started_at=None, last_seen=70.0),
        seen("cancelled", created_at=0.0, state="cancelled", started_at=None, last_seen=5.0),
        seen("waiting", created_at=95.0, state="queued", started_at=None, last_seen=100.0),
        seen("stuck", created_at=10.0, state="queued", started_at=None, last_seen=100.0),
        seen("late", created_at=0.0, state="succeeded", started_at=61.0, last_seen=70.0),
    ]
    lost, late = soak.lost_rollouts(rollouts, ["ran", "late"], timeout=60.0, end=100.0)
    assert lost == ["never-ran", "stuck"]
    assert late == ["late"]
    assert soak.outcomes_lost(rollouts, {"ran", "never-ran", "late", "stuck"}) == ["never-ran", "stuck"]


def test_a_rollout_last_seen_queued_whose_group_was_trained_kept_its_outcome(soak: ModuleType) -> None:
    """The detector polls: a rollout seen queued, then run and trained between two polls, is not lost. One
    whose group was never trained still is, and so is one recorded failed whatever its group."""
    seen = soak.RolloutSeen
    rollouts = [
        seen("s3-abc-r0", created_at=0.0, state="queued", started_at=None, last_seen=5.0),
        seen("s3-abc-r1", created_at=0.0, state="failed", started_at=1.0, last_seen=5.0),
        seen("s4-def-r0", created_at=0.0, state="queued", started_at=None, last_seen=5.0),
    ]
    succeeded = {"s3-abc-r0", "s3-abc-r1", "s4-def-r0"}
    assert soak.group_of("s3-abc-r1") == "s3-abc"
    assert soak.outcomes_lost(rollouts, succeeded, ["s3-abc"]) == ["s3-abc-r1", "s4-def-r0"]
    assert soak.outcomes_lost(rollouts, succeeded) == sorted(succeeded)


def test_doubles_are_counted_from_the_logs(soak: ModuleType) -> None:
    trainer_log = (
        "2026-01-01 INFO asyncrl.trainer.loop step 0: trained groups g1 g2\n"
        "2026-01-01 INFO asyncrl.trainer.loop step 0: reward 0.1\n"
        "2026-01-01 INFO asyncrl.trainer.loop step 1: trained groups g3 g2\n"
    )
    assert soak.trained_groups(trainer_log) == {"g1": 1, "g2": 2, "g3": 1}
    agents = "r1 1.0 start\nr2 2.0 start\nr1 3.0 start\nr1 4.0 exit 0\nr2 5.0 exit 1\n"
    assert soak.executions(agents) == {"r1": 2, "r2": 1}
    assert soak.succeeded_agents(agents) == {"r1"}


@pytest.mark.slow
def test_a_short_soak_loses_and_doubles_nothing(
    soak: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = soak.main(
        ["--duration=150", "--mean-fault-gap=5", "--seed=1", "--rollout-timeout=20", f"--work-dir={tmp_path}"]
    )
    output = capsys.readouterr().out
    print(output)  # the figures, timing included, for the CI log
    assert "target no rollout lost or started late: MET" in output
    assert "target no rollout executed twice: MET" in output
    assert "target no group trained twice: MET" in output
    assert "target never paused without an update: MET" in output
    # Lost outcomes are printed, not asserted: local mode resends a lost report (tests/gateway/
    # test_lost_reports.py asserts that), but a report held up by a fault past the rollout's 20 s timeout is
    # recorded timed_out, and an agent that runs to its timeout is counted too (2 in one CI run; 32 before).
    assert "the run ended on its own" not in output
    steps = re.search(r"^steps: (\d+);", output, re.MULTILINE)
    assert steps is not None
    assert int(steps.group(1)) >= 3, output  # the loop really ran through the faults
    carried = re.search(r"^bytes through each proxy: (.*)$", output, re.MULTILINE)
    assert carried is not None
    for proxy, count in (part.split() for part in carried.group(1).split(", ")):
        assert int(count) > 0, f"nothing went through {proxy}: {output}"
    applied = re.search(r"^faults applied: (\d+)", output, re.MULTILINE)
    assert applied is not None
    assert int(applied.group(1)) >= 10
    del code  # the timing target may be missed on a loaded machine; it is printed, not asserted
