"""Session fixtures: the real local control plane, a pod runner in place of the kubelet, API clients."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.testing.controlplane import ControlPlane, ControlPlaneError, default_bin_dir, missing_binaries
from asyncrl.testing.podrunner import PodRunner

# Images the tests' pods may name; each maps to how the pod runner starts it on this machine.
TEST_IMAGES = {
    "asyncrl.test/shell": Image(),
    "asyncrl.test/python": Image(entrypoint=(sys.executable,)),
}


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    bin_dir = default_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        pytest.fail(
            f"the local control plane is not provisioned ({', '.join(missing)} missing in {bin_dir}); "
            "run scripts/provision-k8s.sh first",
            pytrace=False,
        )
    plane = ControlPlane(bin_dir=bin_dir, work_dir=tmp_path_factory.mktemp("control-plane"))
    try:
        plane.start()
    except ControlPlaneError as error:
        pytest.fail(str(error), pytrace=False)
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> Iterator[Any]:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=configuration)
    with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture(scope="session")
def image_table() -> ImageTable:
    return ImageTable(TEST_IMAGES)


@pytest.fixture(scope="session")
def pod_runner(
    api_client: Any, image_table: ImageTable, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodRunner]:
    # The venv's bin first, so containers find `python` and `asyncrl` as they would in the images.
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    # The checkout's own code first (src/), also when the venv holds an install of another checkout.
    root = Path(__file__).resolve().parents[1]
    base_env = {"PATH": path, "LANG": "C.UTF-8", "PYTHONPATH": f"{root / 'src'}:{root}"}
    runner = PodRunner(
        api_client=api_client, images=image_table, work_dir=tmp_path_factory.mktemp("pods"), base_env=base_env
    )
    runner.start()
    yield runner
    runner.stop()


@pytest.fixture
def namespace(api_client: Any) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (the real namespace controller empties it)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


@pytest.fixture
def kubectl(control_plane: ControlPlane) -> list[str]:
    """argv prefix for the provisioned kubectl pointed at the test control plane."""
    return [str(Path(control_plane.bin_dir) / "kubectl"), f"--kubeconfig={control_plane.kubeconfig}"]
