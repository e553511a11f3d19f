"""`asyncrl validate MANIFEST...`: would this run be accepted, and would the operator start it?

It checks, without a cluster, what `kubectl apply` and the operator check: the schema and the cross-field
rules (the same `load_run` as local mode and the operator, so the same messages), then what the operator
refuses before creating anything (a spec and inline template larger than a ConfigMap holds) and the agent
template rendered for the first inline row, as the operator's start check does. One line per problem, each
naming the file and the field; exit 0 when every file is valid, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from asyncrl.api import AsyncTrainingRun, InvalidRunError
from asyncrl.manifest.files import ManifestError, read_manifest
from asyncrl.operator import children, names
from asyncrl.operator.pod_policy import AgentPodPolicy
from asyncrl.operator.renderer import RendererUnavailable, RenderSettings, TemplateRenderer, check_template


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifests", type=Path, nargs="+", metavar="MANIFEST", help="AsyncTrainingRun YAML")
    parser.add_argument(
        "--agent-pod-policy",
        choices=[str(policy) for policy in AgentPodPolicy],
        default=str(AgentPodPolicy.RESTRICTED),
        help="check the agent template against the operator's --agent-pod-policy (default: %(default)s)",
    )


def one_line(text: str) -> str:
    return " ".join(text.split())


async def problems_of(path: Path, renderer: TemplateRenderer) -> list[str]:
    """Every problem of one manifest file as `field: message` lines ([] when it is valid)."""
    try:
        manifest = read_manifest(path)
    except ManifestError as error:
        return [one_line(error.reason)]
    try:
        run = manifest.run()
    except InvalidRunError as error:
        return [one_line(str(problem)) for problem in error.errors]
    problems = []
    size_error = children.config_map_size_error(
        children.config_map(_as_stored(manifest.document, run), run.spec.agents.template.inline)
    )
    if size_error is not None:
        problems.append(f"spec: {size_error}")
    template_problem = await _template_problem(run, renderer)
    if template_problem is not None:
        problems.append(f"spec.agents.template: {one_line(template_problem)}")
    return problems


def _as_stored(document: dict[str, Any], run: AsyncTrainingRun) -> dict[str, Any]:
    """The run as the API server would hand it to the operator (a namespace and a uid are set)."""
    metadata = {"namespace": "default", "uid": "0", **run.metadata}
    return {**document, "metadata": metadata}


async def _template_problem(run: AsyncTrainingRun, renderer: TemplateRenderer) -> str | None:
    template = run.spec.agents.template.inline
    if template is None:
        return None  # in a ConfigMap: `asyncrl render-agent-job --template-file` checks it
    rows = run.spec.data.inline
    name = run.name or "run"
    return await check_template(
        renderer,
        template,
        first_row=rows[0] if rows else None,
        run_name=name,
        namespace=str(run.metadata.get("namespace") or "default"),
        job_name=names.agent_job_name(name, "sample"),
        attempt_id=names.ATTEMPT_ID,
    )


async def validate(paths: list[Path], settings: RenderSettings) -> dict[Path, list[str]]:
    renderer = TemplateRenderer(settings)
    try:
        return {path: await problems_of(path, renderer) for path in paths}
    finally:
        await renderer.close()


def run(args: argparse.Namespace) -> int:
    settings = RenderSettings(policy=AgentPodPolicy(args.agent_pod_policy))
    try:
        results = asyncio.run(validate(args.manifests, settings))
    except RendererUnavailable as error:
        print(f"asyncrl validate: {error}")
        return 2
    for path, problems in results.items():
        if not problems:
            print(f"{path}: valid")
        for problem in problems:
            print(f"{path}: {problem}")
    return 1 if any(results.values()) else 0
