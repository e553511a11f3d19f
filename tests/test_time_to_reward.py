"""The time-to-reward runner (benchmarks/time_to_reward.py) end to end, in its --quick mode.

`--quick` runs `asyncrl local run` (gateway, trainer with the Reference backend, the seeded toy agent: real
processes) twice, sync and async, 3 steps each, on the quickstart task. The test checks what the records
say, not how fast: every run finished its steps, its thresholds are those its own reward curve crosses,
its figures are present, and a second invocation finds both runs done and runs nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from asyncrl.testing.waiting import wait_for
from tests.support.benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runner() -> ModuleType:
    return load_benchmark("time_to_reward")


def test_runs_go_seed_by_seed_through_every_regime_and_configuration(runner: ModuleType) -> None:
    order = runner.plans(seeds=[0, 1], regimes=["quickstart", "latency"], configs=["sync", "async"], steps=4)
    assert [(p.seed, p.regime, p.config) for p in order[:4]] == [
        (0, "quickstart", "sync"),
        (0, "quickstart", "async"),
        (0, "latency", "sync"),
        (0, "latency", "async"),
    ]
    assert {p.seed for p in order[4:]} == {1}


def test_each_configuration_changes_only_its_own_settings(runner: ModuleType) -> None:
    sync = runner.manifest_for(runner.Plan("latency", "sync", 7, 5), latency_tool_seconds=3.0)["spec"]
    assert sync["async"] == {"enabled": False}
    assert sync["data"]["seed"] == 7
    assert sync["totalSteps"] == 5
    assert {row["tool_seconds"] for row in sync["data"]["inline"]} == {3.0}
    assert "time_to_reward_agent.py" in sync["agents"]["template"]["inline"]
    refill_off = runner.manifest_for(
        runner.Plan("quickstart", "async-refill-off", 0, 5), latency_tool_seconds=3.0
    )
    assert refill_off["spec"]["async"] == {"enabled": True, "windowSize": 8, "refillDuringCollection": False}
    assert all("tool_seconds" not in row for row in refill_off["spec"]["data"]["inline"])


def test_the_time_left_counts_each_run_at_its_own_configurations_pace(runner: ModuleType) -> None:
    left = runner.plans(
        seeds=[1], regimes=["latency"], configs=["sync", "async", "async-refill-off"], steps=4
    )
    assert runner.seconds_left(left, {}) is None
    durations = {("latency", "sync"): [300.0], ("latency", "async"): [100.0, 80.0]}
    # sync 300 + async 90 + refill-off (not run yet) at the mean of all runs so far, 160
    assert runner.seconds_left(left, durations) == 300.0 + 90.0 + 160.0


def _threshold_from_curve(curve: list[dict[str, float]], threshold: float) -> float | None:
    for point in curve:
        if point["reward"] >= threshold:
            return point["wall_seconds"]
    return None


@pytest.mark.slow
def test_quick_mode_records_runs_whose_thresholds_match_their_curves(
    runner: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records_path = tmp_path / "records.jsonl"
    # Low thresholds as well, so that the 3-step runs reach some: each must be where the curve crosses it.
    thresholds = [0.0, 0.02, 0.05, 0.3]
    assert runner.main(["--quick", f"--records={records_path}", "--thresholds", *map(str, thresholds)]) == 0
    output = capsys.readouterr().out
    with capsys.disabled():
        print(output)  # the figures, for the CI log (not captured again for the second invocation)
    records = [json.loads(line) for line in records_path.read_text().splitlines()]
    assert [(r["config"], r["seed"], r["regime"]) for r in records] == [
        ("sync", 0, "quickstart"),
        ("async", 0, "quickstart"),
    ]
    for record in records:
        assert record["complete"], record
        curve = record["curve"]
        assert [point["step"] for point in curve] == [0, 1, 2]
        walls = [point["wall_seconds"] for point in curve]
        assert walls == sorted(walls)
        assert walls[0] > 0
        assert set(record["seconds_to_reward"]) == {str(t) for t in thresholds}
        for threshold in thresholds:
            assert record["seconds_to_reward"][str(threshold)] == _threshold_from_curve(curve, threshold)
        assert record["seconds_to_reward"]["0.0"] == walls[0]  # every reward is >= 0: reached at step 0
        assert record["cpu_seconds"] > 0
        assert record["cores_busy"] > 0
        assert record["consumed_age_mean"] is not None
        assert record["step_seconds_median"] > 0
        # Every policy version read from its own rollouts: at least version 0 in 3 steps, each with enough
        # rollouts, published in order, each where the update before it ended.
        policies = record["policy_curve"]
        assert policies, record
        assert (policies[0]["version"], policies[0]["published_seconds"]) == (0, 0.0)
        assert all(p["rollouts"] >= runner.MIN_POLICY_ROLLOUTS for p in policies)
        assert [p["published_seconds"] for p in policies] == sorted(p["published_seconds"] for p in policies)
        for policy in policies[1:]:
            assert policy["published_seconds"] == curve[policy["version"] - 1]["wall_seconds"]
        assert record["rewarded_rollouts_seen"] >= sum(p["rollouts"] for p in policies)
        assert record["completion_feed_gaps"] == 0
    sync, async_ = records
    # Sync's version s drew step s's batch, 4 groups x 4 rollouts: at most 16 read, all but a few that a
    # loaded machine may fail or time out (they end without a reward).
    assert all(12 <= p["rollouts"] <= 16 for p in sync["policy_curve"]), sync["policy_curve"]
    assert sync["window_size"] == 4
    assert async_["window_size"] == 8
    assert sync["consumed_age_max"] == 0  # sync trains only what the step drew
    assert "regime quickstart" in output
    assert "async" in output
    assert "by policy version" in output

    # A second invocation finds both runs in the records and runs nothing.
    assert runner.main(["--quick", f"--records={records_path}"]) == 0
    again = capsys.readouterr().out
    assert "2 runs (2 already in" in again
    assert "[1/" not in again, again
    assert len(records_path.read_text().splitlines()) == 2


@pytest.mark.slow
def test_a_terminated_benchmark_stops_the_run_it_started(tmp_path: Path) -> None:
    """Before, SIGTERM ended the benchmark at once and its `asyncrl local run` (a session of its own) went on
    with its gateway, trainer and agents, loading the machine under the next measurement."""
    records = tmp_path / "records.jsonl"
    work = tmp_path / "ttr-quickstart-sync-s0"  # the plan's own directory, beside the records
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    argv = [
        sys.executable, str(ROOT / "benchmarks" / "time_to_reward.py"), f"--records={records}",
        "--regimes", "quickstart", "--configs", "sync", "--seeds", "0", "--steps", "500",
    ]  # fmt: skip
    benchmark = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # The run has started once its local run wrote its metrics file (gateway, trainer and agents are up).
        wait_for(lambda: (work / "metrics.jsonl").exists(), timeout=300, what="the run's first step")
        assert _processes_of(work), "the run's processes should be running now"
        benchmark.send_signal(signal.SIGTERM)
        benchmark.wait(timeout=120)
        # 500 steps take many minutes: a run still there after this was left behind, not finishing.
        wait_for(lambda: not _processes_of(work), timeout=60, what="the run's processes to end")
    finally:
        benchmark.kill()
        benchmark.wait()
        for pid in _processes_of(work):  # whatever a failure left behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _processes_of(work: Path) -> list[int]:
    """Processes whose command line names the run's work directory (the local run, gateway and trainer)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if str(work).encode() in cmdline:
            found.append(int(entry.name))
    return found
