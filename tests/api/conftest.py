"""API fixtures: the committed CRD installed once per session in the real control plane, and example runs."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.api.crd import default_path
from asyncrl.api.types.meta import CRD_NAME
from asyncrl.testing.controlplane import ControlPlane
from asyncrl.testing.waiting import WaitTimeout, wait_for

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
    kubectl = [str(Path(control_plane.bin_dir) / "kubectl"), f"--kubeconfig={control_plane.kubeconfig}"]
    path = default_path()
    apply = ["apply", "--server-side", "--force-conflicts", "-f", str(path)]
    done = subprocess.run([*kubectl, *apply], capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, f"kubectl {' '.join(apply)} failed: {done.stderr}"
    # `kubectl wait` fails at once (not waits) while a just-created CRD has no conditions yet, which a busy
    # API server shows for a moment: ask again until Established.
    wait = ["wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s"]
    last: list[str] = []

    def established() -> bool:
        done = subprocess.run([*kubectl, *wait], capture_output=True, text=True, timeout=90)
        last[:] = [done.stderr]
        return done.returncode == 0

    try:
        wait_for(established, timeout=120, what=f"CRD {CRD_NAME} Established", interval=1.0)
    except WaitTimeout as error:
        raise AssertionError(f"kubectl {' '.join(wait)} kept failing: {last}") from error
    return path
