"""Local mode's status line and end-of-run summary: pure bookkeeping over what the gateway reports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.gateway_api.models import GatewayStats, WindowSummary
from asyncrl.local.report import COLUMNS, AgentCounts, RunTally, header


def _summary(step: int, reward: float) -> WindowSummary:
    return WindowSummary(step=step, reward_mean=reward, active_groups=3)


def _stats(answer: dict[str, Any]) -> GatewayStats:
    """The gateway's /api/stats with `answer`'s instance and totals (the rest as an idle gateway has it)."""
    idle = {"paused": False, "retry_after_seconds": 5, "reason": None, "inflight": 0, "model_version": None}
    counts = {"rollouts": {}, "launches": {"launched": 0, "failed": 0}, "cursor": 0}
    return GatewayStats.model_validate({**idle, **counts, **answer})


def test_rollout_totals_survive_a_gateway_restart_that_starts_its_counts_from_zero() -> None:
    tally = RunTally()
    tally.record_stats(_stats({"instance_id": "a", "finished_totals": {"succeeded": 10, "failed": 2}}))
    tally.record_stats(_stats({"instance_id": "a", "finished_totals": {"succeeded": 12, "failed": 3}}))
    tally.record_stats(
        _stats({"instance_id": "b", "finished_totals": {"succeeded": 1, "failed": 1, "timed_out": 2}})
    )
    assert tally.failed == 4  # 3 before the restart, 1 after; the first report of "a" is not counted twice
    lines = tally.summary(outcome="finished", work_dir=Path("/w"), metrics_file=None)
    assert "  rollouts: 19 ended: 13 succeeded, 4 failed, 2 timed out, 0 cancelled" in lines


def test_the_status_line_has_a_failed_column_under_its_header() -> None:
    tally = RunTally()
    tally.record_stats(_stats({"instance_id": "a", "finished_totals": {"failed": 7}}))
    line = tally.status_line(_summary(4, 0.5), running_agents=2)
    cells = line.split()
    assert len(cells) == len(COLUMNS) == len(header().split())
    assert cells[COLUMNS.index("FAILED")] == "7"
    assert cells[COLUMNS.index("REWARD")] == "0.500"
    assert cells[COLUMNS.index("RUNNING")] == "2"


def test_the_summary_gives_steps_reward_first_to_last_and_where_the_logs_are() -> None:
    tally = RunTally()
    for step, reward in ((3, 0.25), (4, 0.5), (6, 0.75)):  # resumed at 3; step 5's line was not seen
        tally.record_step(_summary(step, reward))
    lines = tally.summary(outcome="finished", work_dir=Path("/w"), metrics_file=Path("/m.jsonl"))
    assert lines == [
        "run finished",
        "  steps:    4 (step 3 to 6)",
        "  rollouts: 0 ended: 0 succeeded, 0 failed, 0 timed out, 0 cancelled",
        "  reward:   0.250 (step 3) -> 0.750 (step 6)",
        "  logs:     /w/ (trainer.log, gateway.log, agents/)",
        "  metrics:  /m.jsonl",
    ]


def test_a_run_that_trained_nothing_says_so_and_gives_no_reward() -> None:
    lines = RunTally().summary(outcome="failed: x (exit code 78)", work_dir=Path("/w"), metrics_file=None)
    assert lines[:2] == ["run failed: x (exit code 78)", "  steps:    none trained"]
    assert not any("reward" in line for line in lines)


def test_every_launched_agent_is_in_exactly_one_place_of_the_summary() -> None:
    """Issue 37 item 4: 336 agents were launched and the summary said "308 ended"; 21 of the missing 28 were
    stopped when the gateway restarted. Now the parts add up to the agents launched, each part named."""
    tally = RunTally()
    tally.record_stats(_stats({"instance_id": "a", "finished_totals": {"succeeded": 150, "failed": 4}}))
    tally.record_stats(_stats({"instance_id": "b", "finished_totals": {"succeeded": 150, "cancelled": 4}}))
    counts = AgentCounts(launched=336, lost_with_gateway=21, stopped_at_end=3)
    line = tally.rollouts_line(counts)
    assert line == (
        "  rollouts: 336 launched: 300 succeeded, 4 failed, 0 timed out, 4 cancelled; "
        "21 stopped when the gateway restarted and lost them; 3 stopped when the run ended; "
        "4 ended in a gateway killed before it reported them (1 restart)"
    )
    numbers = [int(word) for word in line.replace(";", ",").replace(":", ",").split() if word.isdigit()]
    assert numbers[0] == sum(numbers[1:])  # launched == every part ("(1 restart)" is not a part)


def test_without_a_restart_a_gap_is_not_blamed_on_one_and_asks_to_be_reported() -> None:
    tally = RunTally()
    tally.record_stats(_stats({"instance_id": "a", "finished_totals": {"succeeded": 10}}))
    line = tally.rollouts_line(AgentCounts(launched=12, lost_with_gateway=0, stopped_at_end=1))
    assert line.endswith("; 1 stopped when the run ended; 1 not accounted for (please report this)")
    no_agents = tally.rollouts_line(None)
    assert no_agents == "  rollouts: 10 ended: 10 succeeded, 0 failed, 0 timed out, 0 cancelled"


def _step(step: int, reward: float, seconds: float, *, in_process: int) -> WindowSummary:
    return WindowSummary(
        step=step, reward_mean=reward, active_groups=3, step_seconds=seconds, steps_in_process=in_process
    )


def test_a_step_trained_again_after_a_trainer_restart_is_shown_as_redone_with_the_real_time() -> None:
    """Issue 37 item 4: steps 1 and 2 redone after a restart from step 0's checkpoint. Before, the table
    skipped them (nothing after step 2 until step 3), the 12.3 s the restart cost showed as the 2.9 s the new
    trainer timed, and the summary said "4 steps" for 6 updates."""
    tally = RunTally()
    printed = [
        tally.step_lines(_step(step, 0.1 * step, 2.0, in_process=step + 1), running_agents=1, now=2.0 * step)
        for step in (0, 1, 2)
    ]
    assert all(len(lines) == 1 for lines in printed)
    redo = tally.step_lines(_step(1, 0.15, 2.9, in_process=1), running_agents=1, now=4.0 + 12.3)
    assert redo[0].split()[:2] == ["1", "redo"], redo
    assert redo[0].split()[-1] == "2.9"  # the trainer's own time of the step it ran
    assert redo[1] == (
        "  (step 1 trained again: the trainer restarted from its last checkpoint, and its update of this "
        "step was lost; 12.3 s since the line before)"
    )
    again = tally.step_lines(_step(2, 0.25, 2.0, in_process=2), running_agents=1, now=18.3)
    assert [line.split()[:2] for line in again] == [
        ["2", "redo"]
    ]  # no note: not the restarted trainer's first
    assert tally.step_lines(_step(3, 0.3, 2.0, in_process=3), running_agents=1, now=20.3)[0].split()[0] == "3"
    summary = tally.summary(outcome="finished", work_dir=Path("/w"), metrics_file=None)
    assert summary[1] == (
        "  steps:    4 (step 0 to 3); 6 updates: steps 1, 2 trained again after a trainer restart "
        "(the updates since its last checkpoint were lost)"
    )
    assert summary[3] == "  reward:   0.000 (step 0) -> 0.300 (step 3)"


def test_the_first_step_after_a_restart_that_lost_nothing_says_the_time_since_the_line_before() -> None:
    tally = RunTally()
    resumed = tally.step_lines(_step(7, 0.0, 2.0, in_process=1), running_agents=0, now=0.0)
    assert len(resumed) == 1  # a run resumed with --resume: its first line has no line before it
    tally = RunTally()
    tally.step_lines(_step(0, 0.0, 2.0, in_process=1), running_agents=0, now=0.0)
    lines = tally.step_lines(_step(1, 0.1, 1.5, in_process=1), running_agents=0, now=9.5)
    assert lines[0].split()[0] == "1"
    assert lines[1] == "  (step 1 is the first after the trainer restarted; 9.5 s since the line before)"
    summary = tally.summary(outcome="finished", work_dir=Path("/w"), metrics_file=None)
    assert summary[1] == "  steps:    2 (step 0 to 1)"
