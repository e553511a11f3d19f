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


# With pytest-xdist (`make pytest` runs two workers, `--dist loadgroup`), each worker starts its own control
# plane and pod runner (free loopback ports, temporary directories). What exists once per machine runs on one
# worker, in one group: the real node (its network namespace, addresses and records under /run/asyncrl-node;
# a second cluster would remove the first as a leftover) and the real vLLM (one server for the package,
# gigabytes of memory and both cores while it serves).
_ONE_PER_MACHINE = {"node": "node", "vllm": "vllm"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for marker, group in _ONE_PER_MACHINE.items():
            if item.get_closest_marker(marker) is not None or f"/tests/{marker}/" in str(item.path):
                item.add_marker(pytest.mark.xdist_group(group))
                break


@pytest.hookimpl(tryfirst=True)  # before xdist sends the worker's test ids to the scheduler
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under `--dist loadgroup` each grouped test's id carries its group (`...@node`), which is what keeps the
    group on one worker; if pytest-xdist could not add it, two nodes or two vLLM servers would run at once."""
    if not getattr(session.config.option, "loadgroup", False):  # set on xdist workers only
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if lost:
        raise pytest.UsageError(
            f"pytest-xdist did not put {len(lost)} grouped tests in their group (e.g. {lost[0]}); "
            "the installed pytest and pytest-xdist do not work together (see pytest's pin in pyproject.toml)"
        )


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
