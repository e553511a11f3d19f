"""Soak: the real local loop for a long time, with a fault-injecting proxy between each pair of components.

`asyncrl local run` (gateway, trainer with the reference backend, one process per rollout) runs the
quickstart's toy agent for `--duration` seconds. Every connection between two components goes through its
own Toxiproxy proxy (built from its Go module by scripts/provision-toxiproxy.sh):

    trainer  -> trainer-gateway  -> gateway        (pause, resume, rollouts, completions)
    agents   -> agents-gateway   -> gateway        (model calls, events)
    operator -> operator-gateway -> gateway        (claims and outcomes; `asyncrl local run` itself)
    gateway  -> gateway-upstream -> model server   (the trainer's reference inference server)

A seeded schedule switches faults on and off on them: connection resets, latency, slow closes and
timeouts (data stops, then the connection closes). Meanwhile it watches the gateway directly (no proxy):
its pause state every 0.1 s and its rollouts every second; each agent appends its rollout id to a file
(benchmarks/soak_agent.py); the trainer logs the groups each update trained; the metrics file gives each
step's time. At the end it prints:

- the slowest step against the median (the step's own time, and the wall time between two updates);
- rollouts lost (the gateway held them, and their agent never ran or ran later than the rollout timeout)
  and rollouts executed twice;
- groups trained twice;
- the time the gateway spent paused with no update running.

Targets: no step slower than the rollout timeout plus the update time; nothing lost or doubled; never paused
without an update. It never asserts; each target ends in a `target ...: MET/NOT MET (measured X)` line and the
exit code is 1 when one is not met. tests/test_soak.py runs a short version in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import random
import re
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from asyncrl import metric_names as names
from asyncrl.gateway_api.tokens import KEY_ENV_VAR
from asyncrl.launch.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
PROVISION = ROOT / "scripts" / "provision-toxiproxy.sh"
QUICKSTART = ROOT / "examples" / "quickstart-local.yaml"
AGENT = ROOT / "benchmarks" / "soak_agent.py"
FAULT_KINDS = ("reset_peer", "latency", "slow_close", "timeout")
PROXIES = ("trainer-gateway", "agents-gateway", "operator-gateway", "gateway-upstream")
STATE_POLL_SECONDS = 0.1
ROLLOUT_POLL_SECONDS = 1.0
STOP_WAIT_SECONDS = 60.0


# -- the fault schedule (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One toxic on one proxy, switched on `at` seconds into the soak for `seconds`."""

    at: float
    seconds: float
    proxy: str
    kind: str
    stream: str  # "upstream" (client -> server) or "downstream" (server -> client)
    attributes: dict[str, int]

    def describe(self) -> str:
        values = ", ".join(f"{name}={value}" for name, value in self.attributes.items())
        return (
            f"{self.at:7.1f}s +{self.seconds:4.1f}s {self.proxy:<17} {self.kind:<10} {self.stream} {values}"
        )


def fault_schedule(
    seed: int, *, duration: float, mean_gap: float, proxies: Sequence[str] = PROXIES
) -> list[Fault]:
    """Faults over `duration` seconds: gaps of 0.5-1.5 x `mean_gap`, each on one proxy for 2-10 s.

    A fault never overlaps the next on the same proxy (toxics of one proxy are switched one at a time);
    the same seed gives the same schedule.
    """
    rng = random.Random(seed)
    faults: list[Fault] = []
    busy_until = dict.fromkeys(proxies, 0.0)
    at = rng.uniform(0.5, 1.5) * mean_gap
    while at < duration:
        proxy = rng.choice(list(proxies))
        kind = rng.choice(FAULT_KINDS)
        seconds = round(rng.uniform(2.0, 10.0), 1)
        if at >= busy_until[proxy]:
            faults.append(
                Fault(
                    at=round(at, 1),
                    seconds=seconds,
                    proxy=proxy,
                    kind=kind,
                    stream=rng.choice(("upstream", "downstream")),
                    attributes=_attributes(kind, rng),
                )
            )
            busy_until[proxy] = at + seconds
        at += rng.uniform(0.5, 1.5) * mean_gap
    return faults


def _attributes(kind: str, rng: random.Random) -> dict[str, int]:
    match kind:
        case "reset_peer":  # each connection is reset after this many ms
            return {"timeout": rng.choice((0, 50, 500))}
        case "latency":
            return {"latency": rng.choice((200, 1000, 3000)), "jitter": 100}
        case "slow_close":
            return {"delay": rng.choice((1000, 5000))}
        case "timeout":  # data stops; the connection closes after this many ms (0: only when switched off)
            return {"timeout": rng.choice((0, 1000, 5000))}
    raise ValueError(f"unknown fault kind {kind!r}")


# -- what was observed, and what it means (pure) ---------------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    step: int
    seen_at: float  # when its metrics line appeared (the update had just finished)
    step_seconds: float
    update_seconds: float  # pause to the end of the update (timing/update_phase_seconds)


@dataclass
class RolloutSeen:
    rollout_id: str
    created_at: float
    state: str
    started_at: float | None
    last_seen: float
    n_model_calls: int = 0
    message: str | None = None


@dataclass(frozen=True)
class Interval:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Figures:
    steps: int
    median_step: float
    slowest_step: float
    slowest_step_number: int
    median_gap: float
    slowest_gap: float
    max_update: float
    lost: list[str]
    late: list[str]
    outcomes_lost: list[str]
    executed_twice: list[str]
    executions: int
    rollouts_seen: int
    trained_twice: list[str]
    groups_trained: int
    paused_seconds: float
    paused_without_update_seconds: float
    longest_paused_without_update: float
    pauses_without_update: int
    pauses: int


def parse_metrics_line(line: str, seen_at: float) -> StepRecord | None:
    try:
        record = json.loads(line)
        return StepRecord(
            step=int(record["step"]),
            seen_at=seen_at,
            step_seconds=float(record[names.STEP_SECONDS]),
            update_seconds=float(record[names.UPDATE_PHASE_SECONDS]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def trained_groups(trainer_log: str) -> Counter[str]:
    """How often each group was trained, from the trainer's `step N: trained groups ...` lines."""
    counts: Counter[str] = Counter()
    marker = ": trained groups "
    for line in trainer_log.splitlines():
        if marker in line:
            counts.update(line.split(marker, 1)[1].split())
    return counts


def executions(lines: str) -> Counter[str]:
    """How often each rollout's agent started (soak_agent.py's `<id> <time> start` lines)."""
    return Counter(line.split()[0] for line in lines.splitlines() if line.split()[2:3] == ["start"])


def succeeded_agents(lines: str) -> set[str]:
    """Rollouts whose agent exited 0 (soak_agent.py's `<id> <time> exit 0` lines)."""
    return {line.split()[0] for line in lines.splitlines() if line.split()[2:] == ["exit", "0"]}


def group_of(rollout_id: str) -> str:
    """The group a rollout belongs to: the trainer names rollouts `<group id>-r<index>`."""
    return rollout_id.rsplit("-r", 1)[0]


def outcomes_lost(
    rollouts: Iterable[RolloutSeen], succeeded: set[str], trained: Iterable[str] = ()
) -> list[str]:
    """Rollouts whose agent exited 0 but that the gateway recorded as failed or timed out, or still shows
    queued (its `running` report was lost, so the `succeeded` one was refused).

    `queued` is the state the detector last saw, polling: a rollout whose group the trainer then trained had
    finished (a group is trained once its rollouts have), so it only looked queued between two polls.
    """
    trained_groups = set(trained)
    return sorted(
        rollout.rollout_id
        for rollout in rollouts
        if rollout.rollout_id in succeeded
        and (
            rollout.state in ("failed", "timed_out")
            or (rollout.state == "queued" and group_of(rollout.rollout_id) not in trained_groups)
        )
    )


def lost_rollouts(
    rollouts: Iterable[RolloutSeen], executed: Iterable[str], *, timeout: float, end: float
) -> tuple[list[str], list[str]]:
    """(lost, late): rollouts the gateway held whose agent never ran, except those cancelled or still within
    their timeout at the end; and rollouts whose agent started later than the rollout timeout."""
    ran = set(executed)
    lost: list[str] = []
    late: list[str] = []
    for rollout in rollouts:
        if rollout.started_at is not None and rollout.started_at - rollout.created_at > timeout:
            late.append(rollout.rollout_id)
        if rollout.rollout_id in ran or rollout.state == "cancelled":
            continue
        waiting = (
            rollout.state in ("queued", "running") and rollout.last_seen >= end - 2 * ROLLOUT_POLL_SECONDS
        )
        if waiting and end - rollout.created_at <= timeout:
            continue
        lost.append(rollout.rollout_id)
    return sorted(lost), sorted(late)


def paused_intervals(samples: Sequence[tuple[float, bool]]) -> tuple[list[Interval], Interval | None]:
    """Closed paused intervals from (time, paused) samples, and the one still open at the last sample."""
    intervals: list[Interval] = []
    start: float | None = None
    for at, paused in samples:
        if paused and start is None:
            start = at
        elif not paused and start is not None:
            intervals.append(Interval(start, at))
            start = None
    open_interval = Interval(start, samples[-1][0]) if start is not None and samples else None
    return intervals, open_interval


def paused_without_update(
    pauses: Sequence[Interval], steps: Sequence[StepRecord]
) -> tuple[float, float, int]:
    """(total, longest, count of pauses with no update at all): paused time outside every update.

    An update spans from its pause to its metrics line ([seen_at - update_seconds, seen_at]); what a pause
    lasts beyond the updates in it (a checkpoint, the resume call, a resume lost on the way) counts.
    """
    total = longest = 0.0
    without = 0
    updates = [Interval(step.seen_at - step.update_seconds, step.seen_at) for step in steps]
    for pause in pauses:
        covered = sum(
            max(0.0, min(pause.end, update.end) - max(pause.start, update.start)) for update in updates
        )
        if not any(pause.start <= update.end <= pause.end + STATE_POLL_SECONDS for update in updates):
            without += 1
        rest = max(0.0, pause.seconds - covered)
        total += rest
        longest = max(longest, rest)
    return total, longest, without


def figures(
    *,
    steps: Sequence[StepRecord],
    rollouts: Iterable[RolloutSeen],
    executions_log: str,
    trainer_log: str,
    state_samples: Sequence[tuple[float, bool]],
    timeout: float,
    end: float,
) -> Figures:
    ran = executions(executions_log)
    trained = trained_groups(trainer_log)
    rollouts = list(rollouts)
    lost, late = lost_rollouts(rollouts, ran, timeout=timeout, end=end)
    pauses, _still_open = paused_intervals(state_samples)
    without_total, without_longest, without_count = paused_without_update(pauses, steps)
    durations = [step.step_seconds for step in steps] or [0.0]
    gaps = [later.seen_at - earlier.seen_at for earlier, later in itertools.pairwise(steps)] or [0.0]
    slowest = max(steps, key=lambda step: step.step_seconds) if steps else None
    return Figures(
        steps=len(steps),
        median_step=statistics.median(durations),
        slowest_step=max(durations),
        slowest_step_number=slowest.step if slowest is not None else -1,
        median_gap=statistics.median(gaps),
        slowest_gap=max(gaps),
        max_update=max((step.update_seconds for step in steps), default=0.0),
        lost=lost,
        late=late,
        outcomes_lost=outcomes_lost(rollouts, succeeded_agents(executions_log), trained),
        executed_twice=sorted(rollout for rollout, count in ran.items() if count > 1),
        executions=sum(ran.values()),
        rollouts_seen=len(rollouts),
        trained_twice=sorted(group for group, count in trained.items() if count > 1),
        groups_trained=len(trained),
        paused_seconds=sum(pause.seconds for pause in pauses),
        paused_without_update_seconds=without_total,
        longest_paused_without_update=without_longest,
        pauses_without_update=without_count,
        pauses=len(pauses),
    )


def verdict_lines(result: Figures, *, timeout: float) -> tuple[list[str], bool]:
    """The target lines, and whether every target was met."""
    bound = timeout + result.max_update
    slowest = max(result.slowest_step, result.slowest_gap)
    targets = [
        (
            f"no step slower than the rollout timeout plus the update time ({bound:.1f}s)",
            slowest <= bound,
            f"slowest {slowest:.1f}s",
        ),
        (
            "no rollout lost or started late",
            not result.lost and not result.late,
            f"{len(result.lost)} lost, {len(result.late)} late",
        ),
        (
            "no agent's outcome lost (exited 0, recorded failed, timed out or still queued)",
            not result.outcomes_lost,
            f"{len(result.outcomes_lost)}",
        ),
        ("no rollout executed twice", not result.executed_twice, f"{len(result.executed_twice)}"),
        ("no group trained twice", not result.trained_twice, f"{len(result.trained_twice)}"),
        (
            "never paused without an update",
            result.pauses_without_update == 0,
            f"{result.pauses_without_update} pauses with no update; paused beyond its update "
            f"{result.paused_without_update_seconds:.1f}s in all, "
            f"longest {result.longest_paused_without_update:.1f}s",
        ),
    ]
    lines = [
        f"target {name}: {'MET' if met else 'NOT MET'} (measured {measured})"
        for name, met, measured in targets
    ]
    return lines, all(met for _, met, _ in targets)


def report(
    result: Figures, *, timeout: float, faults: Sequence[Fault], applied: int, carried: dict[str, int]
) -> tuple[list[str], bool]:
    by_kind = Counter(fault.kind for fault in faults[:applied])
    by_proxy = Counter(fault.proxy for fault in faults[:applied])
    lines = [
        f"faults applied: {applied} ({', '.join(f'{kind} {n}' for kind, n in sorted(by_kind.items()))}); "
        f"by proxy: {', '.join(f'{proxy} {n}' for proxy, n in sorted(by_proxy.items()))}",
        f"bytes through each proxy: {', '.join(f'{proxy} {carried.get(proxy, 0)}' for proxy in PROXIES)}",
        f"steps: {result.steps}; step time median {result.median_step:.1f}s, "
        f"slowest {result.slowest_step:.1f}s (step {result.slowest_step_number}, "
        f"{result.slowest_step / max(result.median_step, 1e-9):.1f} x median)",
        f"wall time between updates: median {result.median_gap:.1f}s, slowest {result.slowest_gap:.1f}s; "
        f"longest update {result.max_update:.2f}s",
        f"rollouts seen at the gateway: {result.rollouts_seen}; agents started: {result.executions}; "
        f"lost: {len(result.lost)} {result.lost[:5]}; started later than the {timeout:.0f}s timeout: "
        f"{len(result.late)} {result.late[:5]}; executed twice: {len(result.executed_twice)} "
        f"{result.executed_twice[:5]}; agents that exited 0 but whose rollout was recorded failed, timed "
        f"out or still queued: {len(result.outcomes_lost)} {result.outcomes_lost[:5]}",
        f"groups trained: {result.groups_trained}; trained twice: {len(result.trained_twice)} "
        f"{result.trained_twice[:5]}",
        f"gateway paused: {result.pauses} pauses, {result.paused_seconds:.1f}s in all; beyond their update "
        f"{result.paused_without_update_seconds:.1f}s (longest {result.longest_paused_without_update:.2f}s); "
        f"pauses with no update at all: {result.pauses_without_update}",
    ]
    verdicts, met = verdict_lines(result, timeout=timeout)
    return lines + verdicts, met


# -- the run (I/O) ---------------------------------------------------------------------------------------


def toxiproxy_bin() -> Path:
    """The bin directory of scripts/provision-toxiproxy.sh (it builds once, then only finds it)."""
    done = subprocess.run([str(PROVISION)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"soak: {PROVISION.name} failed:\n{done.stderr.strip()}")
    return Path(done.stdout.strip().splitlines()[-1])


def soak_manifest(*, executions_path: Path, total_steps: int, rollout_timeout: int | None) -> dict[str, Any]:
    """The quickstart, its agent wrapped by soak_agent.py, with more steps than the soak will reach."""
    manifest: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())
    manifest["metadata"]["name"] = "soak"
    manifest["spec"]["totalSteps"] = total_steps
    if rollout_timeout is not None:
        manifest["spec"]["rolloutTimeoutSeconds"] = rollout_timeout
    inline: str = manifest["spec"]["agents"]["template"]["inline"]
    command = '["python", "-m", "examples.toy_agent.agent"]'
    if command not in inline or not inline.rstrip().endswith("{{ input | tojson }}"):
        raise SystemExit(f"soak: {QUICKSTART} changed: its agent's command or env is not where soak.py looks")
    indent = inline.rstrip().splitlines()[-2].split("- name")[0]  # the env list's indentation
    extra = (
        f'{indent}- name: SOAK_ROLLOUT_ID\n{indent}  value: "{{{{ rollout.id }}}}"\n'
        f"{indent}- name: SOAK_EXECUTIONS\n{indent}  value: {json.dumps(str(executions_path))}\n"
    )
    inline = inline.replace(command, json.dumps(["python", str(AGENT)])).rstrip() + "\n" + extra
    manifest["spec"]["agents"]["template"]["inline"] = inline
    return manifest


@dataclass
class Observations:
    steps: list[StepRecord] = field(default_factory=list)
    rollouts: dict[str, RolloutSeen] = field(default_factory=dict)
    state_samples: list[tuple[float, bool]] = field(default_factory=list)
    faults_applied: int = 0
    fault_errors: list[str] = field(default_factory=list)
    fault_log: list[str] = field(default_factory=list)  # "<unix time> <fault>" as each was switched on


class Toxiproxy:
    """A toxiproxy-server on 127.0.0.1 and its HTTP API."""

    def __init__(self, bin_dir: Path, log_path: Path) -> None:
        self.port = free_port()
        self.api = httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}", timeout=10.0)
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [str(bin_dir / "toxiproxy-server"), "-host=127.0.0.1", f"-port={self.port}", "-proxy-metrics"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "LOG_LEVEL": "warn"},  # not every connection it proxies
        )

    async def ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(httpx.TransportError):
                if (await self.api.get("/version")).status_code == 200:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"soak: toxiproxy-server did not start; see {self._log.name}")
            await asyncio.sleep(0.1)

    async def proxy(self, name: str, *, listen_port: int, upstream_port: int) -> None:
        body = {"name": name, "listen": f"127.0.0.1:{listen_port}", "upstream": f"127.0.0.1:{upstream_port}"}
        (await self.api.post("/proxies", json=body)).raise_for_status()

    async def add(self, fault: Fault) -> None:
        body = {
            "name": "fault",
            "type": fault.kind,
            "stream": fault.stream,
            "toxicity": 1.0,
            "attributes": fault.attributes,
        }
        (await self.api.post(f"/proxies/{fault.proxy}/toxics", json=body)).raise_for_status()

    async def remove(self, proxy: str) -> None:
        response = await self.api.delete(f"/proxies/{proxy}/toxics/fault")
        if response.status_code not in (204, 404):
            response.raise_for_status()

    async def bytes_carried(self) -> dict[str, int]:
        """Bytes each proxy carried (both directions), from its Prometheus metrics."""
        carried: Counter[str] = Counter()
        for line in (await self.api.get("/metrics")).text.splitlines():
            if line.startswith("toxiproxy_proxy_sent_bytes_total{"):
                proxy = re.search(r'proxy="([^"]*)"', line)
                if proxy is not None:
                    carried[proxy.group(1)] += int(float(line.rsplit(" ", 1)[1]))
        return dict(carried)

    async def close(self) -> None:
        await self.api.aclose()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._log.close()


async def inject(toxiproxy: Toxiproxy, faults: Sequence[Fault], started: float, seen: Observations) -> None:
    """Switch each fault on at its time and off after its duration."""

    async def one(fault: Fault) -> None:
        await asyncio.sleep(max(0.0, started + fault.at - time.monotonic()))
        try:
            await toxiproxy.add(fault)
            seen.faults_applied += 1
            seen.fault_log.append(f"{time.time():.3f} {fault.describe()}")
            await asyncio.sleep(fault.seconds)
        except httpx.HTTPError as error:
            seen.fault_errors.append(f"{fault.describe()}: {error}")
        finally:
            with contextlib.suppress(httpx.HTTPError):
                await toxiproxy.remove(fault.proxy)

    await asyncio.gather(*(one(fault) for fault in faults))


async def watch_state(gateway: httpx.AsyncClient, seen: Observations) -> None:
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            paused = bool((await gateway.get("/proxy/state")).json()["paused"])
            seen.state_samples.append((time.monotonic(), paused))
        await asyncio.sleep(STATE_POLL_SECONDS)


async def watch_rollouts(gateway: httpx.AsyncClient, seen: Observations) -> None:
    """Every rollout the gateway holds: when it was created, when its agent started, its last state.

    The gateway's times are wall-clock; they are kept as such (only differences are used).
    """
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            response = await gateway.get("/api/rollouts")
            now = time.time()
            for item in response.json()["rollouts"]:
                rollout = seen.rollouts.get(item["rollout_id"])
                if rollout is None:
                    rollout = seen.rollouts[item["rollout_id"]] = RolloutSeen(
                        item["rollout_id"], item["created_at"], item["state"], None, now
                    )
                rollout.state, rollout.started_at, rollout.last_seen = item["state"], item["started_at"], now
                rollout.n_model_calls, rollout.message = item["n_model_calls"], item["message"]
        await asyncio.sleep(ROLLOUT_POLL_SECONDS)


async def watch_metrics(path: Path, seen: Observations) -> None:
    offset = 0
    pending = b""
    while True:
        if path.exists():
            with path.open("rb") as metrics:
                metrics.seek(offset)
                chunk = metrics.read()
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                record = parse_metrics_line(line.decode(errors="replace"), time.monotonic())
                if record is not None:
                    seen.steps.append(record)
        await asyncio.sleep(STATE_POLL_SECONDS)


async def soak(args: argparse.Namespace) -> int:
    work_dir = args.work_dir.absolute()
    work_dir.mkdir(parents=True, exist_ok=True)
    executions_path = work_dir / "executions.txt"
    executions_path.unlink(missing_ok=True)
    metrics_path = work_dir / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    manifest = soak_manifest(
        executions_path=executions_path, total_steps=args.total_steps, rollout_timeout=args.rollout_timeout
    )
    timeout = float(manifest["spec"]["rolloutTimeoutSeconds"])
    manifest_path = work_dir / "soak.yaml"
    manifest_path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    faults = fault_schedule(args.seed, duration=args.duration, mean_gap=args.mean_fault_gap)
    (work_dir / "faults.txt").write_text("".join(fault.describe() + "\n" for fault in faults))
    print(f"soak: {args.duration:.0f}s, seed {args.seed}, {len(faults)} faults planned; files in {work_dir}/")

    gateway_port, inference_port = free_port(), free_port()
    listen = {name: free_port() for name in PROXIES}
    toxiproxy = Toxiproxy(toxiproxy_bin(), work_dir / "toxiproxy.log")
    key = secrets.token_urlsafe(32)
    seen = Observations()
    run: subprocess.Popen[bytes] | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        await toxiproxy.ready()
        for name, port in listen.items():
            upstream = inference_port if name == "gateway-upstream" else gateway_port
            await toxiproxy.proxy(name, listen_port=port, upstream_port=upstream)
        url = {name: f"http://127.0.0.1:{port}" for name, port in listen.items()}
        argv = [
            sys.executable, "-m", "asyncrl.cli", "local", "run", str(manifest_path),
            f"--work-dir={work_dir / 'run'}", f"--metrics-file={metrics_path}",
            f"--gateway-port={gateway_port}", f"--inference-port={inference_port}",
            f"--trainer-gateway-url={url['trainer-gateway']}",
            f"--agents-gateway-url={url['agents-gateway']}",
            f"--operator-gateway-url={url['operator-gateway']}",
            f"--inference-url={url['gateway-upstream']}",
        ]  # fmt: skip
        with (work_dir / "run.out").open("wb") as out:
            run = subprocess.Popen(
                argv,
                cwd=ROOT,
                env={**os.environ, KEY_ENV_VAR: key},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{gateway_port}",
            headers={"authorization": f"Bearer {key}"},
            timeout=10.0,
        ) as gateway:
            started = time.monotonic()
            tasks = [
                asyncio.create_task(watch_state(gateway, seen)),
                asyncio.create_task(watch_rollouts(gateway, seen)),
                asyncio.create_task(watch_metrics(metrics_path, seen)),
                asyncio.create_task(inject(toxiproxy, faults, started, seen)),
            ]
            # Ctrl-C or SIGTERM ends the soak early; it still stops everything and reports what it saw.
            stop = asyncio.Event()
            for signum in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().add_signal_handler(signum, stop.set)
            while time.monotonic() - started < args.duration and run.poll() is None and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=1.0)
            end = time.time()
            if stop.is_set():
                print(f"soak: stopped by a signal after {time.monotonic() - started:.0f}s")
            exited_early = run.poll()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for task in tasks:
            task.cancel()
        if run is not None:
            _stop(run)
        # Toxiproxy counts a connection's bytes when it closes: after the run stopped, all have.
        carried: dict[str, int] = {}
        with contextlib.suppress(httpx.HTTPError):
            carried = await toxiproxy.bytes_carried()
        await toxiproxy.close()
    (work_dir / "faults-applied.txt").write_text("".join(line + "\n" for line in seen.fault_log))
    with (work_dir / "rollouts.jsonl").open("w") as dump:  # what the gateway last showed of each rollout
        for rollout in seen.rollouts.values():
            dump.write(json.dumps(dataclasses.asdict(rollout)) + "\n")
    result = figures(
        steps=seen.steps,
        rollouts=seen.rollouts.values(),
        executions_log=_read(executions_path),
        trainer_log=_read(work_dir / "run" / "trainer.log"),
        state_samples=seen.state_samples,
        timeout=timeout,
        end=end,
    )
    lines, met = report(result, timeout=timeout, faults=faults, applied=seen.faults_applied, carried=carried)
    if exited_early is not None:
        ran = time.monotonic() - started
        lines.insert(
            0, f"the run ended on its own after {ran:.0f}s (exit {exited_early}); see {work_dir}/run.out"
        )
        met = False
    for error in seen.fault_errors[:5]:
        lines.insert(0, f"a fault could not be switched: {error}")
    print("\n".join(lines))
    return 0 if met else 1


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _stop(run: subprocess.Popen[bytes]) -> None:
    """Ctrl-C the run (it stops its processes and prints its summary); kill its group if it hangs."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.pid, signal.SIGINT)
    try:
        run.wait(timeout=STOP_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="the fault schedule's seed (default %(default)s)")
    parser.add_argument(
        "--mean-fault-gap", type=float, default=10.0, help="mean seconds between faults (default %(default)s)"
    )
    parser.add_argument(
        "--total-steps", type=int, default=100_000, help="the run's totalSteps (more than it reaches)"
    )
    parser.add_argument(
        "--rollout-timeout",
        type=int,
        default=None,
        help="the run's rolloutTimeoutSeconds (default: the quickstart's)",
    )
    parser.add_argument("--work-dir", type=Path, default=Path(".asyncrl/soak"), help="logs and observations")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(soak(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
