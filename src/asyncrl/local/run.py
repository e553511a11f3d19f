"""`asyncrl local run MANIFEST`: the whole loop of an AsyncTrainingRun on one machine, without Kubernetes.

The same manifest that `kubectl apply` takes (validated by the same rules) runs as local processes: the
gateway, the trainer (restarted after a crash, as the pod's restartPolicy would; it resumes from its
checkpoint and recovers its window from the gateway), and one process per rollout from the agent template.
The gateway is restarted too when it dies (on the same port, a bounded number of times): the trainer notices
the new instance and redraws what it lost. A status line per step shows what `kubectl get atr` would.
Ctrl-C (or SIGTERM) stops every process group of the run, agents included, within a few seconds (SIGTERM,
then SIGKILL after a short grace) and reports what it stopped.
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

import httpx
import yaml

from asyncrl.api import AsyncTrainingRun, InvalidRunError
from asyncrl.gateway_api.client import GatewayClient
from asyncrl.gateway_api.tokens import KEY_ENV_VAR
from asyncrl.launch.commands import gateway_args, trainer_args
from asyncrl.launch.processes import KILL_WAIT_SECONDS, free_port, stop_process_groups
from asyncrl.local.agents import LocalAgents, last_line
from asyncrl.local.preflight import preflight_problems
from asyncrl.local.report import AgentCounts, RunTally, header
from asyncrl.manifest.files import ManifestError, read_manifest
from asyncrl.plot import plot_hint
from asyncrl.trainer.failures import EXIT_CODES, EXIT_CONFIG_ERROR, EXIT_RUN_FAILED, PERMANENT_EXIT_CODES
from asyncrl.trainer.metrics import metrics_places

logger = logging.getLogger(__name__)

TRAINER_RESTARTS = 3
GATEWAY_RESTARTS = 5  # per run; a gateway that keeps dying ends the run
STOP_GRACE_SECONDS = 3.0  # SIGTERM, then SIGKILL: Ctrl-C ends everything within seconds, also under load
RUN_MARKER_ENV_VAR = "ASYNCRL_LOCAL_RUN"


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
    parser.add_argument(
        "--reference-model-seed",
        type=int,
        default=None,
        help="seed of the Reference backend's initial weights (passed to the trainer; default: its own, 0)",
    )
    routes = parser.add_argument_group(
        "addresses",
        "where each part of the run listens and reaches the others (default: free ports on 127.0.0.1, each "
        "part straight to the other); e.g. to put a proxy between two parts",
    )
    routes.add_argument("--gateway-port", type=int, default=0, help="the gateway's port (default: any free)")
    routes.add_argument("--trainer-gateway-url", default=None, help="where the trainer reaches the gateway")
    routes.add_argument("--agents-gateway-url", default=None, help="where the agents reach the gateway")
    routes.add_argument(
        "--operator-gateway-url",
        default=None,
        help="where this process reaches the gateway (it claims rollouts and reports agents' outcomes, as "
        "the operator does on a cluster)",
    )
    routes.add_argument(
        "--inference-port", type=int, default=0, help="the trainer's model server's port (default: any free)"
    )
    routes.add_argument(
        "--inference-url", default=None, help="where the gateway reaches the trainer's model server"
    )


def load_manifest(path: Path) -> tuple[dict[str, Any], AsyncTrainingRun]:
    try:
        manifest = read_manifest(path)
        return manifest.document, manifest.run()
    except ManifestError as error:
        raise SystemExit(f"asyncrl local run: {error}") from error
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
    """One long-lived process of the run (gateway or trainer), in its own process group."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name, self.argv, self.env, self.log_path = name, argv, env, log_path
        self.process: asyncio.subprocess.Process | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv, env=self.env, stdout=log, stderr=asyncio.subprocess.STDOUT, start_new_session=True
            )
        (self.log_path.parent / f"{self.name}.pid").write_text(f"{self.process.pid}\n")

    async def wait(self) -> int:
        assert self.process is not None
        return await self.process.wait()

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode


class RunFailed(RuntimeError):
    """A process of the run failed for good (the gateway kept dying); the message says which and where."""


async def _start_gateway(gateway: _Process, client: GatewayClient, timeout: float = 60.0) -> None:
    await gateway.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not gateway.running:
            raise RunFailed(f"the gateway exited; see {gateway.log_path}")
        with contextlib.suppress(httpx.HTTPError):
            await client.state()
            return
        await asyncio.sleep(0.1)
    raise RunFailed(f"the gateway did not start within {timeout:.0f}s; see {gateway.log_path}")


async def _supervise_gateway(gateway: _Process, client: GatewayClient, out: TextIO) -> None:
    """Restart a dead gateway on its port, a bounded number of times, as the pod's restartPolicy would.

    The trainer notices the new instance, registers its model servers again and redraws the rollouts the old
    one held; the agents of those rollouts are stopped. Returns never; raises RunFailed when out of restarts.
    """
    for restart in range(1, GATEWAY_RESTARTS + 1):
        code = await gateway.wait()
        out.write(
            f"gateway exited with {code}; restarting it ({restart} of {GATEWAY_RESTARTS}); the trainer "
            "registers its model servers again and redraws the rollouts it lost\n"
        )
        out.flush()
        logger.warning("gateway exited with %s; restart %d of %d", code, restart, GATEWAY_RESTARTS)
        await asyncio.sleep(min(restart - 1, 5))  # back off from a gateway that dies right away
        await _start_gateway(gateway, client)
    code = await gateway.wait()
    raise RunFailed(
        f"the gateway exited with {code} after {GATEWAY_RESTARTS} restarts; see {gateway.log_path}"
    )


async def _status_lines(gateway: GatewayClient, agents: LocalAgents, tally: RunTally, out: TextIO) -> None:
    """A line per update the trainer reports, redone steps included: the gateway numbers the summaries it
    receives (`posted`), and a restarted gateway starts again from 1."""
    out.write(header() + "\n")
    out.flush()
    posted = 0
    while True:
        with contextlib.suppress(Exception):
            summary = await gateway.summary(after_posted=posted, wait_seconds=30)
            with contextlib.suppress(Exception):
                tally.record_stats(await gateway.stats())
            if summary is None or summary.posted is None:
                posted = 0  # a restarted gateway that has no summary yet
                continue
            if summary.posted == posted:  # the one already printed (the wait ran out)
                continue
            posted = summary.posted  # lower than before: the first of a restarted gateway
            lines = tally.step_lines(summary, running_agents=agents.active, now=time.monotonic())
            out.write("".join(line + "\n" for line in lines))
            out.flush()
            continue
        await asyncio.sleep(1.0)


async def _final_stats(client: GatewayClient, tally: RunTally) -> None:
    """The gateway's last totals, before it is stopped (rollouts that ended after the last step)."""
    with contextlib.suppress(Exception):
        tally.record_stats(await asyncio.wait_for(client.stats(), timeout=5.0))


def gateway_command(run_file: Path, *, port: int) -> list[str]:
    """The gateway's process: the run's settings from `run_file` (the trainer's --config too). No upstream:
    the trainer registers its inference servers when they are up (verl's vLLM replicas pick their ports)."""
    return [
        sys.executable,
        "-m",
        "asyncrl.cli",
        "gateway",
        *gateway_args(config=run_file, port=port),
        "--log-level=warning",
    ]


async def run_locally(args: argparse.Namespace) -> int:
    manifest, run = load_manifest(args.manifest)
    template = template_of(run, args.manifest)
    problems = await preflight_problems(run, template)
    if problems:  # nothing is started: the same lines as `asyncrl validate`, and the commands checked here
        lines = "\n".join(f"asyncrl local run: {args.manifest}: {problem}" for problem in problems)
        raise SystemExit(f"{lines}\nnothing was started")
    name = run.name or "run"
    work_dir = (args.work_dir or Path(".asyncrl") / "local" / name).absolute()
    if work_dir.exists() and not args.resume:
        shutil.rmtree(work_dir)
    (work_dir / "agents").mkdir(parents=True, exist_ok=True)
    (work_dir / "run.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    # A key given in the environment lets another process query this run's gateway; else a fresh one.
    key = os.environ.get(KEY_ENV_VAR, "").strip() or secrets.token_urlsafe(32)
    gateway_port = args.gateway_port or free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    operator_gateway_url = args.operator_gateway_url or gateway_url
    # RUN_MARKER_ENV_VAR marks every process of the run (agents included, by inheritance), so a test or a
    # user can tell that none is left: grep /proc/*/environ for it.
    env = {**os.environ, KEY_ENV_VAR: key, "PYTHONUNBUFFERED": "1", RUN_MARKER_ENV_VAR: str(work_dir)}
    os.environ[RUN_MARKER_ENV_VAR] = str(work_dir)  # agents inherit this process's environment
    cli = [sys.executable, "-m", "asyncrl.cli"]
    gateway = _Process(
        "gateway", gateway_command(work_dir / "run.yaml", port=gateway_port), env, work_dir / "gateway.log"
    )
    checkpoint_dir = work_dir / "checkpoints"
    trainer_argv = [
        *cli,
        "trainer",
        *trainer_args(
            config=work_dir / "run.yaml",
            gateway_url=args.trainer_gateway_url or gateway_url,
            checkpoint_dir=checkpoint_dir,
            wandb_dir=work_dir,
            metrics_file=args.metrics_file,
        ),
        *([f"--inference-port={args.inference_port}"] if args.inference_port else []),
        *([f"--inference-url={args.inference_url}"] if args.inference_url else []),
        *(
            []
            if args.reference_model_seed is None
            else [f"--reference-model-seed={args.reference_model_seed}"]
        ),
    ]
    trainer = _Process("trainer", trainer_argv, env, work_dir / "trainer.log")
    out = sys.stdout
    out.write(f"asyncrl local run {name}: logs in {work_dir}/ (gateway.log, trainer.log, agents/)\n")
    out.flush()
    stop_signal = _StopSignal()
    tasks: list[asyncio.Task[Any]] = []
    agents: LocalAgents | None = None
    tally = RunTally()
    outcome = "stopped"
    try:
        async with GatewayClient(operator_gateway_url, key) as client:
            await _start_gateway(gateway, client)
            agents = LocalAgents(
                gateway=client,
                gateway_url=args.agents_gateway_url or gateway_url,
                gateway_key=key,
                template=template,
                run_name=name,
                timeout_seconds=run.spec.rollout_timeout_seconds,
                max_active=run.spec.agents.max_active_jobs,
                log_dir=work_dir / "agents",
            )
            tasks = [
                asyncio.create_task(agents.run()),
                asyncio.create_task(_status_lines(client, agents, tally, out)),
            ]
            trainer_done = asyncio.create_task(_supervise_trainer(trainer, client, out))
            gateway_done = asyncio.create_task(_supervise_gateway(gateway, client, out))
            stopped = asyncio.create_task(stop_signal.wait())
            tasks += [trainer_done, gateway_done, stopped]
            try:
                await asyncio.wait([trainer_done, gateway_done, stopped], return_when=asyncio.FIRST_COMPLETED)
            finally:
                await _final_stats(client, tally)
            if stopped.done():
                outcome = f"{stop_signal.received} (exit code {stop_signal.exit_code})"
                return stop_signal.exit_code
            if gateway_done.done():
                gateway_done.result()  # raises RunFailed
            code = trainer_done.result()
            outcome = trainer_outcome(code)
            return code
    except RunFailed as error:
        out.write(f"asyncrl local run: {error}; stopping the run\n")
        outcome = f"failed: {error} (exit code 1)"
        return 1
    finally:
        stop_signal.uninstall()
        report = await _stop_everything(tasks, agents, trainer, gateway)
        if stop_signal.received is not None:
            out.write(f"\n{stop_signal.received}: {report}\n")
        # The trainer writes --metrics-file, or by default metrics/metrics.jsonl beside its checkpoints.
        places = metrics_places(
            checkpoint_dir=checkpoint_dir, metrics_file=args.metrics_file, wandb_dir=work_dir
        )
        metrics_file = places.metrics_file.absolute() if places.metrics_file is not None else None
        counts = (
            AgentCounts(
                launched=agents.started,
                lost_with_gateway=agents.lost_with_gateway,
                stopped_at_end=agents.stopped,
            )
            if agents is not None
            else None
        )
        for line in tally.summary(
            outcome=outcome, work_dir=work_dir, metrics_file=metrics_file, agents=counts
        ):
            out.write(line + "\n")
        out.write(plot_hint(metrics_file))
        out.flush()


def trainer_outcome(code: int) -> str:
    """How the run ended, from the trainer's exit code (after its restarts)."""
    match code:
        case 0:
            return "finished"
        case _ if code == EXIT_CONFIG_ERROR:
            return f"failed: the trainer refused its configuration (exit code {code})"
        case _ if code == EXIT_RUN_FAILED:
            return f"failed: spec.maxFailedSteps steps in a row had nothing to train (exit code {code})"
        case _:
            return f"failed: the trainer kept failing, {TRAINER_RESTARTS} restarts (exit code {code})"


class _StopSignal:
    """Ctrl-C (SIGINT) or SIGTERM to `asyncrl local run`: end the run and every process it started."""

    def __init__(self) -> None:
        self.received: str | None = None
        self.exit_code = 0
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._loop.add_signal_handler(signum, self._receive, signum)

    def _receive(self, signum: signal.Signals) -> None:
        if self.received is None:
            self.received = "interrupted" if signum == signal.SIGINT else "terminated"
            self.exit_code = 128 + signum
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()

    def uninstall(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._loop.remove_signal_handler(signum)


async def _stop_everything(
    tasks: list[asyncio.Task[Any]], agents: LocalAgents | None, trainer: _Process, gateway: _Process
) -> str:
    """Stop the supervisors (nothing restarts), then every process group of the run; say what was stopped."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)  # the agents' task kills its agents on the way out
    if agents is not None:
        await agents.stop_all()
    n_agents = agents.stopped if agents is not None else 0
    running = [process for process in (trainer, gateway) if process.running]
    pids = [process.process.pid for process in running if process.process is not None]
    left = await stop_process_groups(pids, grace_seconds=STOP_GRACE_SECONDS)
    for process in running:
        if process.process is not None and process.process.pid not in left:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.process.wait(), timeout=KILL_WAIT_SECONDS)
    stopped = [f"the {process.name} (pid {process.process.pid})" for process in running if process.process]
    if n_agents:
        stopped.append(f"{n_agents} agent{'s' if n_agents != 1 else ''}")
    what = ", ".join(stopped) if stopped else "nothing was running"
    if left:
        return f"stopped {what}; still running, could not be killed: process groups {left}"
    return f"stopped {what}; no process of the run is left"


async def _supervise_trainer(trainer: _Process, gateway: GatewayClient, out: TextIO) -> int:
    """Run the trainer; after a crash restart it (it resumes), as the trainer pod's restartPolicy does."""
    code = 0
    for attempt in range(TRAINER_RESTARTS + 1):
        await trainer.start()
        code = await trainer.wait()
        if code == 0:
            return 0
        if code in PERMANENT_EXIT_CODES:  # a restart cures neither a wrong setting nor a stuck run
            what = "configuration error" if code == EXIT_CONFIG_ERROR else "run failed"
            reason = await _trainer_reason(trainer, gateway)
            out.write(f"trainer stopped ({what}, exit code {code}), not restarted: {reason}\n")
            out.flush()
            return code
        if attempt < TRAINER_RESTARTS:
            out.write(f"trainer exited with {code}; restarting it (it resumes from its checkpoint)\n")
            out.flush()
    reason = await _trainer_reason(trainer, gateway)
    out.write(f"trainer failed {TRAINER_RESTARTS + 1} times; the last error: {reason}\n")
    return code


async def _trainer_reason(trainer: _Process, gateway: GatewayClient) -> str:
    """Why the trainer stopped: the report it left with the gateway, else the last line of its log."""
    with contextlib.suppress(Exception):
        stats = await asyncio.wait_for(gateway.stats(), timeout=5.0)
        report = stats.trainer_report
        # Not an earlier attempt's report:
        if report is not None and EXIT_CODES[report.outcome] == trainer.returncode:
            return f"{report.message} (more in {trainer.log_path})"
    return f"{last_line(trainer.log_path)} (more in {trainer.log_path})"


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return asyncio.run(run_locally(args))
    except KeyboardInterrupt:  # before the run's own handler was installed; nothing was started yet
        sys.stdout.write("\ninterrupted\n")
        return 130
