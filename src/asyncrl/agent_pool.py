"""The agent pool runner: one long-lived agent pod takes rollouts from the gateway and runs them one by one.

`spec.agents.mode: Pool` runs this (`asyncrl agent-pool`) as the first container of each pool pod, in the
image of the agent template. For each rollout it claims (the claim launches it: `gateway/routes/pool.py`),
it renders the same template a Job would get, with the same variables, and runs the template's first
container's `command` + `args` with its `env` and the rollout's `AGL_*` variables, as a child process. So an
agent written for Jobs runs unchanged; what it loses is the fresh pod per rollout (see docs/agents.md).

At most once: the runner reports `running` before it starts the agent, and the agent dies with the runner
(`PR_SET_PDEATHSIG`). If the runner is killed mid-rollout, its next claim (after the container restarts)
fails that rollout instead of running it again. The pool token never reaches the agent's environment.

Cancellation: where the operator deletes a cancelled rollout's Job, the runner asks the gateway for the
rollout's state every `cancel_poll_seconds` while its agent runs (`GET /api/rollouts/{id}`, with the
rollout's own token); once the gateway has ended it (cancelled, timed out, any terminal state) or forgotten
it, the runner kills the agent's process group (the agent runs in a session of its own, so its children go
too) and claims the next rollout. Nothing is reported for it: the gateway already holds its end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from asyncrl.agent_templates.render import TemplateError, render_job
from asyncrl.gateway_api import paths
from asyncrl.gateway_api.models import RolloutView
from asyncrl.gateway_api.pool import PoolAssignment, PoolClaim, PoolOutcome
from asyncrl.rollouts import RolloutState
from asyncrl.workloads import names
from asyncrl.workloads.agent_jobs import agent_launch, agent_process
from asyncrl.workloads.names import ATTEMPT_ID
from asyncrl.workloads.pool import POOL_TOKEN_ENV, WORKER_ENV

logger = logging.getLogger(__name__)

RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)
CANCEL_POLL_SECONDS = 2.0
STOPPED = "the agent pool pod stopped (deleted or scaled down) during this rollout; not rerun"


@dataclass(frozen=True)
class PoolSettings:
    gateway_url: str  # what the pool pod (and its agents) reach the gateway through
    token: str
    worker: str
    template: str
    run_name: str
    namespace: str
    timeout_seconds: float  # spec.rolloutTimeoutSeconds, unless the rollout has its own
    cancel_poll_seconds: float = CANCEL_POLL_SECONDS  # how often a running rollout's state is read


def pool_agent_process(
    job: Mapping[str, Any], agent_env: Mapping[str, str], pod_env: Mapping[str, str]
) -> tuple[list[str], dict[str, str]]:
    """argv and env of the rendered Job's first container, as the pool pod runs it.

    The env starts from the pod's own (which holds the template's `valueFrom` entries, resolved by the
    kubelet for the pool's container), without the pool token; then the rendered `value`s; then AGL_*."""
    inherited = {name: value for name, value in pod_env.items() if name not in (POOL_TOKEN_ENV, WORKER_ENV)}
    argv, added = agent_process(
        job,
        agent_env,
        inherited=inherited,
        why_a_command="agents.mode Pool runs the template's command inside the pool pod (the image's "
        "entrypoint is the pool runner), so give a command",
    )
    return argv, {**inherited, **added}


class PoolGateway:
    """The pool routes over HTTP, waiting out a gateway that is starting or restarting."""

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self.http = httpx.AsyncClient(
            base_url=settings.gateway_url.rstrip("/"),
            headers={"authorization": f"Bearer {settings.token}"},
            timeout=httpx.Timeout(30.0, read=330.0),
        )

    async def close(self) -> None:
        await self.http.aclose()

    async def _post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        attempt = 0
        while True:
            try:
                response = await self.http.post(path, json=body)
                if response.status_code < 500 and response.status_code != 429:
                    return response
            except httpx.TransportError as error:
                logger.debug("pool: %s failed: %s", path, error)
            await asyncio.sleep(RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)])
            attempt += 1

    async def claim(self, *, wait_seconds: float = 30.0) -> PoolAssignment:
        body = PoolClaim(worker=self.settings.worker, wait_seconds=wait_seconds).model_dump()
        response = await self._post(paths.POOL_CLAIM, body)
        if response.status_code != 200:
            raise RuntimeError(f"the gateway refused the pool claim: {response.status_code} {response.text}")
        return PoolAssignment.model_validate(response.json())

    async def report(self, rollout_id: str, state: RolloutState, message: str | None = None) -> bool:
        """Report an outcome; False when the gateway no longer takes it (cancelled, consumed, restarted)."""
        outcome = PoolOutcome(
            worker=self.settings.worker, state=state, message=message, attempt_id=ATTEMPT_ID
        )
        response = await self._post(paths.pool_transition_path(rollout_id), outcome.model_dump())
        if response.status_code != 200:
            logger.info("rollout %s: %s not taken: %s", rollout_id, state, response.text)
            return False
        return True

    async def ended(self, rollout_id: str, agent_key: str) -> str:
        """Return (a reason) once the gateway has ended the rollout or no longer knows it; polls until then.

        Reads with the rollout's own token: the pool token opens only the pool routes."""
        headers = {"authorization": f"Bearer {agent_key}"}
        while True:
            await asyncio.sleep(self.settings.cancel_poll_seconds)
            try:
                response = await self.http.get(paths.rollout_path(rollout_id), headers=headers)
            except httpx.TransportError as error:  # a restarting gateway: keep the agent, ask again
                logger.debug("rollout %s: state unknown: %s", rollout_id, error)
                continue
            if response.status_code == 404:
                return "the gateway no longer knows it"
            if response.status_code != 200:
                continue
            state = RolloutState(response.json()["state"])
            if state.is_terminal:
                return f"the gateway ended it ({state})"


class PoolRunner:
    def __init__(self, settings: PoolSettings, *, pod_env: Mapping[str, str] | None = None) -> None:
        self.settings = settings
        self.gateway = PoolGateway(settings)
        self.pod_env = dict(os.environ if pod_env is None else pod_env)
        self.completed = 0

    async def run(self, *, max_rollouts: int | None = None) -> None:
        try:
            while max_rollouts is None or self.completed < max_rollouts:
                assignment = await self.gateway.claim()
                for rollout_id in assignment.interrupted:
                    logger.warning(
                        "rollout %s: interrupted by a restart of this pod; failed, not rerun", rollout_id
                    )
                if assignment.rollout is None or assignment.agent_key is None:
                    continue
                await self.run_one(assignment.rollout, assignment.agent_key)
                self.completed += 1
        finally:
            await self.gateway.close()

    async def run_one(self, rollout: RolloutView, agent_key: str) -> None:
        settings = self.settings
        launch = agent_launch(
            rollout,
            run_name=settings.run_name,
            namespace=settings.namespace,
            job_name=names.agent_job_name(settings.run_name, rollout.rollout_id),
            gateway_url=settings.gateway_url,
            agent_token=agent_key,  # handed out by the gateway: this pod never holds the gateway key
        )
        try:
            argv, env = pool_agent_process(
                render_job(settings.template, launch.variables), launch.env, self.pod_env
            )
        except TemplateError as error:
            await self.gateway.report(rollout.rollout_id, RolloutState.FAILED, f"agent template: {error}")
            return
        # Running first: from here on, a restart of this pod fails the rollout rather than rerun it.
        if not await self.gateway.report(rollout.rollout_id, RolloutState.RUNNING):
            return
        timeout = rollout.timeout_seconds or settings.timeout_seconds
        try:
            state, message = await _execute(
                argv, env, timeout, ended=self.gateway.ended(rollout.rollout_id, agent_key)
            )
        except asyncio.CancelledError:  # the pod is stopping (SIGTERM): say so rather than leave it running
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self.gateway.report(rollout.rollout_id, RolloutState.FAILED, STOPPED), timeout=5
                )
            raise
        if state is None:  # the gateway ended it first: nothing to report
            logger.info("rollout %s: agent killed: %s", rollout.rollout_id, message)
            return
        await self.gateway.report(rollout.rollout_id, state, message)


async def _execute(
    argv: list[str], env: Mapping[str, str], timeout: float, *, ended: Coroutine[Any, Any, str]
) -> tuple[RolloutState | None, str | None]:
    """Run the agent to its end, its timeout, or the gateway's end of the rollout (`ended` returns first:
    state None). The agent leads a process group of its own; any way out but its own exit kills the group."""
    watching = asyncio.ensure_future(ended)
    try:
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                env=dict(env),
                stdin=asyncio.subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
                start_new_session=True,
            )
        except OSError as error:
            return RolloutState.FAILED, f"cannot start {argv[0]}: {error.strerror}"
        waiting = asyncio.ensure_future(process.wait())
        try:
            await asyncio.wait({waiting, watching}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if process.returncode is None:  # timed out, ended by the gateway, or the runner is stopping
                _kill_group(process)
                waiting.cancel()
        if not waiting.done() or waiting.cancelled():
            await process.wait()
            if watching.done() and not watching.cancelled():
                return None, watching.result()
            return RolloutState.TIMED_OUT, f"killed after {timeout:.0f}s"
    finally:
        watching.cancel()
    code = waiting.result()
    if code == 0:
        return RolloutState.SUCCEEDED, None
    return RolloutState.FAILED, f"agent exited with {code}"


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the agent's child process: SIGKILL when the runner dies, so no agent outlives its launch record."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the agent's process group (its pid: `start_new_session`), while the agent is not yet reaped,
    so the group id cannot belong to anyone else."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> PoolSettings:
    token = environ.get(POOL_TOKEN_ENV)
    if not token:
        raise SystemExit(f"{POOL_TOKEN_ENV} is not set: the operator gives pool pods the agent pool token")
    return PoolSettings(
        gateway_url=args.gateway_url,
        token=token,
        worker=environ.get(WORKER_ENV) or socket.gethostname(),
        template=Path(args.template_file).read_text(),
        run_name=args.run_name,
        namespace=args.namespace,
        timeout_seconds=float(args.rollout_timeout_seconds),
        cancel_poll_seconds=float(args.cancel_poll_seconds),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gateway-url", required=True, help="the gateway as agents reach it")
    parser.add_argument("--template-file", required=True, help="the agent Job template (Jinja)")
    parser.add_argument("--run-name", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--rollout-timeout-seconds", type=float, default=1800.0)
    parser.add_argument(
        "--cancel-poll-seconds",
        type=float,
        default=CANCEL_POLL_SECONDS,
        help="how often the state of the running rollout is read (its agent is killed once it ended)",
    )
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per claim and per state poll
    settings = settings_from_args(args, os.environ)
    logger.info(
        "agent pool worker %s of run %s: taking rollouts from %s",
        settings.worker,
        settings.run_name,
        settings.gateway_url,
    )
    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(_main(PoolRunner(settings)))
    return 0


async def _main(runner: PoolRunner) -> None:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    await runner.run()
