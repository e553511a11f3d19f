"""An invalid agent template fails the run: phase Failed with the reason, AgentTemplateValid False."""

from __future__ import annotations

from datetime import UTC, datetime

from asyncrl.api import AsyncTrainingRunStatus, Phase
from asyncrl.operator.reconciliation.status import RunObservation, next_status
from asyncrl.workloads.trainer_state import TrainerObservation

NOW = datetime(2026, 1, 1, tzinfo=UTC)
REASON = "agent template: spec: expected a mapping, got the string 'oops'"


def _observation(**changes: object) -> RunObservation:
    fields: dict[str, object] = {
        "generation": 1,
        "suspended": False,
        "trainer": TrainerObservation(),
        "gateway_reachable": True,
        "summary": None,
        "rollout_counts": None,
        "jobs_active": 0,
        "jobs_created": 0,
        "jobs_failed": 0,
        "template_error": None,
        **changes,
    }
    return RunObservation(**fields)  # type: ignore[arg-type]


def test_a_fatal_template_error_fails_the_run_with_the_reason_and_it_stays_failed() -> None:
    status = next_status(
        AsyncTrainingRunStatus(), _observation(template_error=REASON, fatal_error=REASON), now=NOW
    )
    assert (status.phase, status.message) == (Phase.FAILED, REASON)
    (condition,) = [c for c in status.conditions if c.type == "AgentTemplateValid"]
    assert (condition.status, condition.reason, condition.message) == ("False", "TemplateError", REASON)
    later = next_status(status, _observation(template_error=REASON), now=NOW)
    assert (later.phase, later.message) == (Phase.FAILED, REASON)


def test_without_a_fatal_error_the_phase_follows_the_trainer() -> None:
    assert next_status(AsyncTrainingRunStatus(), _observation(), now=NOW).phase is Phase.RUNNING
