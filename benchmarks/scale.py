"""A window of many rollouts: how long the paused gateway waits for data, and what it costs.

    python benchmarks/scale.py                                  # 128 groups x 8 x 20 calls (full size)
    python benchmarks/scale.py --groups 16 --calls 4 --steps 3  # a few minutes on a shared 2-core machine

Real parts: the `asyncrl gateway` process, the trainer's `StepLoop` (window, prefetching, pause and drain),
and agents in their own process that claim rollouts and post every model call through the gateway's proxy to
an upstream (this script's `--serve-upstream` mode) answering `--response-tokens` tokens with log-probs for a
`--prompt-tokens` prompt, as vLLM does with `return_token_ids` and `logprobs`. Stand-in: the **update is a
sleep of fixed cost** (`--update-seconds`), no model, no GPU.

The loop prepares rows as groups complete (batched, in the background), so the paused gateway should serve
no events request. (The old path, every consumed rollout's events fetched at the pause, one request each, is
gone; docs/benchmarks.md keeps its figures.) `--capture` sets the gateway's capture mode (`compact`
or `full`); left out, the flag is not passed, so an older gateway (one without compact capture, given first
on PYTHONPATH) can be measured with the same script. Printed per run: gateway peak RSS (VmHWM), pause to
update start (median and max over steps after the first) and of it the pause request, events bytes moved per
step, events requests made while paused, trainer CPU seconds per step (this process: loop, client, adapter),
and how late after a resume the calls held through it (pause mode Hold) were answered: the agent's answer
less the moment the trainer sent the resume, p99 over every held call (the upstream answers at once, so no
generation time is in it; both processes read the same monotonic clock).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import KEY, MODEL, percentile, start_gateway, table, verdict

from asyncrl.testing.controlplane import free_port
from asyncrl.testing.processes import ServerProcess, start_server

TARGET_PAUSE_SECONDS = 1.0
TARGET_PAUSE_AT_FULL_SIZE_SECONDS = 0.1  # issue 27 item 4: at 128 x 8 x 20 calls
TARGET_RELEASE_P99_SECONDS = 0.05  # issue 27 item 4: a held call answered after the resume
TARGET_GATEWAY_BYTES = 2 * 1024**3


# -- the upstream: vLLM-shaped answers of realistic size ---------------------------------------------------


def serve_upstream(port: int, response_tokens: int) -> None:
    """vLLM's answer shape, at almost no cost here: the part that does not depend on the request is encoded
    once. (Encoding the whole answer per call with the standard library took about 2 ms of this process's CPU
    for 500 tokens, so the 64 calls a resume releases waited ~0.1 s on this stand-in alone, which a real vLLM
    does not add on top of its generation.)"""
    import msgspec
    from aiohttp import web

    logprobs = [{"token": "x", "logprob": -0.25, "bytes": [120], "top_logprobs": []}] * response_tokens
    choices = [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "x " * response_tokens},
            "logprobs": {"content": logprobs},
            "finish_reason": "length",
            "token_ids": [7] * response_tokens,
        }
    ]
    fixed = msgspec.json.encode({"choices": choices})
    tail = fixed[1:]  # without its `{`: spliced after the fields that depend on the request
    decode = msgspec.json.Decoder()

    async def chat(request: web.Request) -> web.Response:
        body = decode.decode(await request.read())
        prompt = " ".join(str(message.get("content", "")) for message in body.get("messages", []))
        prompt_ids = [len(word) for word in prompt.split()]
        head = msgspec.json.encode(
            {"id": "chatcmpl-bench", "object": "chat.completion", "model": body.get("model"),
             "prompt_token_ids": prompt_ids,
             "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": response_tokens}}
        )  # fmt: skip
        return web.Response(body=head[:-1] + b"," + tail, content_type="application/json")

    async def ready(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/ready", ready)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# -- the agents: claim, call through the proxy, reward, succeed --------------------------------------------


async def run_agents(
    gateway_url: str, *, calls: int, prompt_tokens: int, concurrency: int, calls_log: Path
) -> None:
    """Each model call's `sent answered` (monotonic seconds) goes to `calls_log`, a line each, written at once
    (this process is stopped by a signal)."""
    import aiohttp

    from asyncrl.gateway_api.client import GatewayClient
    from asyncrl.gateway_api.tokens import agent_token
    from asyncrl.rollouts import RolloutState

    prompt = " ".join(f"w{index % 97}" for index in range(prompt_tokens))
    slots = asyncio.Semaphore(concurrency)
    tasks: set[asyncio.Task[None]] = set()

    async def one(manager: GatewayClient, http: aiohttp.ClientSession, rollout_id: str) -> None:
        async with slots:
            headers = {"authorization": f"Bearer {agent_token(KEY, rollout_id)}"}
            base = f"{gateway_url}/proxy/rollout/{rollout_id}/attempt/a1/mode/train/openai/v1"
            try:
                await manager.transition(rollout_id, RolloutState.RUNNING, attempt_id="a1")
                for turn in range(calls):
                    body = {"model": MODEL, "messages": [{"role": "user", "content": f"{prompt} t{turn}"}]}
                    sent = time.monotonic()
                    for _ in range(600):  # Reject mode answers 429 while paused; Hold just waits
                        async with http.post(
                            f"{base}/chat/completions", json=body, headers=headers
                        ) as answer:
                            await answer.read()
                            if answer.status != 429:
                                break
                        await asyncio.sleep(0.2)
                    log.write(f"{sent} {time.monotonic()}\n")
                reward = {"event_type": "reward", "data": {"value": 1.0}}
                async with http.post(
                    f"{gateway_url}/api/rollouts/{rollout_id}/attempt/a1/events", json=reward, headers=headers
                ) as answer:
                    await answer.read()
                await manager.transition(rollout_id, RolloutState.SUCCEEDED, attempt_id="a1")
            except Exception as error:  # a rollout deleted or cancelled under us: the trainer moved on
                print(f"agent {rollout_id}: {error}", file=sys.stderr)

    timeout = aiohttp.ClientTimeout(total=None)
    log = calls_log.open("a", buffering=1)  # line-buffered: a line is written as the call ends
    async with GatewayClient(gateway_url, KEY) as manager, aiohttp.ClientSession(timeout=timeout) as http:
        while True:
            for rollout in await manager.claim(limit=256, wait_seconds=5, lease_seconds=3600):
                task = asyncio.create_task(one(manager, http, rollout.rollout_id))
                tasks.add(task)
                task.add_done_callback(tasks.discard)


# -- the trainer side: the real step loop with a fixed-cost update -----------------------------------------


@dataclasses.dataclass
class FixedCostBackend:
    """Stand-in for a training backend: the update sleeps `update_seconds`; nothing is trained."""

    upstream_url: str
    update_seconds: float
    version: int = 0
    rows_trained: int = 0

    serve_urls = property(lambda self: (self.upstream_url,))
    served_model = property(lambda self: MODEL)
    model_version = property(lambda self: self.version)

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def sleep(self) -> None: ...
    async def wake(self) -> None: ...

    async def update(self, rows: Sequence[Any], *, step: int) -> Any:
        from asyncrl.trainer.backends import UpdateMetrics

        await asyncio.sleep(self.update_seconds)
        self.rows_trained += len(rows)
        self.version = step + 1
        return UpdateMetrics(
            step=step, model_version=self.version, loss=0.0, grad_norm=0.0, reward_mean=0.0, reward_std=0.0,
            rows=len(rows), trained_tokens=0, total_tokens=0, seconds=self.update_seconds,
            tokens_per_second=0.0, clip_fraction=0.0, ppo_kl=0.0,
        )  # fmt: skip


def _measuring_client(gateway_url: str) -> Any:
    from asyncrl.gateway_api.client import GatewayClient

    class MeasuringClient(GatewayClient):
        def __init__(self) -> None:
            super().__init__(gateway_url, KEY, timeout_seconds=600)
            self.paused = False
            self.events_bytes = 0
            self.requests_while_paused = 0
            self.single_requests_while_paused = 0
            self.cpu_at_pause: list[float] = []
            self.pause_call_seconds: list[float] = []  # the pause request itself (the drain included)
            self.resumes_sent: list[float] = []  # monotonic
            self.drain_seconds: list[float] = []  # the drain as the gateway measured it
            self.spans: list[RequestSpan] = []  # every request this client made, for the release breakdown

        async def pause(self, **kwargs: Any) -> Any:
            self.cpu_at_pause.append(time.process_time())
            asked = time.monotonic()
            result = await super().pause(**kwargs)
            self.pause_call_seconds.append(time.monotonic() - asked)
            self.drain_seconds.append(result.drain_seconds)
            self.paused = True
            return result

        async def resume(self, *, model_version: int | None = None) -> dict[str, Any]:
            self.paused = False
            self.resumes_sent.append(time.monotonic())
            return await super().resume(model_version=model_version)

        async def _request(self, method: str, path: str, **kwargs: Any) -> Any:
            asked = time.monotonic()
            try:
                response = await super()._request(method, path, **kwargs)
            finally:
                self.spans.append(RequestSpan(request_kind(method, path), asked, time.monotonic()))
            if path.startswith("/api/rollouts") and path.endswith("/events"):  # one rollout's, or a batch
                self.events_bytes += len(response.content)
                self.requests_while_paused += self.paused
                self.single_requests_while_paused += self.paused and method == "GET"
            return response

    return MeasuringClient()


@dataclasses.dataclass(frozen=True)
class RequestSpan:
    kind: str  # request_kind()
    start: float  # monotonic, as the trainer sent it
    end: float  # monotonic, as its answer was read


def request_kind(method: str, path: str) -> str:
    """A trainer request's kind for the release breakdown: what it asks the gateway to do."""
    if path.endswith("/events"):
        return "events"
    if path.startswith("/proxy/"):
        return path.removeprefix("/proxy/")
    if path.startswith("/api/rollouts") and method in ("DELETE", "POST") and "delete" in path:
        return "delete"
    return f"{method} {path.split('?')[0]}"


def release_windows(
    calls: Sequence[tuple[float, float]], resumes: Sequence[float]
) -> list[tuple[float, float]]:
    """Per resume that released calls: (the resume, the answer of the last call it released)."""
    last: dict[float, float] = {}
    for resumed, answered in released_calls(calls, resumes):
        last[resumed] = max(last.get(resumed, 0.0), answered)
    return sorted(last.items())


def trainer_work_in_release(
    spans: Sequence[RequestSpan], windows: Sequence[tuple[float, float]]
) -> dict[str, tuple[int, float]]:
    """By request kind: how many of the trainer's requests ran while released calls were still being
    answered (between a resume and the last answer it released), and their seconds within those windows."""
    found: dict[str, tuple[int, float]] = {}
    for span in spans:
        if span.kind == "GET /api/completions":
            continue  # the long-poll: it waits on the feed, asking the gateway nothing meanwhile
        for start, end in windows:
            overlap = min(span.end, end) - max(span.start, start)
            if overlap > 0:
                count, seconds = found.get(span.kind, (0, 0.0))
                found[span.kind] = (count + 1, seconds + overlap)
    return dict(sorted(found.items(), key=lambda item: -item[1][1]))


def release_seconds(calls: Sequence[tuple[float, float]], resumes: Sequence[float]) -> list[float]:
    """For each call across a resume (held through it, or aborted at the pause and re-sent): its answer less
    the last resume before that answer (a released call may be aborted by the next pause and held again)."""
    return [answered - resumed for resumed, answered in released_calls(calls, resumes)]


def released_calls(
    calls: Sequence[tuple[float, float]], resumes: Sequence[float]
) -> list[tuple[float, float]]:
    """(the resume that released it, its answer) for each call across a resume: the last resume between
    the call's sending and its answer."""
    released = []
    for sent, answered in calls:
        crossed = [resumed for resumed in resumes if sent <= resumed < answered]
        if crossed:
            released.append((crossed[-1], answered))
    return released


def _peak_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _start_self(
    mode: list[str], log: Path, ready_url: str | None = None
) -> ServerProcess | subprocess.Popen[bytes]:
    """This script in another mode, as its own process group: the upstream (waited for) or the agents."""
    argv = [sys.executable, str(Path(__file__).resolve()), *mode]
    if ready_url is not None:
        return start_server(argv, ready_url=ready_url, log_path=log, timeout_seconds=60)
    with log.open("wb") as output:
        return subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: ServerProcess | subprocess.Popen[bytes]) -> None:
    if isinstance(process, ServerProcess):
        process.stop()
        return
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


async def _measure(args: argparse.Namespace, *, upstream_url: str, log_dir: Path) -> dict[str, Any]:
    from asyncrl.api.types.spec import AsyncSpec
    from asyncrl.trainer.adapter import AdapterConfig
    from asyncrl.trainer.data import PromptSource
    from asyncrl.trainer.loop import LoopSettings, StepLoop
    from asyncrl.trainer.metrics import JsonLinesSink, MetricsSinks

    capture = [f"--capture={args.capture}"] if args.capture else []
    gateway, gateway_url = start_gateway(upstream_url, log_dir, *capture, name="gateway")
    calls_log = log_dir / "calls.txt"
    agents = _start_self(
        ["--agents", gateway_url, "--calls", str(args.calls), "--prompt-tokens", str(args.prompt_tokens),
         "--agent-concurrency", str(args.agent_concurrency), "--calls-log", str(calls_log)],
        log_dir / "agents.log",
    )  # fmt: skip
    train_batch = args.train_batch or max(1, args.groups // 2)
    settings = LoopSettings(
        window=AsyncSpec(enabled=True, window_size=args.groups, refill_during_collection=True).window_config(
            train_batch_size=train_batch, samples_per_prompt=args.rollouts
        ),
        adapter=AdapterConfig(
            max_prompt_tokens=args.prompt_tokens + 64, max_response_tokens=args.response_tokens
        ),
        rollout_timeout_seconds=3600,
        total_steps=args.steps,
        checkpoint_dir=None,
        checkpoint_every_steps=1,
        drain_timeout_seconds=600,
    )
    metrics_path = log_dir / "metrics.jsonl"
    backend = FixedCostBackend(upstream_url, args.update_seconds)
    client = _measuring_client(gateway_url)
    started = time.monotonic()
    try:
        async with client:
            loop = StepLoop(
                settings=settings,
                gateway=client,
                backend=backend,
                prompts=PromptSource([{"prompt": f"p{i}"} for i in range(100_000)], shuffle=False, seed=0),
                sinks=MetricsSinks([JsonLinesSink(metrics_path)]),
            )
            await loop.run()
        peak = _peak_rss_bytes(gateway.process.pid)
    finally:
        _stop(agents)
        gateway.stop()
    lines = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    measured = lines[1:] or lines  # the first step also fills the window
    pauses = [line["timing/pause_to_update_seconds"] for line in measured]
    pause_calls = client.pause_call_seconds[1:] or client.pause_call_seconds
    cpu = [b - a for a, b in zip(client.cpu_at_pause, client.cpu_at_pause[1:], strict=False)]
    calls = [
        (float(sent), float(answered))
        for sent, answered in (
            line.split() for line in calls_log.read_text().splitlines() if line.count(" ") == 1
        )
    ]
    released = release_seconds(calls, client.resumes_sent)
    windows = release_windows(calls, client.resumes_sent)
    return {
        "gateway_peak_bytes": peak,
        "pause_median": statistics.median(pauses),
        "pause_max": max(pauses),
        "pause_call_median": statistics.median(pause_calls) if pause_calls else float("nan"),
        "bytes_per_step": client.events_bytes / len(lines),
        "requests_while_paused": client.requests_while_paused,
        "single_requests_while_paused": client.single_requests_while_paused,
        "cpu_per_step": statistics.median(cpu) if cpu else float("nan"),
        "held_calls": len(released),
        "release_p99": percentile(released, 99),
        "release_max": max(released, default=float("nan")),
        "release_windows": [end - start for start, end in windows],
        "trainer_work_in_release": trainer_work_in_release(client.spans, windows),
        "rows": backend.rows_trained,
        "seconds": time.monotonic() - started,
        "train_batch": train_batch,
    }


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="asyncrl-scale-") as tmp:
        log_dir = Path(tmp)
        port = free_port()
        upstream = _start_self(
            ["--serve-upstream", str(port), "--response-tokens", str(args.response_tokens)],
            log_dir / "upstream.log",
            ready_url=f"http://127.0.0.1:{port}/ready",
        )
        try:
            result = await _measure(args, upstream_url=f"http://127.0.0.1:{port}", log_dir=log_dir)
        finally:
            _stop(upstream)
    train_batch = result["train_batch"]
    print(
        f"window {args.groups} groups x {args.rollouts} rollouts x {args.calls} calls of "
        f"{args.prompt_tokens} + {args.response_tokens} tokens; "
        f"trainBatchSize {train_batch}; {args.steps} steps; "
        f"stand-in update: sleep {args.update_seconds}s; agent calls through the gateway's proxy; "
        f"capture {args.capture or 'the default'}"
    )
    print(
        table(
            ["gateway peak", "pause->update median", "max", "pause call median", "events MB/step",
             "requests paused", "per-rollout paused", "trainer CPU s/step", "held calls",
             "release p99", "max", "rows", "wall s"],
            [
                [f"{r['gateway_peak_bytes'] / 1024**2:.0f} MiB", f"{r['pause_median']:.3f}s",
                 f"{r['pause_max']:.3f}s", f"{r['pause_call_median']:.3f}s",
                 f"{r['bytes_per_step'] / 1e6:.1f}", r["requests_while_paused"],
                 r["single_requests_while_paused"], f"{r['cpu_per_step']:.2f}", r["held_calls"],
                 f"{r['release_p99'] * 1000:.0f} ms", f"{r['release_max'] * 1000:.0f} ms", r["rows"],
                 f"{r['seconds']:.0f}"]
                for r in [result]
            ],
        )
    )  # fmt: skip
    work = ", ".join(
        f"{kind} {count} x, {seconds * 1000:.0f} ms"
        for kind, (count, seconds) in result["trainer_work_in_release"].items()
    )
    windows_ms = ", ".join(f"{seconds * 1000:.0f}" for seconds in result["release_windows"])
    print(f"release windows (a resume to the last call it released answered), ms: {windows_ms or 'none'}")
    print(f"the trainer's requests to the gateway within them: {work or 'none'}")
    print(
        verdict(
            "pause to update start <= 1 s",
            result["pause_max"] <= TARGET_PAUSE_SECONDS,
            f"{result['pause_max']:.3f}s",
        )
    )
    full_size = (args.groups, args.rollouts, args.calls) == (128, 8, 20)
    print(
        verdict(
            "pause to update start <= 0.1 s (median; the target holds at 128 x 8 x 20 calls)"
            + ("" if full_size else ", not this size"),
            result["pause_median"] <= TARGET_PAUSE_AT_FULL_SIZE_SECONDS,
            f"{result['pause_median']:.3f}s",
        )
    )
    print(
        verdict(
            "held calls answered <= 50 ms after the resume (p99)",
            result["release_p99"] <= TARGET_RELEASE_P99_SECONDS,
            f"{result['release_p99'] * 1000:.0f} ms over {result['held_calls']} held calls",
        )
    )
    print(
        verdict(
            "gateway peak <= 2 GiB",
            result["gateway_peak_bytes"] <= TARGET_GATEWAY_BYTES,
            f"{result['gateway_peak_bytes'] / 1024**2:.0f} MiB",
        )
    )
    print(
        verdict(
            "no per-rollout request at pause time",
            result["single_requests_while_paused"] == 0,
            str(result["single_requests_while_paused"]),
        )
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=128, help="asyncWindowSize (prompt groups in flight)")
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per group (samplesPerPrompt)")
    parser.add_argument("--calls", type=int, default=20, help="model calls per rollout")
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--response-tokens", type=int, default=500)
    parser.add_argument("--train-batch", type=int, default=None, help="trainBatchSize (default groups / 2)")
    parser.add_argument("--steps", type=int, default=3, help="updates (the first is not measured)")
    parser.add_argument("--update-seconds", type=float, default=2.0, help="cost of the stand-in update")
    parser.add_argument("--agent-concurrency", type=int, default=64, help="rollouts the agents run at once")
    parser.add_argument(
        "--capture",
        choices=["compact", "full"],
        default=None,
        help="the gateway's --capture (default: not passed, so a gateway without the flag can be measured)",
    )
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--agents", help=argparse.SUPPRESS)
    parser.add_argument("--calls-log", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    arguments = parse_args()
    if arguments.serve_upstream:
        serve_upstream(arguments.serve_upstream, arguments.response_tokens)
    elif arguments.agents:
        asyncio.run(
            run_agents(
                arguments.agents,
                calls=arguments.calls,
                prompt_tokens=arguments.prompt_tokens,
                concurrency=arguments.agent_concurrency,
                calls_log=arguments.calls_log,
            )
        )
    else:
        asyncio.run(main(arguments))
