"""Operator fixtures: the CRD installed, an operator process for the test's namespace, run manifests."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.testing.controlplane import ControlPlane, free_port
from asyncrl.testing.processes import ServerProcess, start_server
from tests.api.conftest import installed_crd  # noqa: F401  (a fixture used by these tests)

GATEWAY_IMAGE = "asyncrl.test/gateway"
TRAINER_IMAGE = "asyncrl.test/stub-trainer"
AGENT_IMAGE = "asyncrl.test/python"

AGENT_TEMPLATE = """\
apiVersion: batch/v1
kind: Job
spec:
  template:
    spec:
      containers:
      - name: agent
        image: asyncrl.test/python
        command:
        - python
        - -c
        - |
          import os
          from asyncrl.agent import chat, report_reward
          answer = chat([{"role": "user", "content": os.environ["QUESTION"]}])
          report_reward(1.0 if answer["choices"][0]["message"]["content"] else 0.0)
        env:
        - name: QUESTION
          value: {{ question }}
"""


@pytest.fixture(scope="session", autouse=True)
def _operator_images(image_table: ImageTable) -> None:
    """The operator's images on this machine: the real gateway, a stand-in trainer, Python agents."""
    image_table[GATEWAY_IMAGE] = Image()
    image_table[TRAINER_IMAGE] = Image(
        entrypoint=(sys.executable, "-m", "tests.operator.stub_trainer"), replace_command=True
    )
    image_table[AGENT_IMAGE] = Image(entrypoint=(sys.executable,))


def run_manifest(name: str, *, template: str = AGENT_TEMPLATE, **spec: Any) -> dict[str, Any]:
    port = free_port()
    body: dict[str, Any] = {
        "apiVersion": "asyncrl.dev/v1alpha1",
        "kind": "AsyncTrainingRun",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "tiny", "path": "/models/tiny"},
            "data": {"inline": [{"question": "what is 2+2?"}, {"question": "and 3+3?"}]},
            "trainBatchSize": 1,
            "rollout": {"samplesPerPrompt": 2},
            "async": {"enabled": True, "windowSize": 2},
            "totalSteps": 2,
            "trainer": {"backend": "Reference", "image": TRAINER_IMAGE, "gpus": 0},
            "gateway": {"image": GATEWAY_IMAGE, "port": port, "agentURL": f"http://127.0.0.1:{port}"},
            "agents": {"template": {"inline": template}, "ttlSecondsAfterFinished": 600},
            "logging": {"wandb": {"mode": "Disabled"}},
        },
    }
    body["spec"].update(spec)
    return body


OperatorStarter = Callable[[], ServerProcess]


@pytest.fixture
def start_operator(
    control_plane: ControlPlane,
    namespace: str,
    tmp_path: Path,
    installed_crd: Path,  # noqa: F811
) -> Iterator[OperatorStarter]:
    """Start (and restart) `asyncrl operator -n <namespace>` as a real process; stopped after the test."""
    started: list[ServerProcess] = []

    def start() -> ServerProcess:
        health = free_port()
        process = start_server(
            [
                sys.executable,
                "-m",
                "asyncrl.cli",
                "operator",
                "--namespace",
                namespace,
                "--gateway-address",
                "localhost",
                f"--kubeconfig={control_plane.kubeconfig}",
                f"--health-port={health}",
            ],
            ready_url=f"http://127.0.0.1:{health}/healthz",
            log_path=tmp_path / f"operator-{len(started)}.log",
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            timeout_seconds=60,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
