"""The agent pool's pure parts: the Deployment built from the template, and the process the runner starts."""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.agent_pool import pool_agent_process
from asyncrl.agent_templates.render import TemplateError
from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.workloads import names
from asyncrl.workloads.pool import (
    POOL_TOKEN_ENV,
    TemplateSource,
    agent_pool_deployment,
    pool_replicas,
)
from tests.support.kube import run_manifest

RUN = {
    "apiVersion": "asyncrl.dev/v1alpha1",
    "kind": "AsyncTrainingRun",
    "metadata": {"name": "demo", "namespace": "ns", "uid": "u-1"},
}
OWNER = {"apiVersion": "asyncrl.dev/v1alpha1", "kind": "AsyncTrainingRun", "name": "demo", "uid": "u-1"}
SAMPLE_JOB: dict[str, Any] = {
    "spec": {
        "activeDeadlineSeconds": 5,
        "template": {
            "metadata": {"labels": {"team": "a"}},
            "spec": {
                "serviceAccountName": "agents",
                "containers": [
                    {
                        "name": "agent",
                        "image": "my/agent:1",
                        "command": ["python", "agent.py"],
                        "args": ["--q=$(QUESTION)"],
                        "env": [
                            {"name": "QUESTION", "value": "<question>"},
                            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
                            {"name": POOL_TOKEN_ENV, "value": "smuggled"},
                        ],
                        "resources": {"limits": {"cpu": 1}},
                    }
                ],
            },
        },
    }
}


def _spec(**agents: Any) -> AsyncTrainingRunSpec:
    body = run_manifest("demo")["spec"]
    body["agents"].update(agents)
    return AsyncTrainingRunSpec.model_validate(body)


def _deployment(spec: AsyncTrainingRunSpec) -> dict[str, Any]:
    return agent_pool_deployment(
        RUN,
        spec,
        owner=OWNER,
        sample_job=SAMPLE_JOB,
        agent_gateway_url="http://gw:8000",
        template=TemplateSource("demo-config", "agent-job.yaml.j2"),
        replicas=3,
    )


def test_the_pool_deployment_keeps_the_template_pod_and_runs_the_pool_runner_in_its_first_container() -> None:
    deployment = _deployment(_spec(mode="Pool", pool={"replicas": 3}))
    assert deployment["metadata"]["name"] == names.agent_pool_name("demo")
    assert deployment["metadata"]["ownerReferences"] == [OWNER]
    assert deployment["spec"]["replicas"] == 3
    pod = deployment["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "a"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["restartPolicy"] == "Always"
    assert pod["spec"]["serviceAccountName"] == "agents"
    container = pod["spec"]["containers"][0]
    assert container["image"] == "my/agent:1"
    assert container["command"] == ["asyncrl", "agent-pool"]
    assert "--gateway-url=http://gw:8000" in container["args"]
    assert container["resources"] == {"limits": {"cpu": "1"}}  # quantities as strings
    env = {entry["name"]: entry for entry in container["env"]}
    assert env[POOL_TOKEN_ENV]["valueFrom"]["secretKeyRef"]["name"] == names.agent_pool_secret_name("demo")
    assert "value" not in env[POOL_TOKEN_ENV]  # the template cannot set the token
    assert env["TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "s", "key": "k"}
    assert SAMPLE_JOB["spec"]["template"]["spec"]["containers"][0]["command"] == ["python", "agent.py"]


def test_the_pool_has_no_pods_while_suspended_or_after_the_run_failed() -> None:
    spec = _spec(mode="Pool", pool={"replicas": 5})
    assert pool_replicas(spec, stopped=False) == 5
    assert pool_replicas(spec, stopped=True) == 0
    assert pool_replicas(spec.model_copy(update={"suspend": True}), stopped=False) == 0


def test_mode_defaults_to_jobs_and_a_bad_mode_names_the_field() -> None:
    assert _spec().agents.mode == "Jobs"
    with pytest.raises(Exception, match="mode"):
        _spec(mode="Pods")


def test_the_pool_agent_process_is_the_rendered_command_with_its_values_and_agl_env_no_pool_token() -> None:
    job = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        SAMPLE_JOB["spec"]["template"]["spec"]["containers"][0]
                        | {"env": [{"name": "QUESTION", "value": "2+2?"}, {"name": "TOKEN", "valueFrom": {}}]}
                    ]
                }
            }
        }
    }
    pod_env = {"PATH": "/bin", "TOKEN": "from-kubelet", POOL_TOKEN_ENV: "secret", "QUESTION": "<question>"}
    argv, env = pool_agent_process(job, {"AGL_KEY": "aglr-x"}, pod_env)
    assert argv == ["python", "agent.py", "--q=2+2?"]
    assert env["QUESTION"] == "2+2?"
    assert env["TOKEN"] == "from-kubelet"  # valueFrom: resolved in the pool pod's own environment
    assert env["AGL_KEY"] == "aglr-x"
    assert POOL_TOKEN_ENV not in env


def test_a_template_without_a_command_is_refused_with_the_reason() -> None:
    job = {"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "x"}]}}}}
    with pytest.raises(TemplateError, match="give a command"):
        pool_agent_process(job, {}, {})
