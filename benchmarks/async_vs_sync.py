"""Async vs sync collection: groups trained per second with the real gateway and the real window engine.

What it measures
    Real fake-upstream and gateway processes on 127.0.0.1, and in this process one asyncio program with
      - a simulated trainer around the real `asyncrl.trainer.window.RolloutWindow`: each step `begin_step`,
        draw `groups_to_draw()` groups of n rollouts and create them (POST /api/rollouts), feed the
        completion long-poll (GET /api/completions, cursor) into `record_terminal`, and when
        `ready_for_update()`: `take_update_batch`, pause the gateway with a server-side drain wait
        (POST /proxy/pause?wait=30), sleep the update cost, resume (POST /proxy/resume), delete the consumed
        rollouts;
      - a simulated operator: long-polls POST /api/rollouts/claim, marks each claimed rollout running
        (POST /api/rollouts/{id}/transition) and starts its agent; marks it succeeded when the agent ends;
      - simulated agents: a rollout of total duration D makes C model calls through the gateway proxy with its
        agent token; each of the C segments is think time (1 - g) * D / C (asyncio.sleep, like a tool call)
        followed by a model call whose upstream takes g * D / C (`fake_delay_seconds`, the "generation").
        Then it posts a reward event. While the gateway is paused a model call gets 429: the agent retries
        after --agent-retry-seconds (default 0.1 s) instead of the Retry-After header, because the header is
        whole seconds (at least 1) and would idle agents for longer than the 0.5 s update itself; so a pause
        really holds generation back, and think time goes on (as tools would).
    Rollout durations D are log-normal with mean --mean-rollout-seconds and sigma in --sigmas, drawn from one
    seed: group k gets the same n durations in every mode, so all modes see the same load.
    Modes: sync (window = trainBatchSize, update when every group of the step is done) and async with
    windowSize = m x trainBatchSize for m in --multipliers. The first --warmup-steps steps (window
    fill) are not measured.

How to read it
    groups/s     trained groups per second over the measured steps (trainBatchSize x steps / time).
    step s       mean wall time of one step; collect s is its part spent waiting for ready_for_update().
    age          mean carry-over age (in steps) of the groups consumed by the measured updates (0 = enqueued
                 in the step that trained on it); max age is the oldest consumed group.
    at pause     mean model calls in flight at the pause; drain ms the mean drain the gateway reported;
                 429s the model calls held back by pauses.
    ideal        a bound for the same load: per update the update cost is the only idle time, and between
                 updates the window W keeps W groups running back to back, so trainBatchSize (B) groups
                 finish in B x G / W seconds (Little's law), G being the mean group duration (the max of the
                 group's n sampled durations, averaged over the groups this run drew).
                 ideal = B / (u + B x G / W).
                 It ignores that the window only refills at step start, that generation stops during the
                 update, and the HTTP round trips per rollout, so real runs stay below it.
    Targets: async >= 1.8 x sync at sigma 1.0, and async within 15% of its ideal bound.

Run
    .venv/bin/python benchmarks/async_vs_sync.py [--steps 8] [--sigmas 0.5,1.0,1.5] [--multipliers 2,3]
        [--train-batch-size 4] [--rollout-n 4] [--mean-rollout-seconds 0.3] [--update-seconds 0.5]
        [--agent-retry-seconds 0.1] [--gateway-pythonpath DIR --pause-query abort=true]
    --gateway-pythonpath runs the gateway from a patched copy of asyncrl (DIR/asyncrl); --pause-query adds
    query parameters to the pause call for options such a copy may have (the current gateway ignores them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import statistics
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from _common import (
    TINY_CHAT,
    agent_headers,
    management_headers,
    proxy_path,
    run_client,
    running_servers,
    table,
    verdict,
)

from asyncrl.rollouts import RolloutState
from asyncrl.trainer.window import RolloutWindow, WindowConfig

TARGET_SPEEDUP = 1.8
TARGET_IDEAL_SHARE = 0.85


class Api:
    """The gateway routes the simulated trainer, operator and agents call."""

    def __init__(self, session: aiohttp.ClientSession, url: str, *, pause_query: str = "") -> None:
        self.session = session
        self.url = url
        self.admin = management_headers()
        self.pause_query = pause_query

    async def _json(self, method: str, path: str, *, expect: int = 200, **kwargs: Any) -> Any:
        kwargs.setdefault("headers", self.admin)
        async with self.session.request(method, self.url + path, **kwargs) as response:
            if response.status != expect:
                raise RuntimeError(f"{method} {path}: {response.status} {await response.text()}")
            return await response.json()

    async def create(self, rollouts: list[dict[str, Any]]) -> None:
        await self._json("POST", "/api/rollouts", json=rollouts, expect=201)

    async def claim(self, wait_seconds: float) -> list[dict[str, Any]]:
        body = {"limit": 1000, "wait_seconds": wait_seconds, "lease_seconds": 600}
        claimed: list[dict[str, Any]] = (await self._json("POST", "/api/rollouts/claim", json=body))[
            "rollouts"
        ]
        return claimed

    async def transition(self, rollout_id: str, state: str) -> None:
        body = {"state": state, "attempt_id": "a1"}
        async with self.session.post(
            f"{self.url}/api/rollouts/{rollout_id}/transition", json=body, headers=self.admin
        ) as response:
            if response.status not in (200, 404, 409):  # 404/409: cleaned up or already terminal at run end
                raise RuntimeError(f"transition {rollout_id} -> {state}: {response.status}")

    async def chat(self, rollout_id: str, generation_seconds: float) -> int:
        body = {**TINY_CHAT, "fake_delay_seconds": generation_seconds}
        url = self.url + proxy_path(rollout_id)
        async with self.session.post(url, json=body, headers=agent_headers(rollout_id)) as response:
            await response.read()
            return response.status

    async def reward(self, rollout_id: str, value: float) -> None:
        body = {"event_type": "reward", "data": {"value": value}}
        path = f"/api/rollouts/{rollout_id}/attempt/a1/events"
        await self._json("POST", path, json=body, headers=agent_headers(rollout_id), expect=201)

    async def completions(self, after: int, wait_seconds: float) -> tuple[list[dict[str, Any]], int]:
        page = await self._json("GET", f"/api/completions?after={after}&wait={wait_seconds}")
        return page["entries"], int(page["cursor"])

    async def cursor(self) -> int:
        return int((await self._json("GET", "/api/rollouts"))["cursor"])

    async def pause_and_drain(self) -> dict[str, Any]:
        body = {"reason": "weight update", "retry_after_seconds": 1}
        path = "/proxy/pause?wait=30" + (f"&{self.pause_query}" if self.pause_query else "")
        drained: dict[str, Any] = await self._json("POST", path, json=body)
        return drained

    async def resume(self, model_version: int) -> None:
        await self._json("POST", "/proxy/resume", json={"model_version": model_version})

    async def delete(self, rollout_ids: list[str]) -> None:
        await self._json("POST", "/api/rollouts/delete", json={"rollout_ids": rollout_ids})


@dataclass(frozen=True)
class Load:
    sigma: float
    mean_rollout_seconds: float
    rollout_n: int
    train_batch_size: int
    update_seconds: float
    calls_per_rollout: int
    generation_share: float
    agent_retry_seconds: float
    steps: int
    warmup_steps: int
    group_durations: tuple[tuple[float, ...], ...]  # group k's n sibling durations, the same in every mode


@dataclass
class RunResult:
    mode: str
    window: int
    groups_per_second: float = 0.0
    step_seconds: list[float] = field(default_factory=list)
    collect_seconds: list[float] = field(default_factory=list)
    consumed_ages: list[int] = field(default_factory=list)
    inflight_at_pause: list[int] = field(default_factory=list)
    drain_seconds: list[float] = field(default_factory=list)
    rejected_429: int = 0
    drawn_group_durations: list[float] = field(default_factory=list)
    ideal_groups_per_second: float = 0.0


def draw_durations(
    *, sigma: float, mean: float, n: int, groups: int, seed: int
) -> tuple[tuple[float, ...], ...]:
    rng = random.Random(seed)
    mu = math.log(mean) - sigma**2 / 2  # so that the mean duration is `mean` for every sigma
    return tuple(tuple(rng.lognormvariate(mu, sigma) for _ in range(n)) for _ in range(groups))


class Simulation:
    """One run of one mode: trainer, operator and agents against the shared gateway."""

    def __init__(self, api: Api, load: Load, *, mode: str, window_config: WindowConfig, run_id: str) -> None:
        self.api = api
        self.load = load
        self.window = RolloutWindow(window_config)
        self.run_id = run_id
        self.durations: dict[str, float] = {}
        self.result = RunResult(mode=mode, window=window_config.window_size)
        self.changed = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.failures: list[BaseException | None] = []

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.failures.append(task.exception())
            self.changed.set()

    async def agent(self, rollout_id: str, duration: float) -> None:
        load = self.load
        segment = duration / load.calls_per_rollout
        think, generation = segment * (1 - load.generation_share), segment * load.generation_share
        for _call in range(load.calls_per_rollout):
            await asyncio.sleep(think)
            while (status := await self.api.chat(rollout_id, generation)) == 429:
                self.result.rejected_429 += 1
                await asyncio.sleep(load.agent_retry_seconds)
            if status != 200:
                raise RuntimeError(f"model call of {rollout_id} answered {status}")
        await self.api.reward(rollout_id, 1.0)
        await self.api.transition(rollout_id, RolloutState.SUCCEEDED.value)

    async def start(self, rollout_id: str) -> None:
        """The operator claimed one of this run's rollouts: mark it running and start its agent."""
        await self.api.transition(rollout_id, RolloutState.RUNNING.value)
        self._spawn(self.agent(rollout_id, self.durations[rollout_id]))

    def completed(self, rollout_id: str, state: RolloutState) -> None:
        self.window.record_terminal(rollout_id, state)
        self.changed.set()

    async def trainer(self) -> None:
        load, window, result = self.load, self.window, self.result
        next_group = 0
        measured_from = time.perf_counter()
        for step in range(load.steps):
            if step == load.warmup_steps:
                measured_from = time.perf_counter()
            step_started = time.perf_counter()
            window.begin_step(step=step)
            new_rollouts = []
            for _ in range(window.groups_to_draw()):
                group_id = f"{self.run_id}-g{next_group}"
                rollout_ids = [f"{group_id}-r{sibling}" for sibling in range(load.rollout_n)]
                sibling_durations = load.group_durations[next_group]
                self.durations.update(zip(rollout_ids, sibling_durations, strict=True))
                result.drawn_group_durations.append(max(sibling_durations))
                window.add_group(group_id=group_id, rollout_ids=rollout_ids, step=step)
                new_rollouts += [
                    {"rollout_id": rid, "group_id": group_id, "step": step, "input": {"k": next_group}}
                    for rid in rollout_ids
                ]
                next_group += 1
            if new_rollouts:
                await self.api.create(new_rollouts)
            while not window.ready_for_update():
                self.changed.clear()
                try:
                    await asyncio.wait_for(self.changed.wait(), timeout=60)
                except TimeoutError as error:
                    raise RuntimeError(f"{self.run_id}: no completion for 60 s in step {step}") from error
                if self.failures:
                    raise RuntimeError(f"{self.run_id}: an agent failed: {self.failures[0]!r}")
            collected = time.perf_counter()
            batch = window.take_update_batch(step=step)
            drained = await self.api.pause_and_drain()
            await asyncio.sleep(load.update_seconds)  # the simulated weight update on the shared GPUs
            await self.api.resume(model_version=step + 1)
            await self.api.delete([rid for group in batch.consumed for rid in group.rollout_ids])
            if step >= load.warmup_steps:
                result.step_seconds.append(time.perf_counter() - step_started)
                result.collect_seconds.append(collected - step_started)
                result.consumed_ages += [step - group.enqueued_step for group in batch.consumed]
                result.inflight_at_pause.append(int(drained["inflight_at_pause"]))
                result.drain_seconds.append(float(drained["drain_seconds"]))
        measured_steps = load.steps - load.warmup_steps
        result.groups_per_second = (
            load.train_batch_size * measured_steps / (time.perf_counter() - measured_from)
        )

    async def run(self) -> RunResult:
        try:
            await self.trainer()
        finally:
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)
            await self.cleanup()
        load, result = self.load, self.result
        mean_group = statistics.fmean(result.drawn_group_durations)
        batch = load.train_batch_size
        result.ideal_groups_per_second = batch / (load.update_seconds + batch * mean_group / result.window)
        return result

    async def cleanup(self) -> None:
        """Cancel what is left of this run and wait for its calls to leave the gateway."""
        left = [rid for group in self.window.active_groups for rid in group.rollout_ids]
        await asyncio.gather(*(self.api.transition(rid, RolloutState.CANCELLED.value) for rid in left))
        await self.api.delete(left)
        with contextlib.suppress(RuntimeError):
            await self.api.pause_and_drain()
        await self.api.resume(model_version=0)


class Driver:
    """The simulated operator and the trainer's completion feed, shared by every run of the program.

    They outlive the runs on purpose: a claim long-poll abandoned by its client still leases the rollouts
    it finds when they appear (the gateway does not notice the disconnect), so an operator restarted per run
    would lose the next run's first rollouts for the lease time.
    """

    def __init__(self, api: Api) -> None:
        self.api = api
        self.current: Simulation | None = None

    async def operator(self) -> None:
        while True:
            claimed = await self.api.claim(wait_seconds=5)
            simulation = self.current
            if simulation is not None:
                ours = [r["rollout_id"] for r in claimed if r["rollout_id"] in simulation.durations]
                await asyncio.gather(*(simulation.start(rollout_id) for rollout_id in ours))

    async def feed(self) -> None:
        cursor = await self.api.cursor()
        while True:
            entries, cursor = await self.api.completions(after=cursor, wait_seconds=10)
            simulation = self.current
            if simulation is None:
                continue
            for entry in entries:
                if entry["rollout_id"] in simulation.durations:
                    simulation.completed(entry["rollout_id"], RolloutState(entry["state"]))

    async def run(self, simulation: Simulation, background: list[asyncio.Task[None]]) -> RunResult:
        """Run one simulation; fail at once if the operator or the feed died."""
        self.current = simulation
        try:
            running = asyncio.create_task(simulation.run())
            await asyncio.wait([running, *background], return_when=asyncio.FIRST_COMPLETED)
            for task in background:
                if task.done():
                    running.cancel()
                    raise RuntimeError(
                        "the simulated operator or completion feed stopped"
                    ) from task.exception()
            return await running
        finally:
            self.current = None


async def run_all(args: argparse.Namespace) -> dict[float, list[RunResult]]:
    multipliers = [int(value) for value in args.multipliers.split(",") if value]
    sigmas = [float(value) for value in args.sigmas.split(",") if value]
    batch = args.train_batch_size
    pool = batch * (max(multipliers, default=1) + args.steps + 1)
    results: dict[float, list[RunResult]] = {}
    with running_servers("--retry-after-seconds", "1", pythonpath=args.gateway_pythonpath) as servers:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=120)
        ) as session:
            api = Api(session, servers.gateway_url, pause_query=args.pause_query)
            driver = Driver(api)
            background = [asyncio.create_task(driver.operator()), asyncio.create_task(driver.feed())]
            for sigma_index, sigma in enumerate(sigmas):
                load = Load(
                    sigma=sigma,
                    mean_rollout_seconds=args.mean_rollout_seconds,
                    rollout_n=args.rollout_n,
                    train_batch_size=batch,
                    update_seconds=args.update_seconds,
                    calls_per_rollout=args.calls_per_rollout,
                    generation_share=args.generation_share,
                    agent_retry_seconds=args.agent_retry_seconds,
                    steps=args.steps,
                    warmup_steps=args.warmup_steps,
                    group_durations=draw_durations(
                        sigma=sigma,
                        mean=args.mean_rollout_seconds,
                        n=args.rollout_n,
                        groups=pool,
                        seed=args.seed,
                    ),
                )
                modes = [("sync", WindowConfig(train_batch_size=batch, samples_per_prompt=args.rollout_n))]
                modes += [
                    (
                        f"async {m}x",
                        WindowConfig(
                            train_batch_size=batch,
                            samples_per_prompt=args.rollout_n,
                            async_enabled=True,
                            async_window_size=m * batch,
                        ),
                    )
                    for m in multipliers
                ]
                for mode, config in modes:
                    started = time.monotonic()
                    run_id = f"s{sigma_index}-{mode.replace(' ', '')}"
                    simulation = Simulation(api, load, mode=mode, window_config=config, run_id=run_id)
                    result = await driver.run(simulation, background)
                    results.setdefault(sigma, []).append(result)
                    print(
                        f"  sigma {sigma:.1f} {mode:9s}: {result.groups_per_second:5.2f} groups/s "
                        f"({time.monotonic() - started:.1f} s)"
                    )
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
    return results


def report(results: dict[float, list[RunResult]], args: argparse.Namespace) -> None:
    rows = []
    for sigma, runs in results.items():
        for run in runs:
            rows.append(
                [
                    f"{sigma:.1f}",
                    run.mode,
                    run.window,
                    f"{run.groups_per_second:.2f}",
                    f"{statistics.fmean(run.step_seconds):.3f}",
                    f"{statistics.fmean(run.collect_seconds):.3f}",
                    f"{statistics.fmean(run.consumed_ages):.2f}",
                    max(run.consumed_ages),
                    f"{statistics.fmean(run.inflight_at_pause):.1f}",
                    f"{statistics.fmean(run.drain_seconds) * 1000:.1f}",
                    run.rejected_429,
                    f"{run.ideal_groups_per_second:.2f}",
                    f"{run.groups_per_second / run.ideal_groups_per_second:.1%}",
                ]
            )
    headers = [
        "sigma",
        "mode",
        "window",
        "groups/s",
        "step s",
        "collect s",
        "age",
        "max age",
        "at pause",
        "drain ms",
        "429s",
        "ideal g/s",
        "of ideal",
    ]
    print()
    print(table(headers, rows))
    print(
        f"\n(trainBatchSize {args.train_batch_size}, n {args.rollout_n}, mean rollout "
        f"{args.mean_rollout_seconds:g} s, update {args.update_seconds:g} s, "
        f"{args.steps - args.warmup_steps} measured steps after {args.warmup_steps} warm-up; "
        "update-bound ceiling trainBatchSize / update = "
        f"{args.train_batch_size / args.update_seconds:.1f} groups/s)"
    )
    print()
    reference = results.get(1.0)
    if reference is None:
        print("no sigma 1.0 run: target verdicts skipped")
        return
    sync = next(run for run in reference if run.mode == "sync")
    for run in reference:
        if run.mode == "sync":
            continue
        speedup = run.groups_per_second / sync.groups_per_second
        share = run.groups_per_second / run.ideal_groups_per_second
        print(verdict(f"{run.mode} >= 1.8x sync at sigma 1.0", speedup >= TARGET_SPEEDUP, f"{speedup:.2f}x"))
        print(
            verdict(
                f"{run.mode} within 15% of ideal at sigma 1.0", share >= TARGET_IDEAL_SHARE, f"{share:.1%}"
            )
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--train-batch-size", type=int, default=4, help="groups consumed per update (B)")
    parser.add_argument("--rollout-n", type=int, default=4, help="rollouts per group (n)")
    parser.add_argument(
        "--multipliers", default="2,3", help="async windows as multiples of B, comma-separated"
    )
    parser.add_argument("--sigmas", default="0.5,1.0,1.5", help="log-normal sigmas, comma-separated")
    parser.add_argument("--mean-rollout-seconds", type=float, default=0.3, help="mean rollout duration")
    parser.add_argument("--update-seconds", type=float, default=0.5, help="simulated weight-update cost (u)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per mode, warm-up included")
    parser.add_argument("--warmup-steps", type=int, default=1, help="first steps left out of the figures")
    parser.add_argument("--calls-per-rollout", type=int, default=3, help="model calls per rollout (C)")
    parser.add_argument(
        "--generation-share", type=float, default=0.5, help="share of a rollout spent in model calls (g)"
    )
    parser.add_argument(
        "--agent-retry-seconds", type=float, default=0.1, help="agent's wait after a 429 while paused"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the duration draws")
    parser.add_argument(
        "--gateway-pythonpath",
        help="directory put first on the gateway's PYTHONPATH, to measure a patched copy of asyncrl",
    )
    parser.add_argument(
        "--pause-query",
        default="",
        help="extra query string for POST /proxy/pause, for options of a patched gateway (e.g. abort=true)",
    )
    args = parser.parse_args()
    if not 0 <= args.warmup_steps < args.steps:
        parser.error("--warmup-steps must be at least 0 and below --steps")
    return args


def main() -> None:
    args = parse_args()
    started = time.monotonic()
    print(
        f"async_vs_sync: sigmas {args.sigmas}, sync and async {args.multipliers} x trainBatchSize, "
        f"{args.steps} steps each"
    )
    report(run_client(lambda: run_all(args)), args)
    print(f"\n(total wall time {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
