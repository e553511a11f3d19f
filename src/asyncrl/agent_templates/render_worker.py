"""The process that renders agent templates for the operator, so that no template can stall its event loop.

A template is code written by whoever creates a run: a nested `range(100000)` loop runs for hours, a string
multiplied by 10**9 takes gigabytes. The operator therefore sends each render to one of these workers
(`renderer.py`) and kills the worker when the render overruns its deadline; memory is capped here with
RLIMIT_AS. The protocol is one JSON line per request and per answer on stdin/stdout; the first line out is
`{"ready": true}`.

Run as `python -m asyncrl.agent_templates.render_worker '<RenderLimits as JSON>' <memory bytes>`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import asdict
from typing import IO, Any

from asyncrl.agent_templates.pod_policy import AgentPodPolicy, check_pod_policy, with_restricted_defaults
from asyncrl.agent_templates.render import DEFAULT_LIMITS, RenderLimits, TemplateError, render_job


def render_agent_job(
    source: str,
    variables: dict[str, Any],
    *,
    policy: AgentPodPolicy,
    sample: bool = False,
    limits: RenderLimits = DEFAULT_LIMITS,
) -> dict[str, Any]:
    """What a worker computes: the rendered Job, structurally checked, allowed by `policy` (and, under the
    restricted policy, with Pod Security "restricted"'s fields filled in where the template left them)."""
    job = render_job(source, variables, limits=limits, sample=sample)
    check_pod_policy(job, policy)
    if policy is AgentPodPolicy.RESTRICTED:
        return with_restricted_defaults(job)
    return job


def answer(request: dict[str, Any], limits: RenderLimits) -> dict[str, Any]:
    """The answer line to one request line."""
    try:
        job = render_agent_job(
            request["source"],
            request["variables"],
            policy=AgentPodPolicy(request["policy"]),
            sample=bool(request.get("sample")),
            limits=limits,
        )
    except TemplateError as error:
        return {"error": str(error), "row_dependent": error.row_dependent}
    except MemoryError:
        return {"error": "agent template used more memory than a render may (the render memory limit)"}
    except RecursionError:
        return {"error": "agent template nests too deeply to render"}
    return {"job": job}


def serve(requests: IO[bytes], answers: IO[bytes], limits: RenderLimits) -> None:
    answers.write(b'{"ready": true}\n')
    answers.flush()
    for line in requests:
        reply = answer(json.loads(line), limits)
        answers.write(json.dumps(reply).encode() + b"\n")
        answers.flush()


def die_with_parent() -> None:
    """Linux: be killed when the operator dies, even in the middle of a runaway render."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        with contextlib.suppress(OSError, AttributeError):
            pr_set_pdeathsig = 1
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def limit_memory(memory_bytes: int) -> None:
    if memory_bytes > 0:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def main(argv: list[str]) -> int:
    limits = RenderLimits(**json.loads(argv[0])) if argv else RenderLimits()
    limit_memory(int(argv[1]) if len(argv) > 1 else 0)
    die_with_parent()
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # a stray print can never corrupt the protocol
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        serve(sys.stdin.buffer, answers, limits)
    return 0


def limits_argument(limits: RenderLimits) -> str:
    return json.dumps(asdict(limits))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
