"""Generate the AsyncTrainingRun CustomResourceDefinition from the API types.

The pydantic models in `asyncrl.api.types` are the single source of the API; the YAML in `crds/` is their
rendering for the API server, committed so that `kubectl apply -f crds/` and the Helm chart need no Python.
The field reference in docs/crd-reference.md is rendered from the same object. A test fails when a committed
file differs from what this module generates, so neither can drift from the types.

    python -m asyncrl.api.crd            # print the CRD
    python -m asyncrl.api.crd --write    # regenerate crds/asynctrainingruns.asyncrl.dev.yaml and the docs
    python -m asyncrl.api.crd --check    # exit 1 when either committed file is stale
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from asyncrl.api.docs import render_reference
from asyncrl.api.schema import structural_schema
from asyncrl.api.types import meta
from asyncrl.api.types.meta import VALIDATIONS_KEY
from asyncrl.api.types.rules import RUN_NAME_RULE
from asyncrl.api.types.spec import AsyncTrainingRunSpec
from asyncrl.api.types.status import AsyncTrainingRunStatus

REGENERATE_COMMAND = "python -m asyncrl.api.crd --write"
CRD_FILE_NAME = f"{meta.CRD_NAME}.yaml"
HEADER = (
    "# Generated from the pydantic API types in src/asyncrl/api/types/ by asyncrl.api.crd; do not edit.\n"
    f"# Regenerate with: {REGENERATE_COMMAND}\n"
)


def _column(name: str, type_: str, json_path: str, description: str, *, wide: bool = False) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": type_, "jsonPath": json_path, "description": description}
    if wide:
        column["priority"] = 1  # shown by `kubectl get -o wide` only
    return column


PRINTER_COLUMNS = (
    _column("Phase", "string", ".status.phase", "Where the run is in its life."),
    _column("Steps", "string", ".status.progress", "Updates done, of totalSteps (counted from 1)."),
    _column("Reward", "number", ".status.reward.last", "Mean reward of the last update's rows."),
    _column("Best", "number", ".status.reward.best", "Highest update reward so far.", wide=True),
    _column("Active", "integer", ".status.activeGroups", "Prompt groups in the window."),
    _column(
        "Carry-Over", "integer", ".status.newCarryOverRollouts", "Rollouts the last update carried over."
    ),
    _column(
        "Max-Age", "integer", ".status.carryOverAgeMaxSteps", "Oldest carried-over group's age in updates."
    ),
    _column("Drain", "number", ".status.proxyDrainSeconds", "Seconds the last pause took to drain."),
    _column("Succeeded", "integer", ".status.rollouts.succeeded", "Rollouts that succeeded.", wide=True),
    _column("Failed", "integer", ".status.rollouts.failed", "Rollouts that failed.", wide=True),
    _column("Jobs", "integer", ".status.jobs.active", "Agent Jobs not finished.", wide=True),
    _column("Age", "date", ".metadata.creationTimestamp", "Time since the run was created."),
)


def openapi_schema() -> dict[str, Any]:
    """The version's openAPIV3Schema: standard object fields plus the generated spec and status."""
    return {
        "type": "object",
        "description": "An asynchronous RL training run of an LLM agent: one trainer pod with a gateway "
        "sidecar, one agent Job per rollout, progress in the status.",
        "required": ["spec"],
        VALIDATIONS_KEY: [RUN_NAME_RULE.schema()],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion of this object: asyncrl.dev/v1alpha1.",
            },
            "kind": {"type": "string", "description": "Kind of this object: AsyncTrainingRun."},
            "metadata": {"type": "object"},
            "spec": structural_schema(AsyncTrainingRunSpec),
            "status": structural_schema(AsyncTrainingRunStatus),
        },
    }


def crd() -> dict[str, Any]:
    """The CustomResourceDefinition object (apiextensions.k8s.io/v1)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": meta.CRD_NAME},
        "spec": {
            "group": meta.GROUP,
            "names": {
                "kind": meta.KIND,
                "listKind": meta.LIST_KIND,
                "plural": meta.PLURAL,
                "singular": meta.SINGULAR,
                "shortNames": list(meta.SHORT_NAMES),
                "categories": list(meta.CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": meta.VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": list(PRINTER_COLUMNS),
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


class _Yaml11SafeDumper(yaml.SafeDumper):
    """Quotes `y`, `n` and friends, which kubectl and Helm (YAML 1.1) would read as booleans.

    No field is named like that any more (`rollout.n` became `rollout.samplesPerPrompt`); any such scalar the
    generated YAML holds is still quoted, so that kubectl reads the CRD as written.
    """


_Yaml11SafeDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))


def _represent_text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    """Multi-line text (the long CEL message expression) as a literal block, so it reads as written."""
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_Yaml11SafeDumper.add_representer(str, _represent_text)


def render() -> str:
    """The CRD as committed: a header, then YAML with sorted keys (stable across runs and Python versions)."""
    body = yaml.dump(
        crd(),
        Dumper=_Yaml11SafeDumper,
        sort_keys=True,
        width=4096,
        allow_unicode=True,
        default_flow_style=False,
    )
    return HEADER + body


def _repository() -> Path:
    """The source checkout this module was imported from (src/asyncrl/api/crd.py -> the repository)."""
    return Path(__file__).resolve().parents[3]


def default_path() -> Path:
    """crds/ of the source checkout."""
    return _repository() / "crds" / CRD_FILE_NAME


def chart_crd_path() -> Path:
    """The Helm chart's copy of the CRD (Helm installs charts/<chart>/crds/ before the templates)."""
    return _repository() / "charts" / "asyncrl-operator" / "crds" / CRD_FILE_NAME


def default_docs_path() -> Path:
    return _repository() / "docs" / "crd-reference.md"


def render_docs() -> str:
    return render_reference(crd())


def check(path: Path, generated: str | None = None) -> list[str]:
    """Diff lines from the file at `path` to the generated text (the CRD by default); [] when equal."""
    committed = path.read_text() if path.exists() else ""
    generated = render() if generated is None else generated
    if committed == generated:
        return []
    return list(
        difflib.unified_diff(
            committed.splitlines(keepends=True),
            generated.splitlines(keepends=True),
            fromfile=f"{path} (committed)",
            tofile=f"{path} (generated)",
        )
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    action = parser.add_mutually_exclusive_group()
    action.add_argument(
        "--write", action="store_true", help="write the CRD file, the chart's copy and the field reference"
    )
    action.add_argument("--check", action="store_true", help="exit 1 when either file is not up to date")
    parser.add_argument("--path", type=Path, default=None, help=f"CRD file (default: crds/{CRD_FILE_NAME})")
    parser.add_argument(
        "--docs-path", type=Path, default=None, help="field reference (default: docs/crd-reference.md)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m asyncrl.api.crd", description="Generate the AsyncTrainingRun CRD from the API types."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    crd_text = render()
    outputs = {args.path or default_path(): crd_text, args.docs_path or default_docs_path(): render_docs()}
    if args.path is None:  # the chart's copy follows the repository's
        outputs[chart_crd_path()] = crd_text
    if args.write:
        for path, text in outputs.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    if args.check:
        stale = 0
        for path, text in outputs.items():
            diff = check(path, text)
            if not diff:
                print(f"{path} is up to date")
                continue
            stale += 1
            sys.stdout.writelines(diff[:200])
            if len(diff) > 200:
                print(f"... ({len(diff) - 200} more diff lines)")
            print(f"{path} differs from the API types", file=sys.stderr)
        if stale:
            print(f"regenerate with: {REGENERATE_COMMAND}", file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
