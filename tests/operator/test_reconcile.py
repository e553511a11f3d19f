"""The run's reconcile (asyncrl.operator.reconciliation.reconcile) and its state machine (`status`), pure:
the phases a run goes through, with no flap at the end, the conditions of each, the children it recreates,
who stops, and a Warning event for every failure."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from asyncrl.api import AsyncTrainingRunStatus, Phase
from asyncrl.operator.reconciliation import children_io
from asyncrl.operator.reconciliation.reconcile import Actions, Child, Observed, Refusal, reconcile
from asyncrl.operator.reconciliation.status import RunObservation, TrainerCreation
from asyncrl.workloads.trainer_state import TrainerEnd, TrainerObservation

NOW = datetime(2026, 12, 4, tzinfo=UTC)
ACTIVE = TrainerObservation()
SUCCEEDED = TrainerObservation(ended=TrainerEnd.SUCCEEDED, reason="Complete")
FAILED = TrainerObservation(
    ended=TrainerEnd.FAILED,
    reason="BackoffLimitExceeded",
    message="Job has reached the specified backoff limit",
)
STARTING = RunObservation(
    generation=1,
    suspended=False,
    trainer=ACTIVE,
    gateway_reachable=False,
    summary=None,
    rollout_counts=None,
    jobs_active=0,
    jobs_created=0,
    jobs_failed=0,
    template_error=None,
)
RUNNING = replace(STARTING, gateway_reachable=True)


def _walk(*observations: RunObservation) -> list[tuple[AsyncTrainingRunStatus, list[tuple[str, bool]]]]:
    """Reconcile each observation in turn from an empty status: the statuses and the events posted."""
    status, seen = AsyncTrainingRunStatus(), []
    for index, observation in enumerate(observations):
        actions = reconcile(
            Observed(status=status, run=observation, missing=frozenset(), agents_stopped=False),
            now=NOW + timedelta(seconds=index),
        )
        status = actions.status
        seen.append((status, [(event.reason, event.warning) for event in actions.events]))
    return seen


def _conditions(status: AsyncTrainingRunStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status.value, c.reason) for c in status.conditions}


def test_a_run_goes_pending_starting_running_succeeded_without_flapping_at_the_end() -> None:
    walk = _walk(
        replace(STARTING, trainer=None),
        STARTING,
        RUNNING,
        STARTING,  # the trainer exited and its gateway sidecar with it, before the Job is Complete
        replace(STARTING, trainer=SUCCEEDED),
        replace(RUNNING, trainer=ACTIVE),  # anything later
    )
    phases = [status.phase for status, _ in walk]
    assert phases == [
        Phase.PENDING,
        Phase.STARTING,
        Phase.RUNNING,
        Phase.RUNNING,
        Phase.SUCCEEDED,
        Phase.SUCCEEDED,
    ]
    assert walk[0][0].message == "waiting for the trainer to be created"  # the prerequisite, named
    assert "the gateway does not answer" in (walk[3][0].message or "")
    events = [event for _, posted in walk for event in posted]
    assert events == [
        ("PhasePending", False),
        ("PhaseStarting", False),
        ("PhaseRunning", False),
        ("PhaseSucceeded", False),
    ]
    end = _conditions(walk[-1][0])
    assert "GatewayReachable" not in end  # the gateway is gone with the trainer, and that is no fault
    assert end["Complete"] == ("True", "Succeeded")
    assert end["Failed"] == ("False", "Succeeded")
    assert end["Ready"][0] == "False"


def test_a_new_run_is_neither_complete_nor_failed_and_says_not_finished() -> None:
    ((first, _),) = _walk(replace(STARTING, trainer=None))
    conditions = _conditions(first)
    assert conditions["Complete"] == ("False", "NotFinished")
    assert conditions["Failed"] == ("False", "NotFinished")
    assert conditions["GatewayReachable"] == ("False", "Unreachable")


def test_a_trainer_job_that_fails_while_the_gateway_never_answered_fails_the_run_with_the_jobs_reason() -> (
    None
):
    walk = _walk(replace(STARTING, trainer=None), STARTING, replace(STARTING, trainer=FAILED))
    status, events = walk[-1]
    assert status.phase is Phase.FAILED
    assert status.message is not None
    assert "BackoffLimitExceeded" in status.message
    assert "its gateway never answered" in status.message
    assert events == [("PhaseFailed", True)]


observations = st.builds(
    RunObservation,
    generation=st.just(1),
    suspended=st.booleans(),
    trainer=st.sampled_from([None, ACTIVE, SUCCEEDED, FAILED]),
    gateway_reachable=st.booleans(),
    summary=st.none(),
    rollout_counts=st.none(),
    jobs_active=st.just(0),
    jobs_created=st.just(0),
    jobs_failed=st.just(0),
    template_error=st.none() | st.just("bad template"),
    fatal_error=st.none() | st.just("the trainer stopped (configuration error): x"),
)


@given(st.lists(observations, min_size=1, max_size=8))
def test_no_phase_changes_after_the_end_and_every_failure_is_a_warning(walk: list[RunObservation]) -> None:
    ended: Phase | None = None
    for status, events in _walk(*walk):
        if ended is not None:
            assert status.phase is ended
            assert events == []
        for reason, warning in events:
            assert warning == (reason == "PhaseFailed")
        if status.phase is not None and status.phase.is_terminal:
            ended = status.phase


def _act(
    observation: RunObservation, missing: set[Child], *, status: AsyncTrainingRunStatus | None = None
) -> Actions:
    return reconcile(
        Observed(
            status=status or AsyncTrainingRunStatus(),
            run=observation,
            missing=frozenset(missing),
            agents_stopped=False,
        ),
        now=NOW,
    )


def test_missing_children_are_recreated_what_the_trainer_mounts_first_each_with_a_warning() -> None:
    actions = _act(
        replace(RUNNING, trainer=None), {Child.TRAINER, Child.SERVICE, Child.CONFIG_MAP, Child.KEY_SECRET}
    )
    assert actions.create == (Child.KEY_SECRET, Child.CONFIG_MAP, Child.SERVICE, Child.TRAINER)
    assert [(e.reason, e.warning) for e in actions.events][:4] == [("ChildRecreated", True)] * 4


def test_a_child_whose_recreation_was_said_is_tried_again_without_saying_it_again() -> None:
    observed = Observed(
        status=AsyncTrainingRunStatus(),
        run=RUNNING,
        missing=frozenset({Child.SERVICE, Child.CONFIG_MAP}),
        agents_stopped=False,
        announced=frozenset({Child.SERVICE}),  # its first recreate failed (a quota, say)
    )
    actions = reconcile(observed, now=NOW)
    assert actions.create == (Child.CONFIG_MAP, Child.SERVICE)
    recreated = [event.message for event in actions.events if event.reason == "ChildRecreated"]
    assert len(recreated) == 1
    assert "ConfigMap" in recreated[0]


@pytest.mark.parametrize(
    ("multi_node", "named"), [(False, "the run's trainer Job"), (True, "the run's RayCluster")]
)
def test_a_recreated_trainer_is_named_as_the_object_it_is(multi_node: bool, named: str) -> None:
    observed = Observed(
        status=AsyncTrainingRunStatus(),
        run=replace(RUNNING, trainer=None),
        missing=frozenset({Child.TRAINER}),
        agents_stopped=False,
        multi_node=multi_node,
    )
    recreated = [e.message for e in reconcile(observed, now=NOW).events if e.reason == "ChildRecreated"]
    assert recreated == [f"{named} was missing (deleted?): recreating it"]


def test_a_refused_trainer_is_named_as_the_object_it_is() -> None:
    quota = ApiException(status=403, reason="Forbidden")
    job = children_io.refusal(Child.TRAINER, quota, started=False, multi_node=False)
    assert (job.reason, job.message.split(":")[0]) == (
        "ChildCreateFailed",
        "could not create the run's trainer Job",
    )
    cluster = children_io.refusal(Child.TRAINER, quota, started=True, multi_node=True)
    assert (cluster.reason, cluster.message.split(":")[0]) == (
        "ChildRecreateFailed",
        "could not recreate the run's RayCluster",
    )


def test_nothing_is_recreated_after_the_run_ended() -> None:
    succeeded = _act(replace(RUNNING, trainer=SUCCEEDED), set()).status
    assert _act(RUNNING, {Child.TRAINER, Child.SERVICE}, status=succeeded).create == ()


def test_a_failed_run_stops_its_agents_and_suspends_a_trainer_job_that_still_runs() -> None:
    actions = _act(replace(RUNNING, fatal_error="the trainer stopped (configuration error): x"), set())
    assert actions.stop_agents
    assert actions.trainer_suspend is True
    ended_job = _act(replace(RUNNING, trainer=FAILED), set())
    assert ended_job.stop_agents
    assert ended_job.trainer_suspend is None  # an ended Job holds no pods


def test_suspend_follows_the_spec_and_resumes_only_what_the_run_suspended() -> None:
    assert _act(replace(RUNNING, suspended=True), set()).trainer_suspend is True
    ours = TrainerObservation(suspended=True, suspended_by_run=True)
    assert _act(replace(RUNNING, trainer=ours), set()).trainer_suspend is False
    kueue = TrainerObservation(suspended=True, suspended_by_run=False)
    assert _act(replace(RUNNING, trainer=kueue), set()).trainer_suspend is None


def _refused(refusal: Refusal, *, said: bool = False, trainer: TrainerObservation | None = None) -> Actions:
    observed = Observed(
        status=AsyncTrainingRunStatus(),
        run=replace(STARTING, trainer=trainer),
        missing=frozenset({Child.TRAINER}),
        agents_stopped=False,
        announced=frozenset({Child.TRAINER}) if said else frozenset(),
        first_creation=frozenset({Child.TRAINER}),
        refused={Child.TRAINER: refusal},
    )
    return reconcile(observed, now=NOW)


def test_a_child_refused_for_good_fails_the_run_naming_the_servers_reason_once() -> None:
    refusal = Refusal("TrainerJobRejected", "the API server refused the trainer Job: Invalid (422): x", True)
    actions = _refused(refusal)
    assert actions.status.phase is Phase.FAILED
    assert actions.status.message == refusal.message
    assert actions.create == ()  # nothing more is tried
    assert [(e.reason, e.warning) for e in actions.events] == [
        ("TrainerJobRejected", True),
        ("PhaseFailed", True),
    ]


def test_a_child_refused_for_now_leaves_the_run_pending_saying_why_and_is_tried_again() -> None:
    refusal = Refusal(
        "ChildCreateFailed", "could not create the run's trainer Job: exceeded quota; retrying", False
    )
    first = _refused(refusal)
    assert first.status.phase is Phase.PENDING
    assert first.status.message == refusal.message
    assert first.create == (Child.TRAINER,)
    assert [e.reason for e in first.events] == ["ChildCreateFailed", "PhasePending"]  # no ChildRecreated
    again = _refused(refusal, said=True)
    assert again.create == (Child.TRAINER,)
    assert [e.reason for e in again.events if e.reason != "PhasePending"] == []  # said once


def test_the_trainers_creation_report_sets_pod_template_applied_with_a_warning_per_problem() -> None:
    observed = Observed(
        status=AsyncTrainingRunStatus(),
        run=STARTING,
        missing=frozenset(),
        agents_stopped=False,
        trainer_created=TrainerCreation(
            refused="spec.trainer.podTemplate: kept the operator's command", warnings=[]
        ),
    )
    actions = reconcile(observed, now=NOW)
    assert _conditions(actions.status)["PodTemplateApplied"] == ("False", "FieldsRefused")
    assert ("PodTemplateFieldsRefused", True) in [(e.reason, e.warning) for e in actions.events]
    clean = reconcile(replace(observed, trainer_created=TrainerCreation(refused=None, warnings=[])), now=NOW)
    assert _conditions(clean.status)["PodTemplateApplied"] == ("True", "Applied")
