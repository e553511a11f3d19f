"""scripts/provision-kuberay.sh: a second run does nothing, a half-filled cache is rebuilt, no Go is named."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "provision-kuberay.sh"


def _provisioned(cache: Path, *, crds: bool = True) -> Path:
    kuberay = cache / "kuberay" / "v1.5.0"
    (kuberay / "bin").mkdir(parents=True)
    binary = kuberay / "bin" / "ray-operator"
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    if crds:
        (kuberay / "crds").mkdir()
        (kuberay / "crds" / "ray.io_rayclusters.yaml").write_text("kind: CustomResourceDefinition\n")
    return kuberay


def _without_go(tmp_path: Path) -> dict[str, str]:
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("bash", "mkdir", "date", "sed", "printf", "cat"):
        found = shutil.which(tool)
        if found:
            (tools / tool).symlink_to(found)
    return {"PATH": str(tools), "HOME": str(tmp_path), "ASYNCRL_CACHE_DIR": str(tmp_path / "cache")}


def test_a_second_run_finds_the_binary_and_the_crds_and_builds_nothing(tmp_path: Path) -> None:
    kuberay = _provisioned(tmp_path / "cache")
    env = {**_without_go(tmp_path), "PATH": os.environ["PATH"]}
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == str(kuberay)
    assert "present" in result.stderr
    assert "building" not in result.stderr


def test_a_binary_without_its_crds_is_not_trusted(tmp_path: Path) -> None:
    _provisioned(tmp_path / "cache", crds=False)
    env = _without_go(tmp_path)  # the rebuild it attempts fails on the missing Go, saying so
    result = subprocess.run(
        [env["PATH"] + "/bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "Go is not installed" in result.stderr
