"""`asyncrl local run MANIFEST`: the whole loop of an AsyncTrainingRun on one machine, without Kubernetes.

The same manifest that `kubectl apply` takes (validated by the same rules) runs as local processes: the
gateway, the trainer (restarted after a crash, as the pod's restartPolicy would; it resumes from its
checkpoint and recovers its window from the gateway), and one process per rollout from the agent template.
A status line per step shows what `kubectl get atr` would. Ctrl-C stops everything and leaves no process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from asyncrl.api import AsyncTrainingRun, InvalidRunError, load_run
from asyncrl.gateway.client import GatewayClient
from asyncrl.gateway.config import KEY_ENV_VAR
from asyncrl.gateway.sampling import sampling_args
from asyncrl.local.agents import LocalAgents
from asyncrl.testing.controlplane import free_port

logger = logging.getLogger(__name__)

TRAINER_RESTARTS = 3
COLUMNS = ("STEP", "ACTIVE", "CARRY-OVER", "MAX-AGE", "DRAIN", "REWARD", "RUNNING", "STEP-S")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("manifest", type=Path, help="an AsyncTrainingRun manifest (YAML)")
    parser.add_argument("--metrics-file", type=Path, default=None, help="one JSON object of metrics per step")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="logs, checkpoints, W&B (default .asyncrl/local/<run name>)",
    )
    parser.add_argument("--resume", action="store_true", help="keep the work dir's checkpoints and continue")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def load_manifest(path: Path) -> tuple[dict[str, Any], AsyncTrainingRun]:
    try:
        manifest = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SystemExit(f"asyncrl local run: cannot read {path}: {error.strerror}") from error
    except yaml.YAMLError as error:
        raise SystemExit(f"asyncrl local run: {path} is not valid YAML: {error}") from error
    try:
        return manifest, load_run(manifest)
    except InvalidRunError as error:
        raise SystemExit(f"asyncrl local run: {path}: {error}") from error


def template_of(run: AsyncTrainingRun, manifest_path: Path) -> str:
    template = run.spec.agents.template
    if template.inline is not None:
        return template.inline
    raise SystemExit(
        "asyncrl local run: agents.template.configMapRef needs a cluster; use agents.template.inline locally"
    )


class _Process:
    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name, self.argv, self.env, self.log_path = name, argv, env, log_path
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, stdout=log, stderr=asyncio.subprocess.STDOUT, start_new_session=True
            )

    async def stop(self, grace_seconds: float = 10.0) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), timeout=grace_seconds)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            await self.process.wait()


async def _wait_ready(gateway: GatewayClient, process: _Process, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.process is not None
        if process.process.returncode is not None:
            raise SystemExit(f"asyncrl local run: the gateway exited; see {process.log_path}")
        with contextlib.suppress(Exception):
            await gateway.state()
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"asyncrl local run: the gateway did not start; see {process.log_path}")


async def _status_lines(gateway: GatewayClient, agents: LocalAgents, out: TextIO) -> None:
    out.write("  ".join(f"{column:>10}" for column in COLUMNS) + "\n")
    out.flush()
    last_step = -1
    while True:
        with contextlib.suppress(Exception):
            summary = await gateway.summary(after_step=last_step, wait_seconds=30)
            if summary is None or summary.step <= last_step:
                continue
            last_step = summary.step
            metrics = summary.metrics
            values = (
                summary.step,
                summary.active_groups,
                int(metrics.get("training/async/n_new_carry_over_rollouts", 0)),
                int(metrics.get("training/async/new_carry_over_age_max_steps", 0)),
                f"{metrics.get('training/async/proxy_drain_seconds', 0.0):.3f}",
                f"{metrics.get('training/reward_mean', 0.0):.3f}",
                agents.active,
                f"{metrics.get('timing/step_seconds', 0.0):.1f}",
            )
            out.write("  ".join(f"{value!s:>10}" for value in values) + "\n")
            out.flush()
            continue
        await asyncio.sleep(1.0)


async def run_locally(args: argparse.Namespace) -> int:
    manifest, run = load_manifest(args.manifest)
    template = template_of(run, args.manifest)
    name = run.name or "run"
    work_dir = args.work_dir or Path(".asyncrl") / "local" / name
    if work_dir.exists() and not args.resume:
        shutil.rmtree(work_dir)
    (work_dir / "agents").mkdir(parents=True, exist_ok=True)
    (work_dir / "run.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    key = secrets.token_urlsafe(32)
    gateway_port = free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    env = {**os.environ, KEY_ENV_VAR: key, "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "asyncrl.cli"]
    # The trainer registers its inference servers with the gateway when they are up (verl's vLLM replicas
    # pick their own ports), so the gateway starts without an upstream.
    gateway_process = _Process(
        "gateway",
        [
            *cli,
            "gateway",
            f"--port={gateway_port}",
            f"--model={run.spec.model.name}",
            f"--retry-after-seconds={run.spec.gateway.retry_after_seconds}",
            *sampling_args(run.spec.gateway.sampling_params, run.spec.trainer.rollout_sampling()),
            "--log-level=warning",
        ],
        env,
        work_dir / "gateway.log",
    )
    trainer_argv = [
        *cli,
        "trainer",
        f"--config={work_dir / 'run.yaml'}",
        f"--gateway-url={gateway_url}",
        f"--checkpoint-dir={work_dir / 'checkpoints'}",
        f"--wandb-dir={work_dir}",
    ]
    if args.metrics_file is not None:
        trainer_argv.append(f"--metrics-file={args.metrics_file}")
    trainer = _Process("trainer", trainer_argv, env, work_dir / "trainer.log")
    out = sys.stdout
    out.write(f"asyncrl local run {name}: logs in {work_dir}/ (gateway.log, trainer.log, agents/)\n")
    tasks: list[asyncio.Task[Any]] = []
    try:
        await gateway_process.start()
        async with GatewayClient(gateway_url, key) as gateway:
            await _wait_ready(gateway, gateway_process)
            agents = LocalAgents(
                gateway=gateway,
                gateway_url=gateway_url,
                gateway_key=key,
                template=template,
                run_name=name,
                timeout_seconds=run.spec.rollout_timeout_seconds,
                max_active=run.spec.agents.max_active_jobs,
                log_dir=work_dir / "agents",
            )
            tasks = [
                asyncio.create_task(agents.run()),
                asyncio.create_task(_status_lines(gateway, agents, out)),
            ]
            code = await _supervise_trainer(trainer, out)
            out.write(f"trainer finished with exit code {code}; metrics and logs in {work_dir}\n")
            return code
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await trainer.stop()
        await gateway_process.stop()


async def _supervise_trainer(trainer: _Process, out: TextIO) -> int:
    """Run the trainer; after a crash restart it (it resumes), as the trainer pod's restartPolicy does."""
    for attempt in range(TRAINER_RESTARTS + 1):
        await trainer.start()
        assert trainer.process is not None
        (trainer.log_path.parent / "trainer.pid").write_text(f"{trainer.process.pid}\n")
        code = await trainer.process.wait()
        if code == 0:
            return 0
        if attempt < TRAINER_RESTARTS:
            out.write(f"trainer exited with {code}; restarting it (it resumes from its checkpoint)\n")
            out.flush()
    out.write(f"trainer failed {TRAINER_RESTARTS + 1} times; see {trainer.log_path}\n")
    return code


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return asyncio.run(run_locally(args))
    except KeyboardInterrupt:
        sys.stdout.write("\ninterrupted; every process of the run was stopped\n")
        return 130
