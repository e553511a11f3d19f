"""API fixtures: the committed CRD installed once per session in the real control plane, and example runs."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.api.crd import default_path
from asyncrl.api.types.meta import CRD_NAME
from asyncrl.testing.controlplane import ControlPlane
from tests.support.kube import kubectl_for, kubectl_run, wait_established

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_example(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((EXAMPLES / name).read_text())
    return loaded


@pytest.fixture
def minimal_manifest() -> dict[str, Any]:
    return copy.deepcopy(load_example("run-minimal.yaml"))


@pytest.fixture(scope="session")
def installed_crd(control_plane: ControlPlane) -> Path:
    """The committed CRD, applied with kubectl as a user would (idempotent) and Established."""
    kubectl = kubectl_for(control_plane)
    path = default_path()
    done = kubectl_run(kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(path))
    assert done.returncode == 0, f"kubectl apply -f {path} failed: {done.stderr}"
    wait_established(kubectl, CRD_NAME)
    return path
