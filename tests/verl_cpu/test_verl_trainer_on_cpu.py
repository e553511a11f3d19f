"""verl's own trainer, through our `VerlBackend`, end to end on CPU: start, update steps with vLLM in the
loop, a checkpoint, a kill -9 and the resume.

Real here (asyncrl.testing.verl_trainer_cpu drives it on the python of scripts/provision-verl-cpu.sh):
`VerlBackend.start()` (Ray, TransferQueue, `WindowDrivenTrainer.init()`: verl's actor worker group with
FSDP2 over gloo on 2 ranks, the vLLM replicas verl launches as its rollout servers, one per rank (vLLM
0.24's CPU build, dummy weights), the initial weight sync through verl's bucketed sender over shared
memory); then per step, as the step loop calls them: rows sampled from vLLM (its token ids and log-probs),
`sleep()`, `update(rows)` (verl's PPO pipeline: old log-probs, GRPO advantages, rollout correction, the
actor update), `wake()` (the new weights into every replica); `save_checkpoint` and, in a second process
tree after a kill -9 of the first, `load_checkpoint`.

Replaced, and why (the CPU run's deviations from the GPU configuration):
- the device: asyncrl.testing.verl_cpu_platform registers a `cpu` platform in verl's registry (Ray's "GPU"
  resource counted by `ray.init(num_gpus=N)` on CPU, gloo, no CUDA IPC) and selects verl's FSDP engine with
  VERL_ENGINE_DEVICE=cuda; it takes verl's backend string `cpu:gloo,cpu:gloo` as gloo and turns off vLLM's
  oneDNN linear kernel, which drops the weights verl's sync loads into;
- FSDP2 for FSDP1, float32 (weights and compute) for bfloat16, no torch.compile, no vLLM sleep mode, one
  TransferQueue storage unit, a larger learning rate (tests/verl_cpu/cpu_config.py);
- the agents and the gateway: the driver samples from vLLM itself (the gateway's capture is tested against
  vLLM in tests/vllm), with a made-up reward.

Measured on the 2-core machine, shared with other test runs (load average 25-35): `start()` 200-405 s with
2 ranks (88-291 s with 1), a step 1.5-4.5 s, a checkpoint save 0.4 s and load 0.4 s; the whole module 588 s
(two starts). It runs in the default selection only where scripts/provision-verl-cpu.sh has built its
venv, and is skipped otherwise.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from asyncrl.testing.verl_server_cpu import RUN_MARKER, run_processes
from asyncrl.testing.waiting import wait_for
from tests.verl_cpu.conftest import SRC
from tests.verl_cpu.cpu_config import save_cpu_verl_config

GPUS = 2  # ranks of verl's actor worker group (FSDP over gloo), one vLLM replica each
SAVED_VERSION = 2  # the first run saves a checkpoint here, then goes on until it is killed
FIRST_RUN_STEPS = 6  # more than it reaches before the kill
RUN_TIMEOUT_SECONDS = 1800.0  # start measured at 88-405 s on two shared cores; CI shares them
# vLLM and the actor compute in float32 on the same weights: per token, their log-probs of the sampled token
# differ by rounding (measured: importance weights within 1e-6 of 1). Serving the previous version's weights
# would put them apart by the update (measured: the probe text's log-prob moves by ~0.03 a token a step).
LOG_PROB_TOLERANCE = 1e-4
PROBE_TOLERANCE = 1e-3  # the probe is a sum over ~45 tokens
# pytest-timeout's backstop (900 s in pyproject) counts a test's fixtures: two runs' starts here.
pytestmark = [pytest.mark.slow, pytest.mark.verlcpu, pytest.mark.timeout(2 * RUN_TIMEOUT_SECONDS + 600)]


@dataclass
class DriverRun:
    process: subprocess.Popen[bytes]
    marker: str
    report_path: Path
    log_path: Path

    def report(self) -> dict[str, Any]:
        try:
            report: dict[str, Any] = json.loads(self.report_path.read_text())
        except (OSError, ValueError):
            return {}
        return report

    def failure(self) -> str:
        report = self.report()
        log = self.log_path.read_text(errors="replace")[-5000:] if self.log_path.exists() else ""
        return f"driver exited {self.process.poll()}: {report.get('traceback')}\n{log}"

    def kill_all(self) -> None:
        """kill -9 of the whole run, as a trainer pod's processes die with it."""
        for pid in run_processes(self.marker):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not run_processes(self.marker), timeout=60, what="the run's processes to be gone")


def start_driver(python: Path, config_path: Path, directory: Path, *args: str) -> DriverRun:
    marker = uuid.uuid4().hex
    report_path, log_path = directory / "report.json", directory / "driver.log"
    env = {**os.environ, "PYTHONPATH": str(SRC), RUN_MARKER: marker}
    env.pop("VIRTUAL_ENV", None)
    argv = [str(python), "-m", "asyncrl.testing.verl_trainer_cpu", str(config_path), str(report_path), *args]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True
        )
    return DriverRun(process=process, marker=marker, report_path=report_path, log_path=log_path)


def phases(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["phase"]: entry for entry in report.get("phases", [])}


@pytest.fixture(scope="module")
def config_path(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_cpu_verl_config(
        tmp_path_factory.mktemp("verl-config") / "verl.yaml", tiny_model_dir, gpus=GPUS
    )


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def killed_run(
    verl_cpu_python: Path, config_path: Path, checkpoint_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Any]:
    """The first run: steps, a checkpoint at SAVED_VERSION, more steps, then kill -9 mid-run."""
    run = start_driver(
        verl_cpu_python,
        config_path,
        tmp_path_factory.mktemp("first-run"),
        f"--steps={FIRST_RUN_STEPS}",
        f"--checkpoint-dir={checkpoint_dir}",
        f"--save-at-version={SAVED_VERSION}",
    )
    try:
        wait_for(
            lambda: "save_checkpoint" in phases(run.report()) or run.process.poll() is not None,
            timeout=RUN_TIMEOUT_SECONDS,
            what="the checkpoint to be saved",
        )
        assert "save_checkpoint" in phases(run.report()), run.failure()
    finally:
        run.kill_all()
    report = run.report()
    assert "stop" not in phases(report), "the run ended before the kill: raise FIRST_RUN_STEPS"
    print(json.dumps({key: report.get(key) for key in ("phases", "probe_log_prob")}, indent=1))
    return report


@pytest.fixture(scope="module")
def resumed_run(
    killed_run: dict[str, Any],
    verl_cpu_python: Path,
    config_path: Path,
    checkpoint_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """A second process tree on the same checkpoints: start, load the checkpoint, one more step."""
    run = start_driver(
        verl_cpu_python,
        config_path,
        tmp_path_factory.mktemp("resumed-run"),
        "--steps=1",
        f"--checkpoint-dir={checkpoint_dir}",
        "--resume",
    )
    try:
        run.process.wait(timeout=RUN_TIMEOUT_SECONDS)
    finally:
        run.kill_all()
    report = run.report()
    assert run.process.returncode == 0, run.failure()
    print(json.dumps({key: report.get(key) for key in ("phases", "probe_log_prob")}, indent=1))
    return report


def assert_vllm_serves_the_trainers_policy(step: dict[str, Any]) -> None:
    """The rows vLLM sampled at a version, scored again by the actor at that version: the same log-probs."""
    verl = step["verl"]
    assert verl["training/rollout_probs_diff_valid"] == 1
    # verl's token-level importance weights are exp(actor log-prob - vLLM log-prob) per token.
    low, high = verl["rollout_corr/rollout_is_min"], verl["rollout_corr/rollout_is_max"]
    assert 1.0 - LOG_PROB_TOLERANCE < low <= high < 1.0 + LOG_PROB_TOLERANCE, (step["version_sampled"], verl)


def test_vllm_serves_each_version_the_trainer_makes_and_the_policy_moves(killed_run: dict[str, Any]) -> None:
    steps = killed_run["steps"]
    assert [step["version_sampled"] for step in steps][:SAVED_VERSION] == list(range(SAVED_VERSION))
    for step in steps:
        assert_vllm_serves_the_trainers_policy(step)
        assert step["grad_norm"] > 0.0
    # The policy moved, and vLLM serves it: its score of a fixed text changes at every version.
    probes = killed_run["probe_log_prob"]
    scores = [probes[str(version)] for version in range(len(steps) + 1)]
    assert all(abs(after - before) > 10 * PROBE_TOLERANCE for before, after in itertools.pairwise(scores)), (
        scores
    )
    # Each replica is synced on its own: all serve the new version.
    for version, replicas in killed_run["replica_probe_log_probs"].items():
        assert len(replicas) == GPUS
        assert replicas == pytest.approx([probes[version]] * GPUS, abs=PROBE_TOLERANCE), version


def test_after_a_kill_the_trainer_resumes_from_its_checkpoint_at_the_saved_version(
    killed_run: dict[str, Any], resumed_run: dict[str, Any]
) -> None:
    assert phases(resumed_run)["load_checkpoint"]["version"] == SAVED_VERSION
    # vLLM serves the checkpoint's weights: the probe scores as the killed run's vLLM scored it then.
    resumed = resumed_run["probe_log_prob"][f"resumed-{SAVED_VERSION}"]
    assert resumed == pytest.approx(killed_run["probe_log_prob"][str(SAVED_VERSION)], abs=PROBE_TOLERANCE)
    (step,) = resumed_run["steps"]
    assert step["version_sampled"] == SAVED_VERSION
    assert_vllm_serves_the_trainers_policy(step)
    assert resumed_run["probe_log_prob"][str(SAVED_VERSION + 1)] != pytest.approx(
        resumed, abs=PROBE_TOLERANCE
    )
