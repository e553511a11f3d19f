"""The import layers of [tool.importlinter] hold, and a violation of each kind breaks `lint-imports`.

`make lint` runs `lint-imports`; these tests run it too, on the tree as it is and on a copy of the package
with one forbidden import (or a circle, or a module no layer names) added, so a contract that stopped catching
anything (a typo in a module name, a wildcard that matches nothing) fails here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _lint_imports(package_parent: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(package_parent)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_tree_keeps_every_layer_contract() -> None:
    result = _lint_imports(ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


LAYERS = "The layers of the package"
OPERATOR_LAYERS = "The operator's layers"


@pytest.mark.parametrize(
    ("module", "forbidden_import", "contract"),
    [
        ("api/types/status.py", "asyncrl.trainer.window", LAYERS),  # the API types sit under the components
        ("api/types/spec.py", "asyncrl.gateway_api.models", LAYERS),  # ... and under the wire contract
        ("rollouts.py", "asyncrl.api", LAYERS),  # the shared vocabulary is a leaf
        ("rollouts.py", "asyncrl.pause_modes", LAYERS),  # ... whose modules import no other
        ("operator/kube.py", "asyncrl.trainer.window", LAYERS),  # the operator and the trainer never
        ("trainer/window.py", "asyncrl.operator.kube", LAYERS),  # import each other
        ("launch/commands.py", "asyncrl.workloads.names", LAYERS),  # launch is under both modes
        ("gateway/pause_state.py", "asyncrl.trainer.window", LAYERS),  # the gateway is a component too
        ("gateway_api/models.py", "asyncrl.agent", LAYERS),  # the wire contract is under its callers
        ("workloads/names.py", "asyncrl.manifest.validate", LAYERS),  # a component imports no check or CLI
        ("workloads/children.py", "asyncrl.operator.kube", LAYERS),  # the builders are under the operator
        ("agent_templates/render.py", "asyncrl.workloads.names", LAYERS),  # ... and the templates under them
        # Inside the operator: the reconcile and the dispatcher never import each other, what they share
        # (run_link) neither of them, the plumbing none of them.
        ("operator/reconciliation/status.py", "asyncrl.operator.dispatcher.ratelimit", OPERATOR_LAYERS),
        ("operator/dispatcher/ratelimit.py", "asyncrl.operator.reconciliation.status", OPERATOR_LAYERS),
        ("operator/run_link/run_context.py", "asyncrl.operator.reconciliation.status", OPERATOR_LAYERS),
        ("operator/kube.py", "asyncrl.operator.reconciliation.child_index", OPERATOR_LAYERS),
        ("operator/dispatcher/ratelimit.py", "asyncrl.operator.handlers", OPERATOR_LAYERS),
        ("local/run.py", "asyncrl.testing.controlplane", "Nothing outside the tests imports the test"),
        ("gateway/pause_state.py", "asyncrl.gateway_api.client", "The gateway imports no client of itself"),
        # The server's callers reach it only through the wire contract, even from above its layer.
        ("local/run.py", "asyncrl.gateway.store", "The gateway's callers import its wire contract"),
        ("agent_pool.py", "asyncrl.gateway.admission", "The gateway's callers import its wire contract"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(
    tmp_path: Path, module: str, forbidden_import: str, contract: str
) -> None:
    shutil.copytree(ROOT / "src" / "asyncrl", tmp_path / "asyncrl")
    path = tmp_path / "asyncrl" / module
    path.write_text(path.read_text() + f"\nimport {forbidden_import}  # a deliberate layer violation\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken, result.stdout
    assert forbidden_import in broken, result.stdout


@pytest.mark.parametrize(
    ("module", "circular_import", "package"),
    [
        # Each closes a circle: types.run imports schema, preflight the backends, the reconciler kube and
        # status.
        ("api/schema.py", "asyncrl.api.types.run", "asyncrl.api"),
        ("trainer/backends/__init__.py", "asyncrl.trainer.preflight", "asyncrl.trainer"),
        ("operator/kube.py", "asyncrl.operator.reconciliation.reconciler", "asyncrl.operator"),
        (
            "operator/reconciliation/status.py",
            "asyncrl.operator.reconciliation.reconciler",
            "asyncrl.operator.reconciliation",
        ),
    ],
)
def test_an_import_circle_breaks_the_acyclic_contract(
    tmp_path: Path, module: str, circular_import: str, package: str
) -> None:
    """The contract names the package whose modules import each other both ways (not always the new line)."""
    shutil.copytree(ROOT / "src" / "asyncrl", tmp_path / "asyncrl")
    path = tmp_path / "asyncrl" / module
    path.write_text(path.read_text() + f"\nimport {circular_import}  # a deliberate import circle\n")
    result = _lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert "No import circles" in broken, result.stdout
    assert f"No cycles are allowed in {package}." in broken, result.stdout


def test_a_top_level_module_without_a_layer_breaks_the_layers(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "src" / "asyncrl", tmp_path / "asyncrl")
    (tmp_path / "asyncrl" / "unlayered.py").write_text('"""A new module no layer names."""\n')
    result = _lint_imports(tmp_path)
    assert result.returncode != 0, result.stdout
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert LAYERS in broken, result.stdout
    assert "asyncrl.unlayered" in broken, result.stdout


def _contracts() -> list[dict[str, Any]]:
    contracts: list[dict[str, Any]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "importlinter"
    ]["contracts"]
    return contracts


def _section(title: str) -> str:
    text = ARCHITECTURE.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


@pytest.mark.parametrize(
    ("container", "title"), [("asyncrl", "The layers"), ("asyncrl.operator", "Inside the operator")]
)
def test_the_architecture_doc_shows_the_contracts_layers(container: str, title: str) -> None:
    layers = next(c for c in _contracts() if c["type"] == "layers" and c["containers"] == [container])[
        "layers"
    ]
    block = re.search(r"```text\n(.*?)```", _section(title), re.DOTALL)
    assert block is not None, f"docs/architecture.md: no ```text block under '## {title}'"
    assert block.group(1).splitlines() == layers, (
        f"docs/architecture.md, '## {title}': write the contract's layers:\n" + "\n".join(layers)
    )


def test_the_architecture_doc_lists_every_import_between_packages() -> None:
    graph = grimp.build_graph("asyncrl", include_external_packages=False, cache_dir=None)
    imports: dict[str, set[str]] = defaultdict(set)
    for module in graph.modules:
        importer = module.split(".")[1] if "." in module else None
        for imported_module in graph.find_modules_directly_imported_by(module):
            imported = imported_module.split(".")[1] if "." in imported_module else None
            if importer and imported and importer != imported:
                imports[importer].add(imported)
    rows = [
        f"| `{name}` | {', '.join(f'`{i}`' for i in sorted(imports[name]))} |" for name in sorted(imports)
    ]
    written = [line for line in _section("The arrows").splitlines() if re.match(r"\| `\w+` \|", line)]
    assert written == rows, "docs/architecture.md, '## The arrows': write these rows\n" + "\n".join(rows)


def test_every_top_level_module_is_named_by_the_harness_contract() -> None:
    """The contracts list modules by name: a new top-level module left off them would be checked by none."""
    import pkgutil

    harness = next(c for c in _contracts() if c["name"].startswith("Nothing outside the tests imports"))
    listed = set(harness["source_modules"])
    modules = {f"asyncrl.{m.name}" for m in pkgutil.iter_modules([str(ROOT / "src" / "asyncrl")])}
    unlisted = modules - listed - {"asyncrl.testing"}
    assert not unlisted, f"add {sorted(unlisted)} to the [tool.importlinter] contracts in pyproject.toml"
