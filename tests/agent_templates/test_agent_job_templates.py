"""The shipped agent Job templates render a valid agent Job for a sample row, as the operator would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.agent_templates.render import render_job, template_variables
from asyncrl.workloads.agent_jobs import AgentJobSettings, shape_agent_job

TEMPLATES = Path(__file__).resolve().parents[2] / "agent_job_templates"
ROW = {"prompt": 'say "hi"\nnow', "target": "ab", "tool_seconds": 0.5}


@pytest.mark.parametrize("name", sorted(path.name for path in TEMPLATES.glob("*.yaml.j2")))
def test_template_renders_an_agent_job_for_a_sample_row(name: str) -> None:
    variables = template_variables(
        ROW,
        rollout={"id": "r-1", "group_id": "g-1", "step": 0, "attempt_id": "a1", "mode": "train"},
        job_name="demo-r-1",
        run={"name": "demo", "namespace": "team"},
    )
    job = render_job((TEMPLATES / name).read_text(), variables)
    settings = AgentJobSettings(
        run_name="demo",
        namespace="team",
        owner_reference={
            "apiVersion": "asyncrl.dev/v1alpha1",
            "kind": "AsyncTrainingRun",
            "name": "demo",
            "uid": "u",
        },
        timeout_seconds=1800,
        ttl_seconds_after_finished=1200,
    )
    shaped = shape_agent_job(
        job, settings=settings, rollout_id="r-1", group_id="g-1", attempt_id="a1", agent_env={"AGL_KEY": "k"}
    )
    (container,) = shaped["spec"]["template"]["spec"]["containers"]
    env = {entry["name"]: entry["value"] for entry in container["env"]}
    assert json.loads(env["ROW"]) == ROW
    assert env["AGL_KEY"] == "k"
    assert all(isinstance(value, str) for value in env.values())  # Kubernetes env values are strings
    assert container["command"][:2] == ["python", "-m"]
