"""The gateway's upstream client, aiohttp or httpx: what each costs per model call (issue 26 §5).

Why it exists
    The gateway forwards every model call to vLLM with aiohttp; everything else in the project (the trainer,
    the operator, agents, local mode) uses httpx. Two HTTP client libraries are worth keeping only if the
    gateway's hot path measurably needs aiohttp. The gateway's relay is written against aiohttp's streaming
    and error types, so it cannot switch clients by a flag; this script measures the two clients side by
    side instead, each configured as the gateway configures its upstream client (a pooled session with no
    connection cap and a short keep-alive), against the same local server.

What it measures
    One real process on 127.0.0.1: the fake OpenAI-compatible upstream (`asyncrl.fake_upstream`,
    zero delay, an aiohttp server as the gateway's tests use). A closed-loop load generator in this process
    (uvloop, as the gateway runs; every client sends its next request as soon as its last one answered) posts
    tiny chat bodies to /v1/chat/completions, non-streaming (the JSON body read whole) and streaming
    (`stream: true`, the server-sent events read chunk by chunk as the gateway relays them), with
    --clients concurrent clients and with 1, through aiohttp.ClientSession and through httpx.AsyncClient.
    Each phase has --warmup seconds (not counted) and --duration measured seconds.

How to read it
    req/s and p50/p99 (ms, per request, seen by the client) under load, and the client's CPU time per
    request (this process, from /proc): the cost the gateway pays per forwarded call. On a 2-core machine the
    client and the upstream share the cores, so under load latency is mostly queueing and req/s is bounded by
    whichever side is slower; the CPU per request moves least with the machine's other load.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
from _common import TINY_CHAT, cpu_seconds, ms, percentile, run_client, start_upstream, table

KEEP_ALIVE_SECONDS = 3.0  # the gateway's UPSTREAM_KEEP_ALIVE_SECONDS
CHAT_PATH = "/v1/chat/completions"

Call = Callable[[bool], Awaitable[None]]  # one request; True: streaming


@dataclass
class Phase:
    client: str
    streaming: bool
    clients: int
    requests: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    p50: float = math.nan
    p99: float = math.nan

    def row(self) -> list[object]:
        rate = self.requests / self.seconds if self.seconds else math.nan
        cpu_us = self.cpu_seconds / self.requests * 1e6 if self.requests else math.nan
        mode = "stream" if self.streaming else "json"
        return [self.client, mode, self.clients, f"{rate:,.0f}", ms(self.p50), ms(self.p99), f"{cpu_us:,.0f}"]


def aiohttp_caller(session: aiohttp.ClientSession, url: str) -> Call:
    async def call(streaming: bool) -> None:
        async with session.post(url, json={**TINY_CHAT, "stream": streaming}) as response:
            response.raise_for_status()
            if streaming:
                async for _chunk in response.content.iter_any():
                    pass
            else:
                await response.read()

    return call


def httpx_caller(client: httpx.AsyncClient, url: str) -> Call:
    async def call(streaming: bool) -> None:
        async with client.stream("POST", url, json={**TINY_CHAT, "stream": streaming}) as response:
            response.raise_for_status()
            if streaming:
                async for _chunk in response.aiter_raw():
                    pass
            else:
                await response.aread()

    return call


async def closed_loop(call: Call, phase: Phase, *, warmup: float, duration: float) -> None:
    latencies: list[float] = []
    started = time.monotonic()
    measure_from = started + warmup
    stop_at = measure_from + duration
    cpu_at_start: list[float] = []

    async def client() -> None:
        while (now := time.monotonic()) < stop_at:
            await call(phase.streaming)
            done = time.monotonic()
            if now >= measure_from:
                latencies.append(done - now)

    async def mark_start() -> None:
        await asyncio.sleep(warmup)
        cpu_at_start.append(cpu_seconds())

    await asyncio.gather(mark_start(), *(client() for _ in range(phase.clients)))
    phase.cpu_seconds = cpu_seconds() - cpu_at_start[0]
    phase.seconds = time.monotonic() - measure_from
    phase.requests = len(latencies)
    phase.p50 = percentile(latencies, 50)
    phase.p99 = percentile(latencies, 99)


async def measure(upstream_url: str, args: argparse.Namespace) -> list[Phase]:
    url = upstream_url + CHAT_PATH
    phases: list[Phase] = []
    for streaming in (False, True):
        for clients in (args.clients, 1):
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEP_ALIVE_SECONDS)
            async with aiohttp.ClientSession(connector=connector) as session:
                phase = Phase("aiohttp", streaming, clients)
                await closed_loop(
                    aiohttp_caller(session, url), phase, warmup=args.warmup, duration=args.duration
                )
                phases.append(phase)
            limits = httpx.Limits(max_connections=None, keepalive_expiry=KEEP_ALIVE_SECONDS)
            async with httpx.AsyncClient(limits=limits, timeout=60.0) as http:
                phase = Phase("httpx", streaming, clients)
                await closed_loop(httpx_caller(http, url), phase, warmup=args.warmup, duration=args.duration)
                phases.append(phase)
            print(table(HEADERS, [p.row() for p in phases[-2:]]), flush=True)
    return phases


HEADERS = ["client", "body", "clients", "req/s", "p50 ms", "p99 ms", "client CPU us/req"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients under load (%(default)s)")
    parser.add_argument(
        "--warmup", type=float, default=1.0, help="seconds per phase not counted (%(default)s)"
    )
    parser.add_argument(
        "--duration", type=float, default=5.0, help="measured seconds per phase (%(default)s)"
    )
    args = parser.parse_args()
    print(f"python {sys.version.split()[0]}, aiohttp {aiohttp.__version__}, httpx {httpx.__version__}")
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp:
        upstream, upstream_url = start_upstream(Path(tmp))
        try:
            phases = run_client(lambda: measure(upstream_url, args))
        finally:
            upstream.stop()
    print()
    print(table(HEADERS, [p.row() for p in phases]))
    by_key = {(p.client, p.streaming, p.clients): p for p in phases}
    for streaming in (False, True):
        fast, slow = by_key["aiohttp", streaming, args.clients], by_key["httpx", streaming, args.clients]
        if not (fast.requests and slow.requests):
            continue
        rate = (fast.requests / fast.seconds) / (slow.requests / slow.seconds)
        cpu = (slow.cpu_seconds / slow.requests) / (fast.cpu_seconds / fast.requests)
        body = "stream" if streaming else "json"
        print(f"{body}, {args.clients} clients: aiohttp {rate:.1f}x httpx's req/s; ", end="")
        print(f"httpx {cpu:.1f}x aiohttp's CPU per request")


if __name__ == "__main__":
    main()
