"""A template rendered for one row and shaped into an agent Job, as the operator does for a rollout."""

from __future__ import annotations

from typing import Any

from asyncrl.agent_templates.render import render_job, template_variables
from asyncrl.workloads.agent_jobs import AgentJobSettings, shape_agent_job


def shaped_agent_container(
    template: str, row: dict[str, Any], *, run: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """The agent container of rollout r-1's Job (run `run` in namespace team) and its env, by name."""
    variables = template_variables(
        row,
        rollout={"id": "r-1", "group_id": "g-1", "step": 0, "attempt_id": "a1", "mode": "train"},
        job_name=f"{run}-r-1",
        run={"name": run, "namespace": "team"},
    )
    settings = AgentJobSettings(
        run_name=run,
        namespace="team",
        owner_reference={
            "apiVersion": "asyncrl.dev/v1alpha1",
            "kind": "AsyncTrainingRun",
            "name": run,
            "uid": "u",
        },
        timeout_seconds=1800,
        ttl_seconds_after_finished=1200,
    )
    shaped = shape_agent_job(
        render_job(template, variables),
        settings=settings,
        rollout_id="r-1",
        group_id="g-1",
        attempt_id="a1",
        agent_env={"AGL_KEY": "k"},
    )
    (container,) = shaped["spec"]["template"]["spec"]["containers"]
    return container, {entry["name"]: entry["value"] for entry in container["env"]}
