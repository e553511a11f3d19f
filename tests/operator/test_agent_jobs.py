"""Agent Jobs get our name, labels, owner, limits and AGL_* env, whatever the template says."""

from __future__ import annotations

import pytest

from asyncrl.agent_templates.render import TemplateError
from asyncrl.local.agents import agent_command
from asyncrl.operator.dispatcher.job_state import rollout_state_of_job
from asyncrl.operator.dispatcher.ratelimit import SlidingWindowLimiter
from asyncrl.rollouts import RolloutState
from asyncrl.workloads import names
from asyncrl.workloads.agent_jobs import AgentJobSettings, agent_process, shape_agent_job

OWNER = {"apiVersion": "asyncrl.dev/v1alpha1", "kind": "AsyncTrainingRun", "name": "demo", "uid": "u-1"}
SETTINGS = AgentJobSettings(
    run_name="demo",
    namespace="team",
    owner_reference=OWNER,
    timeout_seconds=1800,
    ttl_seconds_after_finished=1200,
)
ENV = {"AGL_OPENAI_BASE_URL": "http://gw/v1", "AGL_EVENT_URL": "http://gw/events", "AGL_KEY": "token"}


def _template_job() -> dict[str, object]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "whatever", "namespace": "elsewhere", "labels": {"team": "a"}},
        "spec": {
            "backoffLimit": 5,
            "parallelism": 3,
            "template": {
                "spec": {
                    "restartPolicy": "OnFailure",
                    "initContainers": [{"name": "setup", "image": "busybox"}],
                    "containers": [
                        {"name": "agent", "image": "py", "env": [{"name": "AGL_KEY", "value": "spoofed"}]},
                        {"name": "tool", "image": "py"},
                    ],
                }
            },
        },
    }


def test_shaped_job_enforces_one_attempt_timeout_ttl_and_identity() -> None:
    job = shape_agent_job(
        _template_job(), settings=SETTINGS, rollout_id="r:1", group_id="g1", attempt_id="a1", agent_env=ENV
    )
    assert job["metadata"]["name"] == names.agent_job_name("demo", "r:1")
    assert job["metadata"]["namespace"] == "team"
    assert job["metadata"]["ownerReferences"] == [OWNER]
    assert job["metadata"]["labels"]["team"] == "a"
    assert job["metadata"]["labels"][names.LABEL_RUN] == "demo"
    assert job["metadata"]["annotations"][names.ANNOTATION_ROLLOUT_ID] == "r:1"
    spec = job["spec"]
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (
        0,
        1800,
        1200,
    )
    assert "parallelism" not in spec
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    for container in pod["initContainers"] + pod["containers"]:
        env = {entry["name"]: entry["value"] for entry in container["env"]}
        assert env == ENV  # the template's spoofed AGL_KEY is replaced


def test_job_names_are_deterministic_valid_and_distinct() -> None:
    long_run = "a" * 80
    first = names.agent_job_name(long_run, "rollout-1")
    assert first == names.agent_job_name(long_run, "rollout-1")
    assert first != names.agent_job_name(long_run, "rollout-2")
    assert len(first) <= 63
    assert len(names.trainer_job_name(long_run)) <= 52


def test_job_conditions_map_to_rollout_states() -> None:
    assert rollout_state_of_job({}) is None
    assert rollout_state_of_job({"active": 1, "ready": 0}) is None
    assert rollout_state_of_job({"active": 1, "ready": 1}) == (RolloutState.RUNNING, None)
    complete = {"conditions": [{"type": "Complete", "status": "True"}]}
    assert rollout_state_of_job(complete) == (RolloutState.SUCCEEDED, None)
    deadline = {
        "conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "late"}]
    }
    assert rollout_state_of_job(deadline) == (RolloutState.TIMED_OUT, "DeadlineExceeded: late")
    failed = {
        "ready": 1,
        "conditions": [
            {"type": "FailureTarget", "status": "True"},
            {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"},
        ],
    }
    state, message = rollout_state_of_job(failed) or (None, None)
    assert state == RolloutState.FAILED
    assert message is not None
    assert message.startswith("BackoffLimitExceeded")


def test_rate_limiter_allows_n_per_window_then_waits_for_the_oldest() -> None:
    limiter = SlidingWindowLimiter(per_minute=3)
    for now in (0.0, 1.0, 2.0):
        assert limiter.delay(now) == 0.0
        limiter.record(now)
    assert limiter.delay(10.0) == 50.0
    assert limiter.delay(60.0) == 0.0
    limiter.record(60.0)
    assert limiter.delay(60.5) == 0.5


def test_numeric_resource_quantities_leave_as_strings() -> None:
    template = _template_job()
    agent = template["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    agent["resources"] = {"limits": {"cpu": 2, "memory": "1Gi"}, "requests": {"cpu": 0.5}}
    job = shape_agent_job(
        template, settings=SETTINGS, rollout_id="r1", group_id="g1", attempt_id="a1", agent_env=ENV
    )
    resources = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert resources == {"limits": {"cpu": "2", "memory": "1Gi"}, "requests": {"cpu": "0.5"}}


def _agent_container_job(**container: object) -> dict[str, object]:
    base = {"name": "agent", "image": "python", "command": ["python", "$(SCRIPT)"]}
    base["args"] = ["--q=$(QUESTION)"]
    return {"spec": {"template": {"spec": {"containers": [base | container]}}}}


def test_an_agent_process_expands_against_the_runners_env_and_returns_only_what_the_job_adds() -> None:
    job = _agent_container_job(env=[{"name": "QUESTION", "value": "2+2?"}])
    argv, env = agent_process(
        job, {"AGL_KEY": "aglr-x"}, inherited={"SCRIPT": "agent.py", "HOME": "/root"}, why_a_command="-"
    )
    assert argv == ["python", "agent.py", "--q=2+2?"]
    assert env == {"QUESTION": "2+2?", "AGL_KEY": "aglr-x"}  # the runner's own env is not repeated


def test_an_agent_process_refuses_value_from_only_where_the_runner_cannot_resolve_it() -> None:
    secret = {"secretKeyRef": {"name": "s", "key": "k"}}
    job = _agent_container_job(env=[{"name": "TOKEN", "valueFrom": secret}])
    with pytest.raises(TemplateError, match="cannot resolve valueFrom of env 'TOKEN'"):
        agent_command(job, {})
    _, env = agent_process(job, {}, inherited={"TOKEN": "from-kubelet"}, why_a_command="-")
    assert "TOKEN" not in env  # left to the inherited env, where the kubelet put it


def test_a_local_agent_without_a_command_is_refused_saying_local_mode_runs_the_command() -> None:
    job = {"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "python"}]}}}}
    with pytest.raises(TemplateError, match="'agent' has no command; local mode runs the command"):
        agent_command(job, {})
