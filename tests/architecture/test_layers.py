"""The import layers of [tool.importlinter] hold, and a violation of each kind breaks `lint-imports`.

`make lint` runs `lint-imports`; these tests run it too, on the tree as it is and on a copy of the package
with one forbidden import added, so a contract that stopped catching anything (a typo in a module name, a
wildcard that matches nothing) fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


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


@pytest.mark.parametrize(
    ("module", "forbidden_import", "contract"),
    [
        ("api/types/status.py", "asyncrl.trainer.window", "The API types (asyncrl.api) import only"),
        ("rollouts.py", "asyncrl.api", "The shared vocabulary is a leaf"),
        ("operator/status.py", "asyncrl.trainer.window", "The operator and the trainer never import"),
        ("trainer/window.py", "asyncrl.operator.names", "The operator and the trainer never import"),
        ("local/run.py", "asyncrl.testing.controlplane", "Nothing outside the tests imports the test"),
        ("gateway/pause.py", "asyncrl.gateway.client", "The gateway imports no client of itself"),
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


def test_every_top_level_module_is_named_by_the_harness_contract() -> None:
    """The contracts list modules by name: a new top-level module left off them would be checked by none."""
    import pkgutil
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    harness = next(c for c in config if c["name"].startswith("Nothing outside the tests imports"))
    listed = set(harness["source_modules"])
    modules = {f"asyncrl.{m.name}" for m in pkgutil.iter_modules([str(ROOT / "src" / "asyncrl")])}
    unlisted = modules - listed - {"asyncrl.testing"}
    assert not unlisted, f"add {sorted(unlisted)} to the [tool.importlinter] contracts in pyproject.toml"
