"""The run's end states from what the operator observed (the pure rules of
asyncrl.operator.reconciliation.status)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from asyncrl.api import AsyncTrainingRunStatus, Phase
from asyncrl.operator.reconciliation.status import RunObservation, next_status
from asyncrl.workloads.trainer_state import TrainerObservation, trainer_of_job

NOW = datetime(2026, 12, 3, tzinfo=UTC)
RUNNING = RunObservation(
    generation=1,
    suspended=False,
    trainer=trainer_of_job({"status": {"active": 1}}),
    gateway_reachable=True,
    summary=None,
    rollout_counts=None,
    jobs_active=0,
    jobs_created=0,
    jobs_failed=0,
    template_error=None,
)


def _conditions(status: AsyncTrainingRunStatus) -> dict[str, Any]:
    return {c.type: (c.status.value, c.reason, c.message) for c in status.conditions}


def _job_with(condition: str, reason: str = "", message: str = "") -> TrainerObservation:
    return trainer_of_job(
        {
            "status": {
                "conditions": [{"type": condition, "status": "True", "reason": reason, "message": message}]
            }
        }
    )


def test_a_running_run_is_neither_complete_nor_failed() -> None:
    status = next_status(AsyncTrainingRunStatus(), RUNNING, now=NOW)
    assert status.phase is Phase.RUNNING
    conditions = _conditions(status)
    assert conditions["Complete"][0] == "False"
    assert conditions["Failed"][0] == "False"
    assert conditions["Ready"][0] == "True"


def test_a_finished_trainer_makes_the_run_complete() -> None:
    status = next_status(AsyncTrainingRunStatus(), replace(RUNNING, trainer=_job_with("Complete")), now=NOW)
    assert status.phase is Phase.SUCCEEDED
    assert _conditions(status)["Complete"][:2] == ("True", "Succeeded")
    assert _conditions(status)["Failed"][0] == "False"


def test_a_fatal_error_fails_the_run_with_its_reason_even_while_the_gateway_answers() -> None:
    observation = replace(RUNNING, fatal_error="the trainer stopped (configuration error): bad key")
    status = next_status(AsyncTrainingRunStatus(), observation, now=NOW)
    assert status.phase is Phase.FAILED
    assert status.message == "the trainer stopped (configuration error): bad key"
    assert _conditions(status)["Failed"] == ("True", "Failed", status.message)
    assert _conditions(status)["Complete"][0] == "False"


def test_the_trainers_last_error_reaches_the_message_of_a_failed_trainer_job() -> None:
    observation = replace(
        RUNNING,
        trainer=_job_with("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit"),
        trainer_error="RuntimeError: CUDA out of memory",
    )
    status = next_status(AsyncTrainingRunStatus(), observation, now=NOW)
    assert status.phase is Phase.FAILED
    assert status.message is not None
    assert "BackoffLimitExceeded" in status.message
    assert "RuntimeError: CUDA out of memory" in status.message


def test_a_restarted_trainer_keeps_running_and_says_what_it_restarted_after() -> None:
    status = next_status(AsyncTrainingRunStatus(), replace(RUNNING, trainer_error="ValueError: x"), now=NOW)
    assert status.phase is Phase.RUNNING
    assert status.message is not None
    assert "ValueError: x" in status.message


def test_a_failed_run_stays_failed() -> None:
    failed = next_status(AsyncTrainingRunStatus(), replace(RUNNING, fatal_error="boom"), now=NOW)
    later = next_status(failed, RUNNING, now=NOW)
    assert later.phase is Phase.FAILED
    assert later.message == "boom"
    assert _conditions(later)["Failed"][0] == "True"


def test_an_unchanged_observation_gives_an_equal_status() -> None:
    first = next_status(AsyncTrainingRunStatus(), replace(RUNNING, fatal_error="boom"), now=NOW)
    assert next_status(first, replace(RUNNING, fatal_error="boom"), now=NOW) == first
