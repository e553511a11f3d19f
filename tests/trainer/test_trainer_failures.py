"""How `asyncrl trainer` ends when it cannot go on: a distinct exit code and a report left with the gateway.

Real parts: the `asyncrl gateway` process and the `asyncrl trainer` process (reference backend on CPU). The
test itself plays the operator's part for the agents: it fails every queued rollout, as agents that always
crash would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.trainer.failures import EXIT_CONFIG_ERROR, EXIT_RUN_FAILED
from tests.gateway.conftest import KEY, RunningGateway, launch_gateway

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def bare_gateway(tmp_path: Path) -> Iterator[RunningGateway]:
    """A gateway with no upstream: the trainer registers its own model server, as in the trainer pod."""
    running = launch_gateway([], tmp_path)
    yield running
    running.process.stop()


def _manifest(tmp_path: Path, **spec: Any) -> Path:
    manifest: dict[str, Any] = yaml.safe_load((REPO / "examples" / "quickstart-local.yaml").read_text())
    manifest["spec"].update(spec)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def _trainer(manifest: Path, gateway: RunningGateway, tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "trainer",
            f"--config={manifest}",
            f"--gateway-url={gateway.url}",
            f"--metrics-file={tmp_path / 'metrics.jsonl'}",
            f"--wandb-dir={tmp_path / 'wandb'}",
        ],
        env={**os.environ, "ASYNCRL_GATEWAY_KEY": KEY, "WANDB_MODE": "disabled"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _report(gateway: RunningGateway) -> dict[str, Any] | None:
    with gateway.management() as client:
        report: dict[str, Any] | None = client.get("/api/stats").json()["trainer_report"]
        return report


def test_a_configuration_error_exits_with_its_own_code_and_is_reported(
    bare_gateway: RunningGateway, tmp_path: Path
) -> None:
    manifest = _manifest(tmp_path, **{"async": {"enabled": True, "windowSize": 2}})
    trainer = _trainer(manifest, bare_gateway, tmp_path)
    output, _ = trainer.communicate(timeout=120)
    assert trainer.returncode == EXIT_CONFIG_ERROR, output
    assert "windowSize" in output
    report = _report(bare_gateway)
    assert report is not None
    assert report["outcome"] == "config_error"
    assert "windowSize (2) must be greater than trainBatchSize (4)" in report["message"]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("", "the manifest is empty"),
        ("- 1\n", "the manifest is a YAML list"),
        ("spec: [\n", "is not valid YAML"),
    ],
    ids=["empty", "list", "broken-yaml"],
)
def test_a_manifest_that_is_not_a_mapping_is_a_configuration_error_not_a_traceback(
    bare_gateway: RunningGateway, tmp_path: Path, content: str, says: str
) -> None:
    manifest = tmp_path / "run.yaml"
    manifest.write_text(content)
    trainer = _trainer(manifest, bare_gateway, tmp_path)
    output, _ = trainer.communicate(timeout=120)
    assert trainer.returncode == EXIT_CONFIG_ERROR, output
    assert says in output
    assert "Traceback" not in output


@pytest.mark.slow
def test_steps_where_every_rollout_failed_end_the_run_after_max_failed_steps(
    bare_gateway: RunningGateway, tmp_path: Path
) -> None:
    manifest = _manifest(tmp_path, maxFailedSteps=2, totalSteps=10)
    trainer = _trainer(manifest, bare_gateway, tmp_path)
    failed = 0
    deadline = time.monotonic() + 240
    try:
        with bare_gateway.management() as client:
            while trainer.poll() is None:  # every agent "crashes": each queued rollout fails
                assert time.monotonic() < deadline, "the trainer did not give up"
                response = client.get("/api/rollouts", params={"state": "queued"})
                if response.status_code != 200:
                    continue
                for rollout in response.json()["rollouts"]:
                    transition = client.post(
                        f"/api/rollouts/{rollout['rollout_id']}/transition",
                        json={"state": "failed", "message": "the agent crashed"},
                    )
                    failed += transition.status_code == 200
                time.sleep(0.2)
        output = trainer.stdout.read() if trainer.stdout else ""
    finally:
        trainer.kill()
        trainer.wait()
    assert trainer.returncode == EXIT_RUN_FAILED, output
    assert failed > 0
    report = _report(bare_gateway)
    assert report is not None
    assert report["outcome"] == "run_failed"
    assert "spec.maxFailedSteps" in report["message"]
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]  # two failed steps, then the end; not ten steps that learned nothing
