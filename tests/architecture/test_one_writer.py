"""One writer: only the reconciliation (`asyncrl.operator.reconciliation`) writes a run's status, posts its
phase events and creates its children (issue 38).

An AST check of every module of the package: a call of a status write, of a child's creation or of a phase
event anywhere else fails. The run's children are its key Secret, ConfigMap, Service, trainer Job or
RayCluster, and a Pool run's Secret and Deployment: created through `Kube.create_or_get` / `create_custom` and
the creators of `reconciliation/children_io.py`. Agent Jobs are not children in this sense: the dispatcher
creates one per rollout, through the Kube method that creates nothing else (`Kube.create_job`), which is why
that one is allowed everywhere. The check is shown to fail on a copy of the package with a writer planted.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "asyncrl"
RECONCILIATION = Path("operator") / "reconciliation"

STATUS_WRITERS = frozenset({"patch_run_status", "write_status"})
CHILD_CREATORS = frozenset(
    {
        "create_or_get",
        "create_custom",
        "create_child",
        "create_children",
        "create_trainer",
        "create_ray_cluster",
    }
)
WRITERS = STATUS_WRITERS | CHILD_CREATORS


def _called_name(call: ast.Call) -> str | None:
    function = call.func
    if isinstance(function, ast.Attribute):
        return function.attr
    if isinstance(function, ast.Name):
        return function.id
    return None


def _posts_a_phase_event(call: ast.Call) -> bool:
    """`post_event(..., reason="Phase...")` (a literal or an f-string that starts so)."""
    reason = next((keyword.value for keyword in call.keywords if keyword.arg == "reason"), None)
    if isinstance(reason, ast.JoinedStr) and reason.values:
        reason = reason.values[0]
    return isinstance(reason, ast.Constant) and str(reason.value).startswith("Phase")


def writers_outside_the_reconciliation(package: Path) -> list[str]:
    """`path:line: name` of every status write, child creation or phase event outside the reconciliation."""
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.is_relative_to(RECONCILIATION):
            continue
        if relative == Path("operator") / "kube.py":  # where the calls are defined, not made
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call):
                continue
            name = _called_name(node)
            if name in WRITERS or (name == "post_event" and _posts_a_phase_event(node)):
                found.append(f"{relative}:{node.lineno}: {name}")
    return found


def test_only_the_reconciliation_writes_a_runs_status_or_creates_its_children() -> None:
    assert writers_outside_the_reconciliation(PACKAGE) == []


def test_agent_jobs_have_a_kube_method_of_their_own() -> None:
    """The dispatcher's agent Jobs go through `create_job`, never through the children's `create_or_get`."""
    kube = ast.parse((PACKAGE / "operator" / "kube.py").read_text())
    methods = {node.name for node in ast.walk(kube) if isinstance(node, ast.AsyncFunctionDef)}
    assert {"create_job", "create_or_get", "patch_run_status"} <= methods


@pytest.mark.parametrize(
    ("module", "planted", "name"),
    [
        (
            "operator/dispatcher/controller.py",
            "async def _planted(kube):\n    await kube.patch_run_status('ns', 'run', {'phase': 'Failed'})\n",
            "patch_run_status",
        ),
        (
            "operator/dispatcher/pool_keeper.py",
            "async def _planted(kube, body):\n    await kube.create_or_get(body)\n",
            "create_or_get",
        ),
        (
            "operator/handlers.py",
            "async def _planted(kube, run, spec):\n    await children_io.create_trainer(kube, run, spec)\n",
            "create_trainer",
        ),
        (
            "operator/run_supervisor.py",
            "async def _planted(kube, run):\n"
            "    await kube.post_event(run, reason=f'Phase{1}', message='x')\n",
            "post_event",
        ),
    ],
)
def test_a_writer_planted_outside_the_reconciliation_is_found(
    tmp_path: Path, module: str, planted: str, name: str
) -> None:
    shutil.copytree(PACKAGE, tmp_path / "asyncrl")
    path = tmp_path / "asyncrl" / module
    path.write_text(path.read_text() + "\n\n" + planted)
    found = writers_outside_the_reconciliation(tmp_path / "asyncrl")
    assert len(found) == 1, found
    assert found[0].startswith(f"{module}:"), found
    assert found[0].endswith(f": {name}"), found
