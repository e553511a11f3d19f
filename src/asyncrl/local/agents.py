"""Local mode's stand-in for the operator's agent Jobs: one local process per rollout.

It claims queued rollouts from the gateway, renders the same Job template the operator would (same sandbox,
same variables), and runs the first container's `command` + `args` with its `env` and the rollout's `AGL_*`
variables, in the current directory and environment. Outcomes go to the gateway exactly as the operator
reports Job outcomes: running, then succeeded (exit 0), failed (non-zero) or timed_out (killed at the
rollout timeout). `maxJobsPerMinute` is an API-server protection and does not apply here; `maxActiveJobs`
(default 32 locally) caps concurrent agents.

Each agent runs in its own process group, which is killed whenever its task ends for any reason (timeout,
cancellation, a gateway gone), so no agent outlives the run. When the gateway restarts (local mode restarts a
dead one), the rollouts it held are gone: their agents are stopped, and the trainer redraws those rollouts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from asyncrl.agent_templates.render import TemplateError, render_job
from asyncrl.gateway_api.client import GatewayClient, GatewayError, new_claim_key
from asyncrl.gateway_api.models import RolloutView
from asyncrl.rollouts import RolloutState
from asyncrl.workloads.agent_jobs import agent_launch, agent_process
from asyncrl.workloads.names import ATTEMPT_ID

logger = logging.getLogger(__name__)

DEFAULT_MAX_ACTIVE = 32
# A state report lost to a reset connection, a timeout or a gateway restarting is sent again for this long
# (the gateway takes a repeated transition as a no-op). Before, it was only logged: the rollout stayed
# `running` until it timed out, or `queued` for the claim's lease and then ran again (benchmarks/soak.py).
REPORT_RETRY_SECONDS = 120.0
REPORT_RETRY_MAX_DELAY = 1.0  # a report is small: after a fault it should land at once, not seconds later


def agent_command(job: Mapping[str, Any], agent_env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and env of the Job's first container, as a local process would run it (beside this one's env)."""
    return agent_process(
        job,
        agent_env,
        inherited=os.environ,
        why_a_command="local mode runs the command, not the image",
        value_from="local mode cannot resolve valueFrom of env {name!r}; give a value, or run on a cluster",
    )


class LocalAgents:
    def __init__(
        self,
        *,
        gateway: GatewayClient,
        gateway_url: str,
        gateway_key: str,
        template: str,
        run_name: str,
        timeout_seconds: float,
        max_active: int | None,
        log_dir: Path,
    ) -> None:
        self.gateway = gateway
        self.gateway_url = gateway_url
        self.gateway_key = gateway_key
        self.template = template
        self.run_name = run_name
        self.timeout_seconds = timeout_seconds
        self.slots = asyncio.Semaphore(max_active or DEFAULT_MAX_ACTIVE)
        self.log_dir = log_dir
        self.active = 0
        self.started = 0
        self.stopped = 0  # agents killed by stop_all (the run ending), for the run's report
        self.lost_with_gateway = 0  # agents stopped because a restarted gateway lost their rollouts
        self.template_error: str | None = None
        self.first_failure: str | None = None  # the first agent that failed, and why: shown on the console
        self._tasks: dict[asyncio.Task[None], str | None] = {}  # agent task -> gateway instance it works for
        self._processes: set[asyncio.subprocess.Process] = set()
        self._instance_id: str | None = None

    @property
    def pids(self) -> list[int]:
        """Process (and process group) ids of the agents running now."""
        return [process.pid for process in self._processes if process.returncode is None]

    async def run(self) -> None:
        claim_key = new_claim_key()  # kept until a claim's answer is read: a retry gets what it took
        try:
            while True:
                try:
                    await self._follow_gateway_instance()
                    claimed = await self.gateway.claim(
                        limit=64, wait_seconds=30, lease_seconds=600, claim_key=claim_key
                    )
                except (httpx.TransportError, GatewayError) as error:
                    if isinstance(error, GatewayError) and error.status < 500:
                        raise
                    logger.debug("claim failed (the gateway is restarting?): %s", error)
                    await asyncio.sleep(0.5)
                    continue
                claim_key = new_claim_key()
                for rollout in claimed:
                    await self.slots.acquire()
                    task = asyncio.create_task(self._run_one(rollout))
                    self._tasks[task] = self._instance_id
                    task.add_done_callback(self._forget)
        finally:
            await self.stop_all()

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)

    async def _follow_gateway_instance(self) -> None:
        """Stop the agents of rollouts a restarted gateway no longer holds (they could only fail)."""
        instance_id = (await self.gateway.stats()).instance_id
        if self._instance_id is not None and instance_id != self._instance_id:
            orphaned = [task for task, instance in self._tasks.items() if instance != instance_id]
            self.lost_with_gateway += len(orphaned)
            for task in orphaned:
                task.cancel()
            await asyncio.gather(*orphaned, return_exceptions=True)
            logger.warning("the gateway restarted; stopped %d agents of rollouts it lost", len(orphaned))
        self._instance_id = instance_id

    async def stop_all(self) -> int:
        """Kill every running agent's process group and end their tasks; returns how many were running."""
        running = self.pids
        self.stopped += len(running)
        for pid in running:
            _kill_group(pid)
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(running)

    async def _report(self, rollout_id: str, state: RolloutState, message: str | None = None) -> bool:
        """Report `state`, sent again after a transport error or a 5xx for REPORT_RETRY_SECONDS; whether the
        gateway took it. A 404/409 is final: consumed or cancelled meanwhile, or lost with a restarted
        gateway."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPORT_RETRY_SECONDS
        delay = 0.25
        while True:
            try:
                await self.gateway.transition(rollout_id, state, message=message, attempt_id=ATTEMPT_ID)
                return True
            except GatewayError as error:
                if error.status < 500:
                    return False
                problem = str(error)
            except httpx.TransportError as error:
                problem = f"{type(error).__name__}: {error}"
            if loop.time() + delay > deadline:
                logger.warning(
                    "rollout %s: could not report %s for %.0fs: %s",
                    rollout_id,
                    state,
                    REPORT_RETRY_SECONDS,
                    problem,
                )
                return False
            logger.info("rollout %s: reporting %s again in %.2fs: %s", rollout_id, state, delay, problem)
            await asyncio.sleep(delay)
            delay = min(delay * 2, REPORT_RETRY_MAX_DELAY)

    async def _report_end(
        self, rollout_id: str, state: RolloutState, message: str | None, *, running_reported: bool
    ) -> None:
        """The final state; `running` first when its report was never taken (a terminal state is refused
        from `queued`, and the rollout would wait out its lease and run again)."""
        if not running_reported:
            await self._report(rollout_id, RolloutState.RUNNING)
        await self._report(rollout_id, state, message)

    async def _run_one(self, rollout: RolloutView) -> None:
        try:
            launch = agent_launch(
                rollout,
                run_name=self.run_name,
                namespace="local",
                job_name=f"{self.run_name}-{rollout.rollout_id}",
                gateway_url=self.gateway_url,
                gateway_key=self.gateway_key,
            )
            try:
                argv, agent_env = agent_command(render_job(self.template, launch.variables), launch.env)
            except TemplateError as error:
                self.template_error = str(error)
                logger.error("rollout %s: %s", rollout.rollout_id, error)
                await self._report(rollout.rollout_id, RolloutState.FAILED, f"agent template: {error}")
                return
            await self._execute(rollout, argv, agent_env)
        finally:
            self.slots.release()

    async def _execute(self, rollout: RolloutView, argv: list[str], agent_env: Mapping[str, str]) -> None:
        log_path = self.log_dir / f"{rollout.rollout_id}.log"
        self.active += 1
        self.started += 1
        process: asyncio.subprocess.Process | None = None
        try:
            with log_path.open("wb") as log:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    env={**os.environ, "PATH": agent_path(agent_env), **agent_env},
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                )
            self._processes.add(process)
            running = await self._report(rollout.rollout_id, RolloutState.RUNNING)
            timeout = rollout.timeout_seconds or self.timeout_seconds
            try:
                code = await asyncio.wait_for(process.wait(), timeout=timeout)
            except TimeoutError:
                _kill_group(process.pid)
                await process.wait()
                await self._report_end(
                    rollout.rollout_id,
                    RolloutState.TIMED_OUT,
                    f"killed after {timeout:.0f}s",
                    running_reported=running,
                )
                return
            if code == 0:
                await self._report_end(
                    rollout.rollout_id, RolloutState.SUCCEEDED, None, running_reported=running
                )
            else:
                self._failed(rollout.rollout_id, f"exited with {code}; its log ends: {last_line(log_path)}")
                await self._report_end(
                    rollout.rollout_id,
                    RolloutState.FAILED,
                    f"agent exited with {code}; see {log_path}",
                    running_reported=running,
                )
        except OSError as error:
            reason = f"cannot start {argv[0]!r}: {error.strerror}"
            with contextlib.suppress(OSError), log_path.open("a") as log:  # its log says why it is empty
                log.write(f"asyncrl local run: {reason} (argv {argv})\n")
            self._failed(rollout.rollout_id, reason)
            await self._report(rollout.rollout_id, RolloutState.FAILED, reason)
        finally:
            # Whatever ended this task (cancellation, a gateway gone), its agent does not outlive it.
            if process is not None:
                if process.returncode is None:
                    _kill_group(process.pid)
                self._processes.discard(process)
            self.active -= 1

    def _failed(self, rollout_id: str, reason: str) -> None:
        """Say on the console why the first agent failed (later ones are counted in the summary)."""
        if self.first_failure is None:
            self.first_failure = f"rollout {rollout_id}: {reason}"
            logger.error(
                "the agent of rollout %s failed: %s (logs in %s; further failures are counted, not shown)",
                rollout_id,
                reason,
                self.log_dir,
            )


def last_line(path: Path) -> str:
    """The last non-empty line of a log (where a process states why it stopped)."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, 2) - 8192))
            lines = [line.strip() for line in log.read().decode(errors="replace").splitlines()]
    except OSError:
        return f"see {path}"
    return next((line for line in reversed(lines) if line), f"(empty: {path})")


def agent_path(agent_env: Mapping[str, str]) -> str:
    """The PATH an agent process gets: its env's, else this interpreter's directory then this PATH."""
    return agent_env.get("PATH") or _path_with_this_python()


def _path_with_this_python() -> str:
    """PATH with this interpreter's directory first, so an agent's `python` has asyncrl installed."""
    return f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


def _kill_group(pid: int) -> None:
    """SIGKILL an agent's process group (its pid is the group's id: each agent starts a new session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
