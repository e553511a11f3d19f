"""scripts/provision-kueue.sh: a second run does nothing; a binary without CRDs is rebuilt (no Go: named)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.provisioning import provisioned, without_go

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "provision-kueue.sh"


def _provisioned(cache: Path, *, crds: bool = True) -> Path:
    return provisioned(
        cache / "kueue" / "v0.17.0", binary="kueue", crd="kueue.x-k8s.io_workloads.yaml" if crds else None
    )


def test_a_second_run_finds_the_binary_and_the_crds_and_builds_nothing(tmp_path: Path) -> None:
    kueue = _provisioned(tmp_path / "cache")
    env = {**without_go(tmp_path), "PATH": os.environ["PATH"]}
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == str(kueue)
    assert "present" in result.stderr
    assert "building" not in result.stderr


def test_a_binary_without_its_crds_is_rebuilt_and_a_missing_go_is_named(tmp_path: Path) -> None:
    _provisioned(tmp_path / "cache", crds=False)
    env = without_go(tmp_path)
    result = subprocess.run(
        [env["PATH"] + "/bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 1
    assert "Go is not installed" in result.stderr
