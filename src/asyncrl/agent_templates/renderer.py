"""Render agent templates off the operator's event loop: a small pool of worker processes with a deadline.

Every run of an operator shares one event loop, so a render that blocks it for a minute stalls all runs. A
thread could not be stopped; a process can: a render that overruns `timeout_seconds` gets its worker killed
(and a fresh one started for the next render), and its rollout fails with the limit named. A few workers
let a healthy run's renders proceed while another run's template burns its deadline.

Why not pebble's ProcessPool (issue 26 §5), which has the per-task timeout and the kill-and-replace: weighed
on 2026-12-04 with pebble 5.2.3, it would save about 60 of these lines but not keep the guarantees. A worker
that dies while idle (the OOM killer, say) puts the whole pool in an error state ("Unexpected error within
the Pool" for every later render, until the operator restarts), where here the next render starts a fresh
worker (tested). It forks from the operator's threaded process unless given a spawn context, answers a
timeout with SIGTERM and up to 3 s of grace before SIGKILL from a thread that polls every 0.1 s, and adds
three threads and an LGPL dependency. Our worker is a plain `python -m` process speaking JSON lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncrl.agent_templates import render_worker
from asyncrl.agent_templates.job_schema import job_schema_problems
from asyncrl.agent_templates.pod_policy import AgentPodPolicy
from asyncrl.agent_templates.render import RenderLimits, TemplateError, sample_variables

logger = logging.getLogger(__name__)

WORKER_START_SECONDS = 60.0  # a cold Python start on a loaded machine; not part of any render's deadline


class RendererUnavailable(RuntimeError):
    """A render worker could not be started: the operator's problem, not the template's."""


@dataclass(frozen=True)
class RenderSettings:
    """How the operator renders agent templates (flags of `asyncrl operator`)."""

    policy: AgentPodPolicy = AgentPodPolicy.RESTRICTED
    timeout_seconds: float = 5.0  # per render, in the worker
    workers: int = 2
    memory_bytes: int = 256 * 1024 * 1024  # address space of a worker (RLIMIT_AS)
    limits: RenderLimits = field(default_factory=RenderLimits)


class _Worker:
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, settings: RenderSettings) -> _Worker:
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                render_worker.__name__,
                render_worker.limits_argument(settings.limits),
                str(settings.memory_bytes),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=settings.limits.max_job_bytes + 1024 * 1024,  # one answer line
            )
        except OSError as error:
            raise RendererUnavailable(f"cannot start a template render worker: {error}") from error
        worker = cls(process)
        try:
            ready = await asyncio.wait_for(worker._read(), WORKER_START_SECONDS)
        except (TimeoutError, ValueError, OSError) as error:
            worker.kill()
            raise RendererUnavailable(f"the template render worker did not start: {error!r}") from error
        if ready != {"ready": True}:
            worker.kill()
            raise RendererUnavailable(f"the template render worker did not start: it said {ready!r}")
        return worker

    async def _read(self) -> Any:
        assert self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            raise EOFError(f"exited with code {await self.process.wait()}")
        return json.loads(line)

    async def request(self, payload: Mapping[str, Any], timeout_seconds: float) -> dict[str, Any]:
        """The answer; TimeoutError past the deadline, EOFError/ValueError when the worker died or garbled."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(payload).encode() + b"\n")
        await self.process.stdin.drain()
        answer: dict[str, Any] = await asyncio.wait_for(self._read(), timeout_seconds)
        return answer

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()


class TemplateRenderer:
    """Renders agent Jobs in worker processes; shared by every run of the operator."""

    def __init__(self, settings: RenderSettings | None = None) -> None:
        self.settings = settings or RenderSettings()
        self._slots = asyncio.Semaphore(self.settings.workers)
        self._idle: list[_Worker] = []
        self._reaping: set[asyncio.Task[int]] = set()
        self.workers_started = 0  # for metrics and tests: a killed worker is replaced

    async def render(
        self, source: str, variables: Mapping[str, Any], *, sample: bool = False
    ) -> dict[str, Any]:
        """The rendered, checked agent Job; or TemplateError with a one-line reason (naming any limit hit)."""
        payload = {
            "source": source,
            "variables": dict(variables),
            "sample": sample,
            "policy": str(self.settings.policy),
        }
        async with self._slots:
            worker = self._take_idle() or await self._start_worker()
            healthy = False
            try:
                answer = await worker.request(payload, self.settings.timeout_seconds)
                healthy = True
            except TimeoutError:
                raise TemplateError(
                    f"agent template took longer than {self.settings.timeout_seconds:g} s to render "
                    "(the render time limit, --template-render-seconds); is a loop running away?"
                ) from None
            except (EOFError, ValueError, OSError) as error:
                raise TemplateError(
                    f"agent template: the render worker died while rendering ({error}); the template may use "
                    f"more than the render memory limit ({self.settings.memory_bytes // 2**20} MiB)"
                ) from None
            finally:
                if healthy:
                    self._idle.append(worker)
                else:
                    self._discard(worker)  # timed out, died, or our caller was cancelled mid-render
        if "error" in answer:
            raise TemplateError(str(answer["error"]), row_dependent=bool(answer.get("row_dependent")))
        job: dict[str, Any] = answer["job"]
        return job

    def _take_idle(self) -> _Worker | None:
        """An idle worker that is still alive: one that died while idle (the OOM killer, say) is replaced,
        not blamed on the next rollout's template."""
        while self._idle:
            worker = self._idle.pop()
            if worker.process.returncode is None:
                return worker
            self._discard(worker)
        return None

    async def _start_worker(self) -> _Worker:
        worker = await _Worker.start(self.settings)
        self.workers_started += 1
        return worker

    def _discard(self, worker: _Worker) -> None:
        worker.kill()
        reaper = asyncio.create_task(worker.process.wait())
        self._reaping.add(reaper)
        reaper.add_done_callback(self._reaping.discard)

    async def close(self) -> None:
        workers, self._idle = self._idle, []
        for worker in workers:
            self._discard(worker)
        await asyncio.gather(*self._reaping, return_exceptions=True)


async def check_template(
    renderer: TemplateRenderer,
    source: str,
    *,
    first_row: Any | None,
    run_name: str,
    namespace: str,
    job_name: str,
    attempt_id: str,
) -> str | None:
    """Why `source` cannot give a valid agent Job, from a render for a sample row; None when it can.

    `first_row`: the run's first inline row; None renders a placeholder row (data from a ConfigMap or a file
    is not read by the operator), where a name missing from the row cannot be told from a template bug and is
    not reported."""
    variables = sample_variables(
        first_row, run_name=run_name, namespace=namespace, job_name=job_name, attempt_id=attempt_id
    )
    try:
        job = await renderer.render(source, variables, sample=first_row is None)
    except TemplateError as error:
        if first_row is None and error.row_dependent:
            logger.info(
                "run %s: the template check for a placeholder row was inconclusive: %s", run_name, error
            )
            return None
        return str(error)
    # Fields the Job schema lacks (the API server would drop `comand:`), labels and quantities it refuses
    problems = job_schema_problems(job, check_scalars=first_row is not None)
    return f"agent template: {'; '.join(problems)}" if problems else None
