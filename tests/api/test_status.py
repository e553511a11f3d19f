"""Status helpers are pure, so the operator can compute the next status and write only when it changed."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from asyncrl.api.types import (
    AsyncTrainingRunStatus,
    Condition,
    ConditionStatus,
    Phase,
    RolloutCounts,
    with_condition,
)
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.window import StepSummary
from asyncrl.window_summary import WindowSummary

T0 = datetime(2026, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def _summary(step: int, drain: float = 0.5) -> WindowSummary:
    """The trainer's window summary as the gateway serves it."""
    return (
        StepSummary(
            step=step,
            n_prev_carry_over_rollouts=8,
            n_completed_rollouts=8,
            n_new_carry_over_rollouts=4,
            new_carry_over_age_max_steps=2,
            carry_over_age_histogram={1: 1, 2: 1},
            n_stale_groups_cancelled=0,
            n_stale_groups_kept=0,
            n_failed_rollouts_consumed=1,
        )
        .with_drain(inflight_at_pause=3, drain_seconds=drain)
        .window_summary(active_groups=4, reward_mean=None, step_seconds=None)
    )


@pytest.mark.parametrize("phase", list(Phase))
def test_only_succeeded_and_failed_are_terminal(phase: Phase) -> None:
    assert phase.is_terminal == (phase in {Phase.SUCCEEDED, Phase.FAILED})


def test_window_summary_fills_the_seed_metrics() -> None:
    status = AsyncTrainingRunStatus(phase=Phase.RUNNING).with_window_summary(_summary(step=3), now=T0)

    assert status.to_wire() == {
        "phase": "Running",
        "conditions": [],
        "step": 3,
        "progress": "4",
        "prevCarryOverRollouts": 8,
        "completedRollouts": 8,
        "newCarryOverRollouts": 4,
        "carryOverAgeMaxSteps": 2,
        "proxyInflightAtPause": 3,
        "proxyDrainSeconds": 0.5,
        "proxyAbortedCalls": 0,
        "carryOverAgeHistogram": {"1": 1, "2": 1},
        "activeGroups": 4,
        "lastStepTime": "2026-01-01T00:00:00Z",
    }


def test_the_same_summary_again_changes_nothing() -> None:
    once = AsyncTrainingRunStatus().with_window_summary(_summary(step=3), now=T0)

    assert once.with_window_summary(_summary(step=3), now=T1) == once


def test_last_step_time_moves_only_when_the_step_advances() -> None:
    status = AsyncTrainingRunStatus().with_window_summary(_summary(step=3), now=T0)

    advanced = status.with_window_summary(_summary(step=4, drain=1.25), now=T1)

    assert (advanced.step, advanced.last_step_time, advanced.proxy_drain_seconds) == (4, T1, 1.25)


def test_steps_are_shown_done_of_total_counted_from_one_and_the_reward_keeps_its_best() -> None:
    first = _summary(step=0).model_copy(update={"reward_mean": 0.25, "total_steps": 2})
    status = AsyncTrainingRunStatus().with_window_summary(first, now=T0)
    assert status.progress == "1/2"
    assert status.reward is not None
    assert (status.reward.last, status.reward.best) == (0.25, 0.25)
    last = _summary(step=1).model_copy(update={"reward_mean": 0.125, "total_steps": 2})
    done = status.with_window_summary(last, now=T1)
    assert done.progress == "2/2"  # a finished 2-step run shows 2 of 2, not its 0-based step 1
    assert done.reward is not None
    assert (done.reward.last, done.reward.best) == (0.125, 0.25)
    open_ended = AsyncTrainingRunStatus().with_window_summary(_summary(step=4), now=T0)
    assert open_ended.progress == "5"
    assert open_ended.reward is None  # no reward reported: none shown
    assert done.to_wire()["progress"] == "2/2"
    assert done.to_wire()["reward"] == {"last": 0.125, "best": 0.25}


def test_rollout_counts_from_states() -> None:
    states = Counter([RolloutState.SUCCEEDED] * 5 + [RolloutState.TIMED_OUT] * 2 + [RolloutState.QUEUED])

    assert RolloutCounts.from_states(states).to_wire() == {
        "queued": 1,
        "running": 0,
        "succeeded": 5,
        "failed": 0,
        "timedOut": 2,
        "cancelled": 0,
    }


def _condition(status: ConditionStatus, at: datetime, reason: str = "PodRunning") -> Condition:
    return Condition(type="TrainerReady", status=status, reason=reason, last_transition_time=at)


def test_reasserting_a_condition_keeps_its_transition_time() -> None:
    stored = [_condition(ConditionStatus.TRUE, T0)]

    updated = with_condition(stored, _condition(ConditionStatus.TRUE, T1))

    assert updated == stored


def test_a_condition_that_changes_status_gets_a_new_transition_time() -> None:
    other = Condition(
        type="GatewayReady", status=ConditionStatus.TRUE, reason="Serving", last_transition_time=T0
    )
    stored = [other, _condition(ConditionStatus.TRUE, T0)]

    updated = with_condition(stored, _condition(ConditionStatus.FALSE, T1, reason="PodFailed"))

    assert updated == [other, _condition(ConditionStatus.FALSE, T1, reason="PodFailed")]


def test_a_new_condition_type_is_appended() -> None:
    assert with_condition([], _condition(ConditionStatus.UNKNOWN, T0)) == [
        _condition(ConditionStatus.UNKNOWN, T0)
    ]


def test_status_wire_names() -> None:
    fields = {field.alias or name for name, field in AsyncTrainingRunStatus.model_fields.items()}
    assert fields == {
        "phase",
        "observedGeneration",
        "conditions",
        "step",
        "progress",
        "reward",
        "prevCarryOverRollouts",
        "completedRollouts",
        "newCarryOverRollouts",
        "carryOverAgeMaxSteps",
        "proxyInflightAtPause",
        "proxyDrainSeconds",
        "proxyAbortedCalls",
        "carryOverAgeHistogram",
        "activeGroups",
        "rollouts",
        "jobs",
        "startTime",
        "lastStepTime",
        "rayCluster",
        "message",
    }


def test_the_floats_kubectl_prints_are_rounded_reward_to_4_places_drain_to_milliseconds() -> None:
    """Issue 37 item 9: `kubectl get atr` printed REWARD 0.005208333333333333 (a number column is printed as
    stored)."""
    summary = _summary(step=3, drain=0.123456789).model_copy(update={"reward_mean": 0.005208333333333333})
    status = AsyncTrainingRunStatus().with_window_summary(summary, now=T0)
    assert status.reward is not None
    assert (status.reward.last, status.reward.best) == (0.0052, 0.0052)
    assert status.proxy_drain_seconds == 0.123
    assert "0.005208" not in status.model_dump_json()
