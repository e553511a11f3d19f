"""What `asyncrl local run` checks before it starts anything.

The same checks as `asyncrl validate` (the agent template rendered for every inline row, `verlOverrides`
against verl's config), with the pod policy left out (local mode runs the agent's command, not a pod), and
one that only local mode can make: the agent's command exists on this machine. Before, an agent command that
does not exist passed `validate`, and `local run` failed 72 rollouts and exited 79 after 14 s without saying
why anywhere; a template error on every row printed 76 ERROR lines before exiting.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from asyncrl.agent_templates.pod_policy import AgentPodPolicy
from asyncrl.agent_templates.render import TemplateError, render_job, sample_variables
from asyncrl.agent_templates.renderer import RenderSettings, TemplateRenderer
from asyncrl.api import AsyncTrainingRun
from asyncrl.local.agents import agent_command, agent_path
from asyncrl.manifest.validate import run_problems
from asyncrl.workloads.names import ATTEMPT_ID

TEMPLATE_FIELD = "spec.agents.template"


async def preflight_problems(run: AsyncTrainingRun, template: str) -> list[str]:
    """Every reason the run would fail as soon as it starts, one line each (empty: start it)."""
    renderer = TemplateRenderer(RenderSettings(policy=AgentPodPolicy.UNRESTRICTED))
    try:
        findings = await run_problems(run, renderer)
    finally:
        await renderer.close()
    if findings.problems:
        return findings.problems  # the commands are only known from a template that renders
    return command_problems(run, template)


def command_problems(run: AsyncTrainingRun, template: str) -> list[str]:
    """The agent's command, as each inline row renders it (a placeholder row without them), must be an
    executable found where the agent process will look: its PATH, or the path given."""
    rows: list[Any] = list(run.spec.data.inline) if run.spec.data.inline else [None]
    name = run.name or "run"
    problems: list[str] = []
    checked: set[str] = set()
    for row in rows:
        variables = sample_variables(
            row, run_name=name, namespace="local", job_name=f"{name}-sample", attempt_id=ATTEMPT_ID
        )
        try:
            argv, env = agent_command(render_job(template, variables, sample=row is None), {})
        except TemplateError as error:
            if row is None and error.row_dependent:
                continue
            return [f"{TEMPLATE_FIELD}: {error}"]
        if argv[0] in checked:
            continue
        checked.add(argv[0])
        missing = missing_executable(argv[0], agent_path(env))
        if missing is not None:
            problems.append(f"{TEMPLATE_FIELD}: the agent's command {argv[0]!r} {missing}")
    return problems


def missing_executable(command: str, path: str) -> str | None:
    """Why `command` cannot be run (None when it can): a path that is not an executable file, or a name
    that no directory of `path` holds."""
    if os.sep in command:
        target = Path(command)
        if not target.is_file():
            return "does not exist (local mode runs the container's command on this machine)"
        if not os.access(target, os.X_OK):
            return "is not executable"
        return None
    if shutil.which(command, path=path) is None:
        return (
            "is not found on the agents' PATH (local mode runs the container's command on this machine; "
            f"PATH: {path})"
        )
    return None
