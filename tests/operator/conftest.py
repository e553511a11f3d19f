"""Operator fixtures: the CRD installed, the operator's images, an operator process per test namespace."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.testing.controlplane import ControlPlane
from asyncrl.testing.processes import ServerProcess
from tests.api.conftest import installed_crd  # noqa: F401  (a fixture used by these tests)
from tests.support.kube import AGENT_IMAGE, GATEWAY_IMAGE, TRAINER_IMAGE, start_operator_process


@pytest.fixture(scope="session", autouse=True)
def _operator_images(image_table: ImageTable) -> None:
    """The operator's images on this machine: the real gateway, a stand-in trainer, Python agents."""
    image_table[GATEWAY_IMAGE] = Image()
    image_table[TRAINER_IMAGE] = Image(
        entrypoint=(sys.executable, "-m", "tests.operator.stub_trainer"), replace_command=True
    )
    image_table[AGENT_IMAGE] = Image(entrypoint=(sys.executable,))


OperatorStarter = Callable[..., ServerProcess]  # start_operator(*extra_args): more `asyncrl operator` flags


@pytest.fixture
def start_operator(
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    installed_crd: Path,  # noqa: F811
) -> Iterator[OperatorStarter]:
    """Start (and restart) `asyncrl operator -n <namespace>` as a real process; stopped after the test."""
    started: list[ServerProcess] = []

    def start(*extra_args: str) -> ServerProcess:
        log_path = tmp_path / f"operator-{len(started)}.log"
        scope = ["--namespace", namespace]
        process = start_operator_process(
            kubeconfig=control_plane.kubeconfig, scope=scope, log_path=log_path, extra_args=extra_args
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
