"""Session fixtures: the real local control plane, a pod runner in place of the kubelet, API clients."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.testing.controlplane import ControlPlane
from asyncrl.testing.podrunner import PodRunner
from tests.support import timeline
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


# Property tests check properties, not speed: on CI's two shared cores one draw of a strategy took 2.5 s, and
# Hypothesis's too_slow health check failed the test for it (2026-12-07). Examples and shrinking: unchanged.
settings.register_profile("shared-cores", suppress_health_check=[HealthCheck.too_slow], deadline=None)
settings.load_profile("shared-cores")

# With pytest-xdist (`make pytest` runs two workers) each worker starts its own control plane and pod runner
# (free loopback ports, temporary directories), and its own real node and vLLM server when its share of the
# tests needs them (a node picks a subnet and a name no other node uses). Measured on 2 cores (CI,
# 2026-12-07), both ways of keeping the node's and vLLM's tests on one worker each were no faster and slowed
# the node's end-to-end test: `--dist loadgroup` (52:45 against 49:58), and whole scopes handed out longest
# first (50:01, the end-to-end test past its 900 s timeout while the vLLM tests ran beside it).


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    timeline.record(report)


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
