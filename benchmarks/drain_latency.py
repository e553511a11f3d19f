"""Drain latency: how soon after the last in-flight model call ends the trainer learns the gateway is drained.

What it measures
    Real fake-upstream and gateway processes on 127.0.0.1. Each round starts K model calls through the gateway
    proxy (one rollout each) whose upstream answers after known, staggered delays (`fake_delay_seconds`,
    drawn each round from [--min-delay, --max-delay] with a fixed seed and sorted), waits until the gateway
    counts all K in flight, then pauses the gateway and waits for the drain in one of two ways:

    server-wait   POST /proxy/pause?wait=30: the gateway answers the moment its in-flight count reaches 0
                  (our design: an asyncio.Event set by the call that finishes last).
    seed-poll     the seed's method, emulated: POST /proxy/pause (no wait), then GET /proxy/state every
                  0.25 s until inflight == 0 (Agent Lightning's `_pause_and_drain_gateway`).

    The gap is (time the waiting client got its "drained" answer) - (time the last proxied call's response
    reached its client), both taken with time.perf_counter() in this one process. After each round the
    gateway is resumed.

How to read it
    A gap near 0 means the trainer learns of the drain as soon as it happens; a negative gap means the drained
    answer arrived before the last agent had read its response (the gateway counts a call finished when the
    upstream answered, just before it relays the bytes). With the seed's 0.25 s poll the gap is the rest of a
    polling interval: 250 ms minus the time the last call still had to run at the first poll, so with the
    short calls used here it sits near 190-230 ms; with long calls it would be spread over 0-250 ms (about
    125 ms on average). "drain" is the gateway's own drain_seconds (pause to last call done).
    Target: p99 gap <= 10 ms for the server-side wait.

Run
    .venv/bin/python benchmarks/drain_latency.py [--rounds 150] [--poll-rounds 60] [--inflight 8]
        [--min-delay 0.02] [--max-delay 0.06]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
from _common import (
    TINY_CHAT,
    Servers,
    agent_headers,
    management_headers,
    ms,
    percentile,
    proxy_path,
    run_client,
    running_servers,
    table,
    verdict,
)

TARGET_P99_GAP_SECONDS = 0.010
SEED_POLL_INTERVAL_SECONDS = 0.25


@dataclass
class Samples:
    method: str
    gaps: list[float] = field(default_factory=list)
    drain_seconds: list[float] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)


class Rig:
    """One aiohttp session against the gateway, and the K rollouts the rounds use."""

    def __init__(self, session: aiohttp.ClientSession, servers: Servers, inflight: int) -> None:
        self.session = session
        self.url = servers.gateway_url
        self.rollout_ids = [f"drain-{index}" for index in range(inflight)]
        self.admin = management_headers()

    async def create_rollouts(self) -> None:
        body = [{"rollout_id": rid, "group_id": "drain", "step": 0} for rid in self.rollout_ids]
        async with self.session.post(f"{self.url}/api/rollouts", json=body, headers=self.admin) as resp:
            if resp.status != 201:
                raise RuntimeError(f"creating rollouts failed: {resp.status} {await resp.text()}")

    async def call(self, rollout_id: str, delay: float) -> tuple[int, float]:
        body = {**TINY_CHAT, "fake_delay_seconds": delay}
        url = self.url + proxy_path(rollout_id)
        async with self.session.post(url, json=body, headers=agent_headers(rollout_id)) as response:
            await response.read()
            return response.status, time.perf_counter()

    async def state(self) -> dict[str, object]:
        async with self.session.get(f"{self.url}/proxy/state", headers=self.admin) as response:
            state: dict[str, object] = await response.json()
            return state

    async def pause(self, wait: float | None) -> dict[str, object]:
        query = "" if wait is None else f"?wait={wait}"
        body = {"reason": "drain benchmark", "retry_after_seconds": 1}
        async with self.session.post(f"{self.url}/proxy/pause{query}", json=body, headers=self.admin) as resp:
            result: dict[str, object] = await resp.json()
            return result

    async def resume(self) -> None:
        async with self.session.post(f"{self.url}/proxy/resume", headers=self.admin) as response:
            await response.read()

    async def all_inflight(self, calls: list[asyncio.Task[tuple[int, float]]]) -> bool:
        """Wait until the gateway counts every call in flight; False if one finished before that."""
        while int(str((await self.state())["inflight"])) < len(calls):
            if any(call.done() for call in calls):
                return False
            await asyncio.sleep(0.001)
        return True


async def server_wait(rig: Rig) -> tuple[float, dict[str, object]]:
    drained = await rig.pause(wait=30)
    return time.perf_counter(), drained


async def seed_poll(rig: Rig) -> tuple[float, dict[str, object]]:
    state = await rig.pause(wait=None)
    while int(str(state["inflight"])) > 0:
        await asyncio.sleep(SEED_POLL_INTERVAL_SECONDS)
        state = await rig.state()
    return time.perf_counter(), state


async def measure(
    rig: Rig,
    method: str,
    wait_for_drain: Callable[[Rig], Awaitable[tuple[float, dict[str, object]]]],
    *,
    rounds: int,
    min_delay: float,
    max_delay: float,
    seed: int,
) -> Samples:
    samples = Samples(method)
    rng = random.Random(seed)
    for round_index in range(rounds):
        delays = sorted(rng.uniform(min_delay, max_delay) for _ in rig.rollout_ids)
        calls = [
            asyncio.create_task(rig.call(rid, delay))
            for rid, delay in zip(rig.rollout_ids, delays, strict=True)
        ]
        if not await rig.all_inflight(calls):
            await asyncio.gather(*calls)
            samples.anomalies.append(f"round {round_index}: a call ended before all were in flight; skipped")
            continue
        learned, answer = await wait_for_drain(rig)
        finished = await asyncio.gather(*calls)
        await rig.resume()
        if any(status != 200 for status, _at in finished):
            samples.anomalies.append(f"round {round_index}: statuses {[status for status, _ in finished]}")
            continue
        samples.gaps.append(learned - max(at for _status, at in finished))
        if "drain_seconds" in answer:
            samples.drain_seconds.append(float(str(answer["drain_seconds"])))
            if answer.get("inflight_at_pause") != len(calls):
                samples.anomalies.append(
                    f"round {round_index}: inflight_at_pause {answer.get('inflight_at_pause')}"
                )
    return samples


async def main_async(args: argparse.Namespace) -> list[Samples]:
    with running_servers() as servers:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=60)
        ) as session:
            rig = Rig(session, servers, args.inflight)
            await rig.create_rollouts()
            # Warm the connection pools of both hops (not measured).
            await measure(
                rig,
                "warm-up",
                server_wait,
                rounds=5,
                min_delay=args.min_delay,
                max_delay=args.max_delay,
                seed=0,
            )
            results = []
            for method, function, rounds in (
                ("server-wait (POST /proxy/pause?wait=30)", server_wait, args.rounds),
                ("seed-poll (pause, GET /proxy/state every 0.25 s)", seed_poll, args.poll_rounds),
            ):
                print(f"  {method}: {rounds} rounds of {args.inflight} calls in flight ...")
                results.append(
                    await measure(
                        rig,
                        method,
                        function,
                        rounds=rounds,
                        min_delay=args.min_delay,
                        max_delay=args.max_delay,
                        seed=args.seed,
                    )
                )
            return results


def report(results: list[Samples]) -> None:
    rows = []
    for samples in results:
        gaps = samples.gaps
        drains = samples.drain_seconds
        rows.append(
            [
                samples.method,
                len(gaps),
                ms(min(gaps)),
                ms(percentile(gaps, 50)),
                ms(percentile(gaps, 90)),
                ms(percentile(gaps, 99)),
                ms(max(gaps)),
                ms(percentile(drains, 50)) if drains else "-",
            ]
        )
    headers = ["method", "rounds", "gap min ms", "p50", "p90", "p99", "max", "drain p50 ms"]
    print()
    print(table(headers, rows))
    for samples in results:
        for anomaly in samples.anomalies[:5]:
            print(f"  note ({samples.method}): {anomaly}")
    print()
    server = results[0]
    p99 = percentile(server.gaps, 99)
    print(verdict("server-wait p99 gap <= 10 ms", p99 <= TARGET_P99_GAP_SECONDS, f"{p99 * 1000:.2f} ms"))
    if len(results) > 1:
        seed_p50, server_p50 = percentile(results[1].gaps, 50), percentile(server.gaps, 50)
        print(f"seed-poll p50 gap {seed_p50 * 1000:.1f} ms vs server-wait {server_p50 * 1000:.2f} ms")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=150, help="rounds with the server-side wait")
    parser.add_argument("--poll-rounds", type=int, default=60, help="rounds with the seed's 0.25 s poll")
    parser.add_argument("--inflight", type=int, default=8, help="model calls in flight at each pause (K)")
    parser.add_argument("--min-delay", type=float, default=0.02, help="shortest upstream delay, seconds")
    parser.add_argument("--max-delay", type=float, default=0.06, help="longest upstream delay, seconds")
    parser.add_argument("--seed", type=int, default=7, help="seed of the delay draws")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    started = time.monotonic()
    print(
        f"drain_latency: {args.inflight} calls in flight, upstream delays "
        f"{args.min_delay * 1000:.0f}-{args.max_delay * 1000:.0f} ms"
    )
    report(run_client(lambda: main_async(args)))
    print(f"\n(total wall time {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
