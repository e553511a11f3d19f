"""The wheel users install: the package and what the docs tell users to run, without the test harness.

Built from a copy of this checkout's sources (a build in the checkout itself would reuse a stale `build/`)
with the project's own build backend (pip, no build isolation: the venv's setuptools, nothing downloaded),
then read as the zip it is.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IMPORTS_HARNESS = re.compile(
    rb"^\s*(from\s+asyncrl\.testing\b|import\s+asyncrl\.testing\b|from\s+asyncrl\s+import\s+testing\b)", re.M
)


@pytest.mark.slow
def test_the_wheel_leaves_out_the_test_harness_and_keeps_what_the_docs_run(tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    out = tmp_path / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(source),
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = out.glob("asyncrl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not [name for name in names if name.startswith("asyncrl/testing/")]
    for kept in (
        "asyncrl/fake_upstream.py",  # docs/writing-an-agent.md: python -m asyncrl.fake_upstream
        "asyncrl/cli.py",
        "asyncrl/gateway/app.py",
        "asyncrl/operator/main.py",
        "asyncrl/trainer/main.py",
        "asyncrl/py.typed",
    ):
        assert kept in names, kept
    # Nothing the wheel holds imports the harness (lint-imports checks the source; this checks the files).
    sources = [name for name in names if name.endswith(".py")]
    with zipfile.ZipFile(wheel) as archive:
        importing = [name for name in sources if IMPORTS_HARNESS.search(archive.read(name))]
    assert importing == []
