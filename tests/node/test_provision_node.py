"""The node's Kubernetes binaries come from provision-k8s.sh's build (one wrapper module, one version stamp):
asked for by name, built when missing, left alone when present."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from asyncrl.testing.controlplane import REQUIRED_BINARIES
from asyncrl.testing.node import NODE_BINARIES
from tests.support.provisioning import without_go

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "provision-k8s.sh"


def _bin_dir(tmp_path: Path, names: tuple[str, ...]) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in (*names, "helm"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / name).chmod(0o755)
    (bin_dir / ".helm-stamp").write_text("helm (stamped)\n")
    return bin_dir


def test_the_node_binaries_are_built_beside_the_control_plane_when_missing(tmp_path: Path) -> None:
    bin_dir = _bin_dir(tmp_path, REQUIRED_BINARIES)
    env = {
        **without_go(tmp_path),
        "ASYNCRL_K8S_BIN_DIR": str(bin_dir),
        "ASYNCRL_K8S_EXTRA_BINARIES": " ".join(NODE_BINARIES),
    }
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "Go is not installed" in result.stderr


def test_present_node_binaries_are_not_rebuilt(tmp_path: Path) -> None:
    bin_dir = _bin_dir(tmp_path, (*REQUIRED_BINARIES, *NODE_BINARIES))
    env = {
        **os.environ,
        "ASYNCRL_K8S_BIN_DIR": str(bin_dir),
        "ASYNCRL_CACHE_DIR": str(tmp_path / "cache"),
        "ASYNCRL_K8S_EXTRA_BINARIES": " ".join(NODE_BINARIES),
    }
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == str(bin_dir)
    assert "building" not in result.stderr
