"""Failures to provision or start the control plane say what is missing and show the component's log."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from asyncrl.testing.controlplane import REQUIRED_BINARIES, ControlPlane, ControlPlaneError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "provision-k8s.sh"


def _stub(path: Path, body: str) -> None:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def test_missing_binaries_are_named_with_the_provisioning_hint(tmp_path: Path) -> None:
    _stub(tmp_path / "etcd", "exit 0")
    with pytest.raises(ControlPlaneError) as error:
        ControlPlane(bin_dir=tmp_path).start()
    message = str(error.value)
    assert "kube-apiserver, kube-controller-manager, kubectl" in message
    assert "scripts/provision-k8s.sh" in message


def test_a_component_that_dies_at_start_reports_the_tail_of_its_log(tmp_path: Path) -> None:
    for name in REQUIRED_BINARIES:
        _stub(tmp_path / name, "exit 0")
    _stub(tmp_path / "etcd", "echo 'etcd: cannot open data dir' >&2; exit 7")
    plane = ControlPlane(bin_dir=tmp_path, work_dir=tmp_path / "work", start_timeout_seconds=10)
    with pytest.raises(ControlPlaneError) as error:
        plane.start()
    assert "etcd exited with 7" in str(error.value)
    assert "cannot open data dir" in str(error.value)


def test_provisioning_is_a_no_op_when_every_binary_is_present(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in (*REQUIRED_BINARIES, "helm"):
        _stub(bin_dir / name, "exit 0")
    (bin_dir / ".helm-stamp").write_text("helm (stamped with its Kubernetes version)\n")
    env = {**os.environ, "ASYNCRL_K8S_BIN_DIR": str(bin_dir), "ASYNCRL_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == str(bin_dir)
    assert "present" in result.stderr
    assert "building" not in result.stderr


def test_provisioning_without_go_names_what_is_missing(tmp_path: Path) -> None:
    # A PATH with the basic tools but no Go toolchain.
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("bash", "mkdir", "date", "sed", "printf", "cat"):
        found = shutil.which(tool)
        if found:
            (tools / tool).symlink_to(found)
    env = {
        "PATH": str(tools),
        "HOME": str(tmp_path),
        "ASYNCRL_K8S_BIN_DIR": str(tmp_path / "bin"),
        "ASYNCRL_CACHE_DIR": str(tmp_path / "cache"),
    }
    result = subprocess.run(
        [str(tools / "bash"), str(SCRIPT)], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "Go is not installed" in result.stderr


def test_an_unstamped_helm_is_rebuilt_not_trusted(tmp_path: Path) -> None:
    """A helm from before the version stamp would make `helm template` render for the wrong Kubernetes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in (*REQUIRED_BINARIES, "helm"):
        _stub(bin_dir / name, "exit 0")
    # No Go on PATH: the rebuild it attempts fails, saying what is missing, instead of keeping the old helm.
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("bash", "mkdir", "date", "sed", "printf", "cat", "dirname", "basename", "cut", "tr"):
        found = shutil.which(tool)
        if found:
            (tools / tool).symlink_to(found)
    env = {
        "PATH": str(tools),
        "HOME": str(tmp_path),
        "ASYNCRL_K8S_BIN_DIR": str(bin_dir),
        "ASYNCRL_CACHE_DIR": str(tmp_path / "cache"),
    }
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=False)
    assert result.returncode != 0
    assert "helm present" not in result.stderr
