"""`phase_of` and `next_status` (asyncrl.operator.reconciliation.status) called directly: the phase rules in
their order, the window summary and counts applied, and an unchanged observation giving an equal status
(nothing to write)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from asyncrl.api import AsyncTrainingRunStatus, Phase
from asyncrl.operator.reconciliation.status import next_status, phase_of
from asyncrl.rollouts import RolloutState
from asyncrl.window_summary import WindowSummary
from asyncrl.workloads.trainer_state import TrainerObservation, trainer_of_job
from tests.operator.test_status_rules import RUNNING

NOW = datetime(2026, 12, 3, tzinfo=UTC)
LATER = NOW + timedelta(minutes=1)
ACTIVE_JOB = trainer_of_job({"status": {"active": 1}})
COMPLETE_JOB = trainer_of_job({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
FAILED_JOB = trainer_of_job(
    {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}
)
BASE = replace(RUNNING, generation=2, jobs_active=3, jobs_created=10, jobs_failed=1)


@pytest.mark.parametrize(
    ("changes", "phase"),
    [
        ({}, Phase.RUNNING),
        ({"gateway_reachable": False}, Phase.STARTING),
        ({"trainer": None}, Phase.PENDING),
        ({"trainer": COMPLETE_JOB}, Phase.SUCCEEDED),
        ({"trainer": FAILED_JOB}, Phase.FAILED),
        ({"suspended": True}, Phase.SUSPENDED),
        ({"suspended": True, "trainer": None}, Phase.SUSPENDED),  # suspend outranks a missing Job
        ({"suspended": True, "trainer": COMPLETE_JOB}, Phase.SUCCEEDED),  # the trainer's end is final
        ({"fatal_error": "bad template", "suspended": True}, Phase.FAILED),  # a fatal error outranks all
        ({"fatal_error": "bad template", "trainer": COMPLETE_JOB}, Phase.FAILED),
        ({"trainer": COMPLETE_JOB, "gateway_reachable": False}, Phase.SUCCEEDED),
    ],
)
def test_phase_rules_apply_in_their_order(changes: dict[str, Any], phase: Phase) -> None:
    assert phase_of(replace(BASE, **changes))[0] is phase


def test_a_failed_trainer_job_message_names_the_reason_and_the_last_reported_error() -> None:
    phase, message = phase_of(replace(BASE, trainer=FAILED_JOB, trainer_error="OOM at step 4"))
    assert phase is Phase.FAILED
    assert "BackoffLimitExceeded" in message
    assert "OOM at step 4" in message


def test_the_window_summary_and_counts_reach_the_status_as_integers() -> None:
    summary = WindowSummary(
        step=5,
        active_groups=6,
        carry_over_age_histogram={"1": 2},
        prev_carry_over_rollouts=8,
        completed_rollouts=16,
        new_carry_over_rollouts=4,
        carry_over_age_max_steps=1,
        proxy_inflight_at_pause=3,
        proxy_drain_seconds=0.25,
        proxy_aborted_calls=0,
    )
    counts = {RolloutState.SUCCEEDED: 30, RolloutState.QUEUED: 2, RolloutState.RUNNING: 5}
    status = next_status(
        AsyncTrainingRunStatus(), replace(BASE, summary=summary, rollout_counts=counts), now=NOW
    )
    wire = status.to_wire()
    assert wire["step"] == 5
    assert wire["completedRollouts"] == 16
    assert isinstance(wire["completedRollouts"], int)
    assert wire["proxyDrainSeconds"] == 0.25
    assert wire["carryOverAgeHistogram"] == {"1": 2}
    assert wire["rollouts"]["succeeded"] == 30
    assert wire["jobs"] == {"active": 3, "created": 10, "failed": 1}
    assert status.last_step_time == NOW


def test_a_summary_that_omits_a_field_keeps_the_status_value() -> None:
    first = next_status(
        AsyncTrainingRunStatus(),
        replace(BASE, summary=WindowSummary(step=1, completed_rollouts=8, proxy_drain_seconds=0.5)),
        now=NOW,
    )
    second = next_status(first, replace(BASE, summary=WindowSummary(step=2, completed_rollouts=4)), now=LATER)
    assert second.completed_rollouts == 4
    assert second.proxy_drain_seconds == 0.5  # not reported by the second summary: kept


@given(
    suspended=st.booleans(),
    reachable=st.booleans(),
    job=st.sampled_from([None, ACTIVE_JOB, COMPLETE_JOB, FAILED_JOB]),
    step=st.none() | st.integers(min_value=0, max_value=50),
    template_error=st.none() | st.text(min_size=1, max_size=20),
)
def test_an_unchanged_observation_gives_an_equal_status(
    suspended: bool,
    reachable: bool,
    job: TrainerObservation | None,
    step: int | None,
    template_error: str | None,
) -> None:
    observation = replace(
        BASE,
        suspended=suspended,
        gateway_reachable=reachable,
        trainer=job,
        summary=None if step is None else WindowSummary(step=step, completed_rollouts=4),
        template_error=template_error,
    )
    once = next_status(AsyncTrainingRunStatus(), observation, now=NOW)
    assert next_status(once, observation, now=LATER) == once  # nothing to write: no timestamp ticked


@pytest.mark.parametrize("job", [COMPLETE_JOB, FAILED_JOB])
def test_a_finished_run_stays_finished_whatever_is_observed_later(job: TrainerObservation) -> None:
    finished = next_status(AsyncTrainingRunStatus(), replace(BASE, trainer=job), now=NOW)
    later = next_status(finished, replace(BASE, trainer=ACTIVE_JOB), now=LATER)
    assert later.phase is finished.phase
    assert later.message == finished.message
