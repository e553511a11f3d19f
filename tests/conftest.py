"""Session fixtures: the real local control plane, a pod runner in place of the kubelet, API clients."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.testing.controlplane import ControlPlane
from asyncrl.testing.podrunner import PodRunner
from tests.support.kube import (
    api_client_for,
    fresh_namespace,
    kubectl_for,
    pod_base_env,
    running_control_plane,
)

# Images the tests' pods may name; each maps to how the pod runner starts it on this machine.
TEST_IMAGES = {
    "asyncrl.test/shell": Image(),
    "asyncrl.test/python": Image(entrypoint=(sys.executable,)),
}


# With pytest-xdist (`make pytest` runs two workers) each worker starts its own control plane and pod runner
# (free loopback ports, temporary directories). Tests are shared out by whole scopes, the longest first
# (pytest_xdist_make_scheduler below), so the real node and the vLLM server start on one worker each.


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with running_control_plane(tmp_path_factory.mktemp("control-plane")) as plane:
        yield plane


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> Iterator[Any]:
    with api_client_for(control_plane) as api:
        yield api


@pytest.fixture(scope="session")
def image_table() -> ImageTable:
    return ImageTable(TEST_IMAGES)


@pytest.fixture(scope="session")
def pod_runner(
    api_client: Any, image_table: ImageTable, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PodRunner]:
    runner = PodRunner(
        api_client=api_client,
        images=image_table,
        work_dir=tmp_path_factory.mktemp("pods"),
        base_env=pod_base_env(),
    )
    runner.start()
    yield runner
    runner.stop()


@pytest.fixture
def namespace(api_client: Any) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards (the real namespace controller empties it)."""
    with fresh_namespace(api_client, prefix="t") as name:
        yield name


@pytest.fixture
def kubectl(control_plane: ControlPlane) -> list[str]:
    """argv prefix for the provisioned kubectl pointed at the test control plane."""
    return kubectl_for(control_plane)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist (`-p no:xdist`) must not refuse it
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Whole scopes per worker, the longest first (tests/support/scheduling.py)."""
    from tests.support.scheduling import LongestScopeFirst

    return LongestScopeFirst(config, log)
