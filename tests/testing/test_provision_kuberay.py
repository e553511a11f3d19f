"""scripts/provision-kuberay.sh: a second run does nothing, a half-filled cache is rebuilt, no Go is named."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.provisioning import provisioned, without_go

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "provision-kuberay.sh"


CRDS = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")


def _provisioned(cache: Path, *, crds: tuple[str, ...] = CRDS) -> Path:
    kuberay = provisioned(cache / "kuberay" / "v1.5.0", binary="ray-operator", crd=crds[0] if crds else None)
    for crd in crds[1:]:
        (kuberay / "crds" / crd).write_text("kind: CustomResourceDefinition\n")
    return kuberay


def test_a_second_run_finds_the_binary_and_the_crds_and_builds_nothing(tmp_path: Path) -> None:
    kuberay = _provisioned(tmp_path / "cache")
    env = {**without_go(tmp_path), "PATH": os.environ["PATH"]}
    result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == str(kuberay)
    assert "present" in result.stderr
    assert "building" not in result.stderr


@pytest.mark.parametrize("crds", [(), CRDS[:2]], ids=["no CRD", "no RayService CRD"])
def test_a_binary_without_all_its_crds_is_not_trusted(tmp_path: Path, crds: tuple[str, ...]) -> None:
    """KubeRay's operator exits two minutes after its start when a CRD it watches is missing."""
    _provisioned(tmp_path / "cache", crds=crds)
    env = without_go(tmp_path)  # the rebuild it attempts fails on the missing Go, saying so
    result = subprocess.run(
        [env["PATH"] + "/bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode != 0
    assert "Go is not installed" in result.stderr
