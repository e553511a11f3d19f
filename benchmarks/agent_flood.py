"""One agent floods the gateway with large bodies: what another rollout's model calls and the trainer see.

What it measures
    Real fake-upstream and gateway processes on 127.0.0.1 (issue 24 item 3). One agent token sends, from
    `--concurrency` parallel loops for `--seconds`, bodies of `--containers` empty objects (`{}`, 1.9 million
    by default: the issue's 5.7 MB), half to its events route and half to its model-call proxy route, each
    retried at once whatever the answer (429s included; a client that ignores Retry-After). Meanwhile:

    victim    another rollout's agent makes one small model call after another (its latency);
    trainer   the gateway key reads GET /api/stats after another, and pauses and resumes every 2 s;
    healthz   an unauthenticated GET /healthz after another.

    It prints each one's p50/p99/max latency, the attacker's answers by status, and the gateway's CPU seconds.
    `--pythonpath DIR` measures another copy of `asyncrl` (e.g. the previous commit's `src`) the same way.

Targets (issue 24 item 3)
    Under the flood, the victim's model-call p99 < 200 ms and every trainer call < 1 s.

Run
    .venv/bin/python benchmarks/agent_flood.py [--seconds 40] [--concurrency 16] [--containers 1900000]
        [--pythonpath /tmp/old/src]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from benchmarks._common import (
    TINY_CHAT,
    agent_headers,
    cpu_seconds,
    management_headers,
    ms,
    percentile,
    proxy_path,
    run_client,
    running_servers,
    table,
    verdict,
)

ATTACKER = "flood-r1"
VICTIM = "calm-r1"


@dataclass
class Latencies:
    seconds: list[float] = field(default_factory=list)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)

    def row(self, name: str) -> list[object]:
        values = self.seconds
        worst = max(values) if values else float("nan")
        errors = ", ".join(f"{k} x{v}" for k, v in self.errors.items()) or "-"
        return [name, len(values), ms(percentile(values, 50)), ms(percentile(values, 99)), ms(worst), errors]


async def _timed(latencies: Latencies, request: httpx.Request, client: httpx.AsyncClient) -> None:
    started = time.perf_counter()
    try:
        response = await client.send(request)
    except httpx.HTTPError as error:
        latencies.errors[type(error).__name__] += 1
        return
    latencies.seconds.append(time.perf_counter() - started)
    if response.status_code >= 400:
        latencies.errors[str(response.status_code)] += 1


async def _measure(clients: dict[str, httpx.AsyncClient], seconds: float) -> dict[str, Latencies]:
    """The victim's, the trainer's and a probe's calls, one after another each, for `seconds`."""
    admin, victim, anyone = clients["admin"], clients["victim"], clients["anyone"]
    measured = {name: Latencies() for name in ("victim model call", "trainer stats", "trainer pause/resume")}
    measured["healthz"] = Latencies()
    deadline = time.perf_counter() + seconds

    async def victim_calls() -> None:
        while time.perf_counter() < deadline:
            request = victim.build_request("POST", proxy_path(VICTIM), json=TINY_CHAT)
            await _timed(measured["victim model call"], request, victim)

    async def trainer_stats() -> None:
        while time.perf_counter() < deadline:
            await _timed(measured["trainer stats"], admin.build_request("GET", "/api/stats"), admin)
            await asyncio.sleep(0.05)

    async def trainer_pauses() -> None:
        while time.perf_counter() < deadline:
            await asyncio.sleep(2)
            pause = admin.build_request("POST", "/proxy/pause", json={"reason": "flood benchmark"})
            await _timed(measured["trainer pause/resume"], pause, admin)
            resume = admin.build_request("POST", "/proxy/resume", json={"model_version": 1})
            await _timed(measured["trainer pause/resume"], resume, admin)

    async def health() -> None:
        while time.perf_counter() < deadline:
            await _timed(measured["healthz"], anyone.build_request("GET", "/healthz"), anyone)
            await asyncio.sleep(0.05)

    await asyncio.gather(victim_calls(), trainer_stats(), trainer_pauses(), health())
    return measured


def _report(title: str, measured: dict[str, Latencies], cpu: float, seconds: float) -> None:
    print(f"\n{title} (gateway CPU {cpu:.1f} s over {seconds:g} s)")
    rows = [latencies.row(name) for name, latencies in measured.items()]
    print(table(["who", "calls", "p50 ms", "p99 ms", "max ms", "errors"], rows))


async def flood(args: argparse.Namespace, gateway_url: str, gateway_pid: int | None) -> None:
    timeout = httpx.Timeout(300)
    print(f"attack bodies: {args.containers} empty objects (about {3 * args.containers / 1e6:.1f} MB) each")
    async with (
        httpx.AsyncClient(base_url=gateway_url, headers=management_headers(), timeout=timeout) as admin,
        httpx.AsyncClient(base_url=gateway_url, headers=agent_headers(VICTIM), timeout=timeout) as victim,
        httpx.AsyncClient(base_url=gateway_url, timeout=timeout) as anyone,
    ):
        rollouts = [{"rollout_id": rid, "group_id": "g", "step": 0} for rid in (ATTACKER, VICTIM)]
        (await admin.post("/api/rollouts", json=rollouts)).raise_for_status()
        for rid in (ATTACKER, VICTIM):
            transition = {"state": "running", "attempt_id": "a1"}
            (await admin.post(f"/api/rollouts/{rid}/transition", json=transition)).raise_for_status()
        clients = {"admin": admin, "victim": victim, "anyone": anyone}

        cpu_before = cpu_seconds(gateway_pid)
        quiet = await _measure(clients, args.quiet_seconds)
        _report("without the flood", quiet, cpu_seconds(gateway_pid) - cpu_before, args.quiet_seconds)

        # The attacker is its own process, so its uploads do not slow this process's measurements down.
        context = multiprocessing.get_context("spawn")
        counts: Any = context.Manager().dict()
        attacker = context.Process(
            target=_attack_process,
            args=(gateway_url, args.concurrency, args.containers, args.seconds, counts),
        )
        attacker.start()
        cpu_before = cpu_seconds(gateway_pid)
        flooded = await _measure(clients, args.seconds)
        cpu = cpu_seconds(gateway_pid) - cpu_before
        attacker.join(300)
    _report(f"under the flood ({args.concurrency} parallel loops of one agent)", flooded, cpu, args.seconds)
    print("attacker answers:", ", ".join(f"{k} x{v}" for k, v in sorted(dict(counts).items())))
    victim_p99 = percentile(flooded["victim model call"].seconds, 99)
    trainer = flooded["trainer stats"].seconds + flooded["trainer pause/resume"].seconds
    trainer_worst = max(trainer) if trainer else float("nan")
    print(verdict("victim model-call p99 < 200 ms", victim_p99 < 0.2, f"{ms(victim_p99)} ms"))
    print(verdict("every trainer call < 1 s", trainer_worst < 1.0, f"max {ms(trainer_worst)} ms"))
    print(
        f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs"
    )


def _attack_process(
    gateway_url: str, concurrency: int, containers: int, seconds: float, counts: dict[str, int]
) -> None:
    """The flooding agent: raw HTTP/1.1 over asyncio streams, half its loops on its events route, half on
    its model-call route, each sending the next body as soon as it has the answer (or the close)."""
    host, port = gateway_url.removeprefix("http://").split(":")
    items = b",".join([b"{}"] * containers)
    bodies = {
        "event": (
            f"/api/rollouts/{ATTACKER}/attempt/a1/events",
            b'{"event_type":"note","data":{"d":[' + items + b"]}}",
        ),
        "call": (proxy_path(ATTACKER), b'{"model":"m","messages":[' + items + b"]}"),
    }
    token = agent_headers(ATTACKER)["authorization"]
    local: collections.Counter[str] = collections.Counter()

    async def loop(kind: str, deadline: float) -> None:
        path, body = bodies[kind]
        head = (
            f"POST {path} HTTP/1.1\r\nhost: gateway\r\nauthorization: {token}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        while time.perf_counter() < deadline:
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(head + body)
                status = (await asyncio.wait_for(reader.readline(), 300)).split(b" ")[1:2]
                local[f"{kind} {status[0].decode() if status else 'closed'}"] += 1
                writer.close()
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as error:
                local[f"{kind} {type(error).__name__}"] += 1

    async def run() -> None:
        deadline = time.perf_counter() + seconds
        await asyncio.gather(*(loop("event" if n % 2 else "call", deadline) for n in range(concurrency)))

    asyncio.run(run())
    counts.update(local)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=40, help="of the flood")
    parser.add_argument("--quiet-seconds", type=float, default=10, help="measured first, without the flood")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--containers", type=int, default=1_900_000)
    parser.add_argument("--pythonpath", default=None, help="measure this copy of asyncrl instead")
    args = parser.parse_args()

    async def run() -> None:
        with running_servers(pythonpath=args.pythonpath) as servers:
            await flood(args, servers.gateway_url, servers.gateway.process.pid)

    run_client(run)


if __name__ == "__main__":
    main()
