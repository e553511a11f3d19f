"""`asyncrl validate MANIFEST...`: would this run be accepted, and would it run?

It checks, without a cluster, what `kubectl apply`, the operator and the trainer check: the schema and the
cross-field rules (the same `load_run` as local mode and the operator, so the same messages); the manifest's
size against `kubectl apply`'s annotation and the run's ConfigMap (`size_limits`); the agent template
rendered for every inline row (not only the first, which is all the operator's start check has), each Job
checked against the Job's OpenAPI schema, label and quantity rules (`agent_templates/job_schema.py`); and
`verlOverrides` against verl's own config where verl is installed (`verl_check`); and one GPU's memory when
vLLM wakes, where the model's config.json is readable here (`memory_check`). One line per problem, each
naming the file and the field, and `note:` lines for what was not checked or is ignored; exit 0 when every
file is valid, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any

from asyncrl.agent_templates.job_schema import job_schema_problems
from asyncrl.agent_templates.pod_policy import AgentPodPolicy
from asyncrl.agent_templates.render import TemplateError, sample_variables
from asyncrl.agent_templates.renderer import RendererUnavailable, RenderSettings, TemplateRenderer
from asyncrl.api import AsyncTrainingRun, InvalidRunError
from asyncrl.manifest.files import ManifestError, read_manifest
from asyncrl.manifest.memory_check import memory_findings
from asyncrl.manifest.size_limits import client_side_apply_problem
from asyncrl.manifest.verl_check import Findings, verl_findings
from asyncrl.workloads import children, names

ROWS_NAMED = 5  # rows named per template problem; the rest are counted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifests", type=Path, nargs="+", metavar="MANIFEST", help="AsyncTrainingRun YAML")
    parser.add_argument(
        "--agent-pod-policy",
        choices=[str(policy) for policy in AgentPodPolicy],
        default=str(AgentPodPolicy.RESTRICTED),
        help="check the agent template against the operator's --agent-pod-policy (default: %(default)s)",
    )
    parser.add_argument(
        "--server-side",
        action="store_true",
        help="the manifest will be applied with `kubectl apply --server-side` (or created): skip the size "
        "limit of client-side apply's last-applied-configuration annotation (256 KiB of annotations)",
    )


def one_line(text: str) -> str:
    return " ".join(text.split())


async def findings_of(path: Path, renderer: TemplateRenderer, *, server_side: bool = False) -> Findings:
    """Every problem of one manifest file as `field: message` lines ([] when it is valid), and notes."""
    try:
        manifest = read_manifest(path)
    except ManifestError as error:
        return Findings(problems=[one_line(error.reason)])
    try:
        run = manifest.run()
    except InvalidRunError as error:
        return Findings(problems=[one_line(str(problem)) for problem in error.errors])
    findings = Findings()
    if not server_side:
        apply_problem = client_side_apply_problem(manifest.document)
        if apply_problem is not None:
            findings.problems.append(f"(whole manifest): {apply_problem}")
    size_error = children.config_map_size_error(
        children.config_map(_as_stored(manifest.document, run), run.spec.agents.template.inline)
    )
    if size_error is not None:
        findings.problems.append(f"spec: {size_error}")
    run_findings = await run_problems(run, renderer)
    memory = memory_findings(run)
    findings.problems.extend(run_findings.problems + memory.problems)
    findings.notes.extend(run_findings.notes + memory.notes)
    return findings


async def run_problems(run: AsyncTrainingRun, renderer: TemplateRenderer) -> Findings:
    """What would stop the run wherever it runs (local mode checks these before it starts anything): the
    agent template for every inline row, and `verlOverrides` against verl's config."""
    findings = Findings(problems=await _template_problems(run, renderer))
    verl = verl_findings(run)
    findings.problems.extend(verl.problems)
    findings.notes.extend(verl.notes)
    return findings


def _as_stored(document: dict[str, Any], run: AsyncTrainingRun) -> dict[str, Any]:
    """The run as the API server would hand it to the operator (a namespace and a uid are set)."""
    metadata = {"namespace": "default", "uid": "0", **run.metadata}
    return {**document, "metadata": metadata}


async def _template_problems(run: AsyncTrainingRun, renderer: TemplateRenderer) -> list[str]:
    """The agent template rendered for every inline row (a placeholder row without inline rows)."""
    template = run.spec.agents.template.inline
    if template is None:
        return []  # in a ConfigMap: `asyncrl render-agent-job --template-file` checks it
    rows: list[Any] | None = run.spec.data.inline
    name = run.name or "run"
    namespace = str(run.metadata.get("namespace") or "default")
    job_name = names.agent_job_name(name, "sample")

    async def problems_for(row: Any | None) -> list[str]:
        variables = sample_variables(
            row, run_name=name, namespace=namespace, job_name=job_name, attempt_id=names.ATTEMPT_ID
        )
        try:
            job = await renderer.render(template, variables, sample=row is None)
        except TemplateError as error:
            if row is None and error.row_dependent:
                return []  # a name the real rows may hold: not knowable without them
            return [one_line(str(error))]
        return [
            f"agent template: {problem}"
            for problem in job_schema_problems(job, check_scalars=row is not None)
        ]

    if rows is None:
        return [f"spec.agents.template: {problem}" for problem in await problems_for(None)]
    per_row = await asyncio.gather(*(problems_for(row) for row in rows))
    rows_of: dict[str, list[int]] = defaultdict(list)
    for index, problems in enumerate(per_row):
        for problem in problems:
            rows_of[problem].append(index)
    return [
        f"spec.agents.template: {problem} ({_rows_text(indices, len(rows))})"
        for problem, indices in rows_of.items()
    ]


def _rows_text(indices: list[int], total: int) -> str:
    if len(indices) == total > 1:
        return f"all {total} rows of spec.data.inline"
    named = ", ".join(str(index) for index in indices[:ROWS_NAMED])
    more = f" and {len(indices) - ROWS_NAMED} more" if len(indices) > ROWS_NAMED else ""
    return f"spec.data.inline row{'s' if len(indices) > 1 else ''} {named}{more}"


async def validate(
    paths: list[Path], settings: RenderSettings, *, server_side: bool = False
) -> dict[Path, Findings]:
    renderer = TemplateRenderer(settings)
    try:
        return {path: await findings_of(path, renderer, server_side=server_side) for path in paths}
    finally:
        await renderer.close()


def run(args: argparse.Namespace) -> int:
    settings = RenderSettings(policy=AgentPodPolicy(args.agent_pod_policy))
    try:
        results = asyncio.run(validate(args.manifests, settings, server_side=args.server_side))
    except RendererUnavailable as error:
        print(f"asyncrl validate: {error}")
        return 2
    for path, findings in results.items():
        if not findings.problems:
            print(f"{path}: valid")
        for problem in findings.problems:
            print(f"{path}: {problem}")
        for note in findings.notes:
            print(f"{path}: note: {note}")
    return 1 if any(findings.problems for findings in results.values()) else 0
