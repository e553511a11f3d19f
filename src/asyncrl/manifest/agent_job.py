"""`asyncrl render-agent-job MANIFEST [--row N]`: the agent Job the operator would create for one row.

A template is debugged before a run by looking at what it becomes. This renders it with the operator's own
code: the same render worker (sandbox, limits, `--agent-pod-policy`), the same variables for a rollout of
that row, and the same shaping (`shape_agent_job`: name, labels, owner, limits, `AGL_*` env), so what it
prints cannot drift from what the operator creates. What only a live run knows is filled in visibly: the
run's uid in the owner reference, and the rollout's token (`AGL_KEY`), derived from the run's gateway key.
Pipe the result to `kubectl create --dry-run=server -f -` to have the API server check it too.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from asyncrl.agent import ENV_KEY
from asyncrl.agent_templates.job_schema import job_schema_problems
from asyncrl.agent_templates.pod_policy import AgentPodPolicy
from asyncrl.agent_templates.render import TemplateError
from asyncrl.agent_templates.renderer import RendererUnavailable, RenderSettings, TemplateRenderer
from asyncrl.api import AsyncTrainingRun, InvalidRunError
from asyncrl.gateway_api.models import RolloutView
from asyncrl.manifest.files import ManifestError, read_manifest
from asyncrl.rollouts import RolloutState
from asyncrl.trainer.data import DataError, load_rows_file
from asyncrl.workloads import names
from asyncrl.workloads.agent_jobs import AgentJobSettings, agent_launch, shape_agent_job
from asyncrl.workloads.children import gateway_service_url, owner_reference

PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"  # the run's uid, known once it is created
PLACEHOLDER_KEY = "<this rollout's token, derived from the run's gateway key>"
DEFAULT_NAMESPACE = "default"


class RenderFailed(ValueError):
    """The Job cannot be rendered; the message is what to tell the user (one line)."""


@dataclass(frozen=True)
class SampleRow:
    """The row a Job is rendered for: a real one (`index`), or none (a placeholder row, as the operator's
    start check uses when the data is not in the manifest)."""

    index: int | None
    value: Any

    @property
    def is_placeholder(self) -> bool:
        return self.index is None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", type=Path, help="an AsyncTrainingRun manifest (YAML)")
    parser.add_argument(
        "--row",
        type=int,
        default=None,
        metavar="N",
        help="render for row N of the data (from 0; default: row 0 when the rows are readable here, else a "
        "placeholder row whose fields render as <name>)",
    )
    parser.add_argument(
        "--namespace", "-n", default=None, help="the run's namespace (default: metadata.namespace or default)"
    )
    parser.add_argument(
        "--template-file",
        type=Path,
        default=None,
        help="the template, for a run whose agents.template is a configMapRef",
    )
    parser.add_argument(
        "--data-file",
        type=Path,
        default=None,
        help="the rows, for a run whose data is a configMapRef (or a data.path not on this machine)",
    )
    parser.add_argument(
        "--agent-pod-policy",
        choices=[str(policy) for policy in AgentPodPolicy],
        default=str(AgentPodPolicy.RESTRICTED),
        help="the operator's --agent-pod-policy (default: %(default)s)",
    )


def template_source(run: AsyncTrainingRun, template_file: Path | None) -> str:
    template = run.spec.agents.template
    if template_file is not None:
        try:
            return template_file.read_text()
        except OSError as error:
            raise RenderFailed(f"cannot read --template-file {template_file}: {error.strerror}") from error
    if template.inline is not None:
        return template.inline
    assert template.config_map_ref is not None
    ref = template.config_map_ref
    raise RenderFailed(
        f"agents.template is the key {ref.key!r} of ConfigMap {ref.name!r}; "
        "pass that file with --template-file"
    )


def sample_row(run: AsyncTrainingRun, *, row: int | None, data_file: Path | None) -> SampleRow:
    """Row `row` of the run's data; row 0 or a placeholder when `row` is None and the rows are not here."""
    rows = _readable_rows(run, data_file=data_file, needed=row is not None)
    if rows is None:
        return SampleRow(index=None, value=None)
    index = 0 if row is None else row
    if not 0 <= index < len(rows):
        raise RenderFailed(
            f"--row {index} is out of range: the data has {len(rows)} rows (0 to {len(rows) - 1})"
        )
    return SampleRow(index=index, value=rows[index])


def _readable_rows(run: AsyncTrainingRun, *, data_file: Path | None, needed: bool) -> list[Any] | None:
    data = run.spec.data
    if data.inline is not None:
        return list(data.inline)
    if data_file is None and data.path is not None and (Path(data.path).exists() or needed):
        data_file = Path(data.path)
    if data_file is None:
        if not needed:
            return None
        raise RenderFailed("--row needs the rows: data is a configMapRef, pass its file with --data-file")
    try:
        return load_rows_file(data_file)
    except DataError as error:
        hint = (
            "; pass a copy with --data-file" if data.path is not None and data_file == Path(data.path) else ""
        )
        raise RenderFailed(f"{error}{hint}") from error


def run_object(manifest: dict[str, Any], run: AsyncTrainingRun, namespace: str) -> dict[str, Any]:
    """The run as the operator reads it from the API server: a namespace and a uid in its metadata."""
    metadata = {**run.metadata, "namespace": namespace, "uid": PLACEHOLDER_UID}
    return {**manifest, "metadata": metadata}


async def render_agent_job(
    manifest: dict[str, Any],
    run: AsyncTrainingRun,
    *,
    template: str,
    row: SampleRow,
    namespace: str,
    settings: RenderSettings,
) -> dict[str, Any]:
    """The agent Job the operator would create for the first rollout of `row`, as the operator builds it."""
    obj = run_object(manifest, run, namespace)
    spec = run.spec
    group_id = f"s0-row{row.index if row.index is not None else 'sample'}"
    rollout = RolloutView(
        rollout_id=f"{group_id}-r0",
        group_id=group_id,
        step=0,
        input={} if row.value is None else row.value,
        mode="train",
        state=RolloutState.QUEUED,
        attempt_id=None,
        timeout_seconds=spec.rollout_timeout_seconds,
        created_at=0.0,
        started_at=None,
        finished_at=None,
        reward=None,
        message=None,
        n_model_calls=0,
    )
    job_name = names.agent_job_name(run.name, rollout.rollout_id)
    launch = agent_launch(
        rollout,
        run_name=run.name,
        namespace=namespace,
        job_name=job_name,
        gateway_url=spec.gateway.agent_url or gateway_service_url(obj, spec),
        gateway_key="unknown",
    )
    renderer = TemplateRenderer(settings)
    try:
        rendered = await renderer.render(template, launch.variables, sample=row.is_placeholder)
    except TemplateError as error:
        raise RenderFailed(str(error)) from error
    except RendererUnavailable as error:
        raise RenderFailed(str(error)) from error
    finally:
        await renderer.close()
    problems = job_schema_problems(rendered, check_scalars=not row.is_placeholder)
    if problems:  # the API server would drop an unknown field, or refuse the Job (422)
        raise RenderFailed("\n".join(f"agent template: {problem}" for problem in problems))
    agent_env = {**launch.env, ENV_KEY: PLACEHOLDER_KEY}
    return shape_agent_job(
        rendered,
        settings=AgentJobSettings(
            run_name=run.name,
            namespace=namespace,
            owner_reference=owner_reference(obj),
            timeout_seconds=int(spec.rollout_timeout_seconds),
            ttl_seconds_after_finished=spec.agents.ttl_seconds_after_finished,
        ),
        rollout_id=rollout.rollout_id,
        group_id=rollout.group_id,
        attempt_id=names.ATTEMPT_ID,
        agent_env=agent_env,
    )


def in_reading_order(job: dict[str, Any]) -> dict[str, Any]:
    """apiVersion, kind, metadata, spec first, as kubectl prints objects (shaping appends metadata)."""
    first = ("apiVersion", "kind", "metadata", "spec")
    return {**{key: job[key] for key in first if key in job}, **job}


def run(args: argparse.Namespace) -> int:
    command = "asyncrl render-agent-job"
    try:
        manifest = read_manifest(args.manifest)
        spec_run = manifest.run()
        if not spec_run.name:
            raise RenderFailed("metadata.name is missing; the operator names the Job after the run")
        template = template_source(spec_run, args.template_file)
        row = sample_row(spec_run, row=args.row, data_file=args.data_file)
        namespace = args.namespace or str(spec_run.metadata.get("namespace") or DEFAULT_NAMESPACE)
        settings = RenderSettings(policy=AgentPodPolicy(args.agent_pod_policy))
        job = asyncio.run(
            render_agent_job(
                manifest.document,
                spec_run,
                template=template,
                row=row,
                namespace=namespace,
                settings=settings,
            )
        )
    except ManifestError as error:
        print(f"{command}: {error}", file=sys.stderr)
        return 1
    except InvalidRunError as error:
        for problem in error.errors:
            print(f"{command}: {args.manifest}: {' '.join(str(problem).split())}", file=sys.stderr)
        return 1
    except RenderFailed as error:
        for line in str(error).splitlines():
            print(f"{command}: {args.manifest}: {line}", file=sys.stderr)
        return 1
    what = f"row {row.index}" if row.index is not None else "a placeholder row (fields render as <name>)"
    print(
        f"# The agent Job the operator would create for the first rollout of {what} of run {spec_run.name!r}."
    )
    print("# Filled in by the live run: metadata.ownerReferences[0].uid, and AGL_KEY.")
    print(yaml.safe_dump(in_reading_order(job), sort_keys=False), end="")
    return 0
