"""Time to reward: how soon the real local loop reaches a reward, sync against async configurations.

Each run is `asyncrl local run` (gateway, trainer with the Reference backend, one toy-agent process per
rollout) on the quickstart task (examples/quickstart-local.yaml) with one configuration changed:

- `sync`: `async.enabled: false` (every update waits for its whole batch);
- `async`: the quickstart's own async settings (the defaults, windowSize 2 x trainBatchSize);
- `async-refill-off`: `async.refillDuringCollection: false`;
- `async-max-age-2`: `async.maxCarryOverAgeSteps: 2` (older groups cancelled and redrawn);
- `sync-drop-uniform`, `async-drop-uniform`: `sync` and `async` with `rollout.dropUniformGroups: true`
  (dynamic sampling: groups whose rewards are all alike are dropped before the update and replaced).

in two regimes: `quickstart` (the task as shipped: tool median 0.5 s, CPU-bound on 2 cores) and `latency`
(every row's `tool_seconds` set to `--latency-tool-seconds`, 3 s: the agents mostly wait). A seed sets the
prompt order (`spec.data.seed`), the model's initial weights (`--reference-model-seed`) and the tool
latencies (benchmarks/time_to_reward_agent.py: the k-th agent of a run draws the k-th latency of the seed's
stream). Sampling in the model server and the interleaving of an async run are not seeded, so runs of one
seed still differ: that is what the seeds measure. Runs go seed by seed, each seed through every regime and
configuration, so a drift in the machine's load hits every configuration alike.

Wall-clock counts from the first rollout the gateway created (the processes' start-up is left out) to the
moment the step's metrics line appeared. Per run it records the reward curve, the seconds to reach each
threshold, the consumed age (update step minus the step that drew the group, from the trainer's log), the
rollout throughput as a share of its ideal bound (async_vs_sync.py's, with the run's own update time and
group duration), and the CPU time of the whole process tree (getrusage of the waited children), as cores
busy and as a share of the machine's cores. Each finished run is one JSON line in `--records`; a run already
there (same regime, configuration, seed and steps) is skipped, so an interrupted benchmark resumes. It
prints a table per regime (median and range over seeds) and draws the reward against wall-clock to a PNG
beside the records when matplotlib is importable. It never asserts; tests/test_time_to_reward.py runs
`--quick` end to end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from asyncrl.gateway_api.tokens import KEY_ENV_VAR
from asyncrl.launch.processes import free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from time_to_reward_stats import (  # a script's sibling module, found through sys.path
    PolicyPoint,
    StepPoint,
    consumed_ages,
    group_times,
    policy_curve,
    seconds_to_policy_reward,
    seconds_to_reward,
    spread_over_seeds,
    throughput_share,
)

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart-local.yaml"
AGENT = ROOT / "benchmarks" / "time_to_reward_agent.py"
THRESHOLDS = (0.3, 0.6, 0.9)  # the default --thresholds
# Each configuration: what it changes in spec.async (`enabled: False` replaces the section), and in
# spec.rollout.
CONFIGS: dict[str, dict[str, Any]] = {
    "sync": {"enabled": False},
    "async": {},
    "async-refill-off": {"refillDuringCollection": False},
    "async-max-age-2": {"maxCarryOverAgeSteps": 2},
    "sync-drop-uniform": {"enabled": False, "rollout": {"dropUniformGroups": True}},
    "async-drop-uniform": {"rollout": {"dropUniformGroups": True}},
}
REGIMES = ("quickstart", "latency")
# Metric names in the trainer's per-step file, newest first: the reward and step time are being renamed to
# verl's names (critic/score/mean, timing_s/step); a record reads either, so old and new runs compare.
REWARD_NAMES = ("critic/score/mean", "training/reward_mean")
STEP_SECONDS_NAMES = ("timing_s/step", "timing/step_seconds")
# A policy version is read from its own rollouts only when this many were seen with a reward (a step draws
# trainBatchSize x samplesPerPrompt = 16 in the quickstart; the last versions of a run may have fewer).
MIN_POLICY_ROLLOUTS = 8
UPDATE_SECONDS_NAMES = ("timing/update_phase_seconds",)
POLL_SECONDS = 0.25
STOP_WAIT_SECONDS = 60.0


@dataclass(frozen=True)
class Plan:
    regime: str
    config: str
    seed: int
    steps: int

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.regime, self.config, self.seed, self.steps)

    @property
    def name(self) -> str:
        return f"ttr-{self.regime}-{self.config}-s{self.seed}"


def plans(*, seeds: Sequence[int], regimes: Sequence[str], configs: Sequence[str], steps: int) -> list[Plan]:
    """Seed-major: every regime and configuration of one seed before the next seed."""
    return [Plan(regime, config, seed, steps) for seed in seeds for regime in regimes for config in configs]


def manifest_for(plan: Plan, *, latency_tool_seconds: float) -> dict[str, Any]:
    """The quickstart with the plan's configuration, regime, seed and steps; the agent is the seeded one."""
    manifest: dict[str, Any] = yaml.safe_load(QUICKSTART.read_text())
    spec = manifest["spec"]
    manifest["metadata"]["name"] = plan.name
    spec["totalSteps"] = plan.steps
    spec["data"]["seed"] = plan.seed
    if plan.regime == "latency":
        spec["data"]["inline"] = [
            {**row, "tool_seconds": latency_tool_seconds} for row in spec["data"]["inline"]
        ]
    change = dict(CONFIGS[plan.config])
    spec["rollout"] = {**spec.get("rollout", {}), **change.pop("rollout", {})}
    spec["async"] = {"enabled": False} if change.get("enabled") is False else {**spec["async"], **change}
    inline: str = spec["agents"]["template"]["inline"]
    command = '["python", "-m", "examples.toy_agent.agent"]'
    if command not in inline:
        raise SystemExit(f"time_to_reward: {QUICKSTART} changed: its agent's command is not where this looks")
    spec["agents"]["template"]["inline"] = inline.replace(command, json.dumps(["python", str(AGENT)]))
    return manifest


@dataclass
class Seen:
    """What one run showed while it ran: each metrics line with the time it appeared, and its rollouts."""

    lines: list[tuple[float, dict[str, Any]]]
    first_created: float | None = None
    rollout_spans: dict[str, tuple[float, float]] | None = None
    # rollout id -> (the step that drew it, its reward), from the completion feed
    rollout_rewards: dict[str, tuple[int, float]] = field(default_factory=dict)
    feed_gaps: int = 0  # times the completion feed answered 410 (rewards lost to the reading)


class _MetricsTail:
    """The metrics file's complete lines as they appear, each with the time it was first read."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.pending = path, 0, b""

    def read(self, seen: Seen) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as file:
            file.seek(self.offset)
            chunk = file.read()
        self.offset += len(chunk)
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                seen.lines.append((time.time(), json.loads(line)))


async def _watch(run: subprocess.Popen[bytes], metrics: Path, gateway: httpx.AsyncClient, seen: Seen) -> None:
    tail, next_listing, cursor = _MetricsTail(metrics), 0.0, 0
    spans: dict[str, tuple[float, float]] = {}
    seen.rollout_spans = spans
    while run.poll() is None:
        tail.read(seen)
        if time.monotonic() >= next_listing:  # rollouts once a second: cheap beside the run
            next_listing = time.monotonic() + 1.0
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                for item in (await gateway.get("/api/rollouts")).json()["rollouts"]:
                    created = float(item["created_at"])
                    seen.first_created = min(seen.first_created or created, created)
                    ended = item["started_at"] is not None and item["finished_at"] is not None
                    if ended and item["state"] in ("succeeded", "failed"):
                        spans[item["rollout_id"]] = (
                            float(item["started_at"]),
                            float(item["finished_at"]),
                        )
            cursor = await _read_completions(gateway, cursor, seen)
        await asyncio.sleep(POLL_SECONDS)
    tail.read(seen)  # a last line written just before the run exited


async def _read_completions(gateway: httpx.AsyncClient, cursor: int, seen: Seen) -> int:
    """Every rollout that ended with a reward, from the gateway's completion feed (each entry once, even for
    rollouts the trainer deletes right after); the cursor to read from next. A gap in the feed (410: this
    reader fell behind what the gateway keeps) is counted in `seen.feed_gaps` and skipped."""
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
        while True:
            answer = await gateway.get("/api/completions", params={"after": cursor, "wait": 0})
            if answer.status_code == 410:
                seen.feed_gaps += 1
                cursor = int(answer.json()["cursor"])
                continue
            page = answer.json()
            for entry in page["entries"]:
                if entry["reward"] is not None:
                    seen.rollout_rewards[entry["rollout_id"]] = (int(entry["step"]), float(entry["reward"]))
            if page["cursor"] == cursor or not page["entries"]:
                return int(page["cursor"])
            cursor = int(page["cursor"])
    return cursor


def _stop(run: subprocess.Popen[bytes]) -> None:
    """Ctrl-C the run (it stops its processes); kill its group if it hangs."""
    if run.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(run.pid, signal.SIGINT)
    try:
        run.wait(timeout=STOP_WAIT_SECONDS)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def run_one(plan: Plan, *, args: argparse.Namespace) -> dict[str, Any]:
    """One `asyncrl local run` of the plan, watched to its end; its record (see the module's docstring)."""
    work = (args.records.parent / plan.name).absolute()
    work.mkdir(parents=True, exist_ok=True)
    metrics, counter = work / "metrics.jsonl", work / "agent-counter"
    metrics.unlink(missing_ok=True)
    counter.unlink(missing_ok=True)
    manifest = manifest_for(plan, latency_tool_seconds=args.latency_tool_seconds)
    (work / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    key, port = secrets.token_urlsafe(32), free_port()
    env = {
        **os.environ,
        KEY_ENV_VAR: key,
        "TIME_TO_REWARD_SEED": str(plan.seed),
        "TIME_TO_REWARD_COUNTER": str(counter),
    }
    argv = [
        sys.executable, "-m", "asyncrl.cli", "local", "run", str(work / "manifest.yaml"),
        f"--work-dir={work / 'run'}", f"--metrics-file={metrics}", f"--gateway-port={port}",
        f"--reference-model-seed={plan.seed}",
    ]  # fmt: skip
    load = os.getloadavg()[0]
    cpu_before, started_at, started = _children_cpu_seconds(), time.time(), time.monotonic()
    seen = Seen(lines=[])
    with (work / "run.out").open("wb") as out:
        run = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"authorization": f"Bearer {key}"}, timeout=10.0
        ) as gateway:
            await asyncio.wait_for(_watch(run, metrics, gateway, seen), timeout=args.run_timeout)
    except TimeoutError:
        pass
    finally:
        _stop(run)  # reaps it, so its tree's CPU time is in RUSAGE_CHILDREN now
    wall = time.monotonic() - started
    cpu = _children_cpu_seconds() - cpu_before
    return record_of(
        plan,
        thresholds=args.thresholds,
        seen=seen,
        trainer_log=_read(work / "run" / "trainer.log"),
        manifest=manifest,
        exit_code=run.returncode,
        started_at=started_at,
        wall_seconds=wall,
        cpu_seconds=cpu,
        load_average=load,
    )


def record_of(
    plan: Plan,
    *,
    thresholds: Sequence[float],
    seen: Seen,
    trainer_log: str,
    manifest: dict[str, Any],
    exit_code: int,
    started_at: float,
    wall_seconds: float,
    cpu_seconds: float,
    load_average: float,
) -> dict[str, Any]:
    spec = manifest["spec"]
    zero = seen.first_created if seen.first_created is not None else started_at
    by_step = {int(line["step"]): (at, line) for at, line in seen.lines}  # a step logged twice: the last
    # A line without a reward is left out of the curve (and the run counts as incomplete), never read as 0.
    curve = [
        StepPoint(step=step, wall_seconds=round(at - zero, 3), reward=reward)
        for step, (at, line) in sorted(by_step.items())
        if (reward := _metric(line, REWARD_NAMES)) is not None
    ]
    # Version v serves from the end of update v - 1 (its metrics line); version 0 from the first rollout.
    published = {0: 0.0} | {step + 1: round(at - zero, 3) for step, (at, _) in by_step.items()}
    policies = policy_curve(
        drawn=seen.rollout_rewards.values(), published=published, min_rollouts=MIN_POLICY_ROLLOUTS
    )
    batch = int(spec["trainBatchSize"])
    window = int(spec["async"].get("windowSize") or batch) if spec["async"]["enabled"] else batch
    groups = group_times((rid, a, b) for rid, (a, b) in (seen.rollout_spans or {}).items())
    group_seconds = statistics.fmean(g.finished - g.started for g in groups) if groups else None
    updates = [u for _, line in by_step.values() if (u := _metric(line, UPDATE_SECONDS_NAMES)) is not None]
    update_seconds = statistics.fmean(updates) if updates else None
    share = None
    if group_seconds is not None and update_seconds is not None:
        share = throughput_share(
            update_times=[at for at, _ in sorted(by_step.values(), key=lambda item: item[0])],
            train_batch_size=batch,
            window_size=window,
            update_seconds=update_seconds,
            group_seconds=group_seconds,
        )
    ages = consumed_ages(trainer_log)
    steps = [t for _, line in by_step.values() if (t := _metric(line, STEP_SECONDS_NAMES)) is not None]
    return {
        "regime": plan.regime,
        "config": plan.config,
        "seed": plan.seed,
        "steps": plan.steps,
        "complete": len(curve) == plan.steps and exit_code == 0,
        "exit_code": exit_code,
        "started_at": round(started_at, 3),
        "tool_seconds": float(spec["data"]["inline"][0].get("tool_seconds", 0.5)),
        "window_size": window,
        "curve": [{"step": p.step, "wall_seconds": p.wall_seconds, "reward": p.reward} for p in curve],
        "seconds_to_reward": {
            str(threshold): seconds_to_reward(curve=curve, threshold=threshold) for threshold in thresholds
        },
        "policy_curve": [dataclasses.asdict(p) for p in policies],
        "rewarded_rollouts_seen": len(seen.rollout_rewards),
        "completion_feed_gaps": seen.feed_gaps,
        "step_seconds_median": statistics.median(steps) if steps else None,
        "consumed_age_mean": statistics.fmean(ages) if ages else None,
        "consumed_age_max": max(ages) if ages else None,
        "group_seconds_mean": group_seconds,
        "update_seconds_mean": update_seconds,
        "throughput_share": share,
        "wall_seconds": round(wall_seconds, 3),
        "cpu_seconds": round(cpu_seconds, 3),
        "cores_busy": round(cpu_seconds / wall_seconds, 3) if wall_seconds > 0 else None,
        "cpu_share": round(cpu_seconds / wall_seconds / (os.cpu_count() or 1), 3)
        if wall_seconds > 0
        else None,
        "cpu_count": os.cpu_count(),
        "load_average_1m_at_start": round(load_average, 2),
    }


def _metric(line: dict[str, Any], names: Sequence[str]) -> float | None:
    for name in names:
        if name in line:
            return float(line[name])
    return None


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records written so far; a line cut short by an interruption is skipped."""
    records = []
    for line in _read(path).splitlines():
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    return records


# -- the report ------------------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# The table's columns after the thresholds': header, width, the record's field and its format (the median
# over seeds is shown).
COLUMNS = (
    ("step s", 8, "step_seconds_median", ".1f"),
    ("age mean", 9, "consumed_age_mean", ".2f"),
    ("age max", 8, "consumed_age_max", ".0f"),
    ("share", 7, "throughput_share", ".0%"),
    ("cores", 7, "cores_busy", ".2f"),
    ("cpu %", 7, "cpu_share", ".0%"),
)


def _seconds_to(record: dict[str, Any], threshold: float) -> float | None:
    """From the record's curve, so a report may time thresholds the runs were not recorded with."""
    curve = [StepPoint(p["step"], p["wall_seconds"], p["reward"]) for p in record["curve"]]
    return seconds_to_reward(curve=curve, threshold=threshold)


def _threshold_cell(values: Sequence[float | None]) -> str:
    spread = spread_over_seeds(values)
    reached = f"({spread.reached}/{spread.seeds})"
    if spread.median is None:
        return f"- {reached}"
    return f"{spread.median:.0f} [{spread.low:.0f}-{spread.high:.0f}] {reached}"


def _mean_reward_per_step(runs: Sequence[dict[str, Any]]) -> list[str]:
    cells = []
    for index in range(max(len(r["curve"]) for r in runs)):
        rewards = [r["curve"][index]["reward"] for r in runs if index < len(r["curve"])]
        cells.append(f"{statistics.fmean(rewards):.2f}")
    return cells


def report(records: Sequence[dict[str, Any]], *, thresholds: Sequence[float]) -> list[str]:
    """A table per regime: per configuration the median [range] over seeds of the seconds to each threshold
    (reached/seeds), the reward of the last 4 steps, and the medians of the other figures; then the mean
    reward per step."""
    lines: list[str] = []
    for regime in dict.fromkeys(r["regime"] for r in records):
        mine = [r for r in records if r["regime"] == regime]
        lines += [
            "",
            f"regime {regime} (tool median {mine[0]['tool_seconds']:g} s), seconds from the first rollout:",
        ]
        lines.append(
            f"{'config':<17}{'seeds':>6}"
            + "".join(f"{'to ' + str(t):>20}" for t in thresholds)
            + f"{'last-4 reward':>15}"
            + "".join(f"{header:>{width}}" for header, width, _, _ in COLUMNS)
        )
        per_step: dict[str, list[str]] = {}
        for config in dict.fromkeys(r["config"] for r in mine):
            runs = [r for r in mine if r["config"] == config]
            last4 = [
                statistics.fmean(p["reward"] for p in r["curve"][-4:]) if r["curve"] else None for r in runs
            ]
            lines.append(
                f"{config:<17}{len(runs):>6}"
                + "".join(f"{_threshold_cell([_seconds_to(r, t) for r in runs]):>20}" for t in thresholds)
                + f"{_fmt(_median(last4), '.2f'):>15}"
                + "".join(f"{_fmt(_median([r[key] for r in runs]), fmt):>{w}}" for _, w, key, fmt in COLUMNS)
            )
            per_step[config] = _mean_reward_per_step(runs)
        lines.append("mean reward per step over seeds:")
        lines += [f"  {config:<17}" + " ".join(rewards) for config, rewards in per_step.items()]
        lines += _policy_report(mine, thresholds=thresholds)
    return lines


def _policy_points(record: dict[str, Any]) -> list[PolicyPoint]:
    return [PolicyPoint(**point) for point in record.get("policy_curve", ())]


def _versions_reward(record: dict[str, Any], versions: Sequence[int]) -> float | None:
    """The mean reward of the run's policy versions among `versions` (those read from enough rollouts)."""
    rewards = [p.reward for p in _policy_points(record) if p.version in versions]
    return statistics.fmean(rewards) if rewards else None


def _last_common_versions(runs: Sequence[dict[str, Any]], count: int = 4) -> list[int]:
    """The last `count` versions read in every run: an async run's last version or two drew too few rollouts
    before the run ended to be read, and comparing sync's last versions with async's earlier ones would be
    unfair to async."""
    common = set.intersection(*({p.version for p in _policy_points(r)} for r in runs)) if runs else set()
    return sorted(common)[-count:]


def _policy_report(runs_of_regime: Sequence[dict[str, Any]], *, thresholds: Sequence[float]) -> list[str]:
    """The same regime read by policy version: each version's reward is the mean reward of the rollouts drawn
    while it served, and its time is when it began serving. Sync's step s trains on version s's rollouts,
    async's on older ones; this reads every configuration's policies the same way."""
    runs_with = [r for r in runs_of_regime if "policy_curve" in r]
    if not runs_with:
        return []
    last = _last_common_versions(runs_with)
    last_header = f"v{last[0]}-v{last[-1]} reward" if last else "last reward"
    lines = [
        "by policy version (the mean reward of the rollouts it drew; seconds to when it began serving):",
        f"{'config':<17}{'seeds':>6}"
        + "".join(f"{'to ' + str(t):>20}" for t in thresholds)
        + f"{last_header:>15}{'rollouts/version':>18}",
    ]
    per_version: dict[str, list[str]] = {}
    for config in dict.fromkeys(r["config"] for r in runs_with):
        runs = [r for r in runs_with if r["config"] == config]
        counts = [p.rollouts for r in runs for p in _policy_points(r)]
        cells = [
            _threshold_cell([seconds_to_policy_reward(curve=_policy_points(r), threshold=t) for r in runs])
            for t in thresholds
        ]
        lines.append(
            f"{config:<17}{len(runs):>6}"
            + "".join(f"{cell:>20}" for cell in cells)
            + f"{_fmt(_median([_versions_reward(r, last) for r in runs]), '.2f'):>15}"
            + f"{_fmt(statistics.median(counts) if counts else None):>18}"
        )
        versions = range(max((r["steps"] for r in runs), default=0))
        per_version[config] = [
            _fmt(statistics.fmean(found), ".2f")
            if (found := [p.reward for r in runs for p in _policy_points(r) if p.version == v])
            else "  - "
            for v in versions
        ]
    lines.append("mean reward per policy version over seeds:")
    lines += [f"  {config:<17}" + " ".join(cells) for config, cells in per_version.items()]
    return lines


def draw(records: Sequence[dict[str, Any]], output: Path, *, thresholds: Sequence[float]) -> str:
    """Reward against wall-clock, one panel per regime, one colour per configuration, one line per seed:
    solid, the reward each step trained on, at the step's end; dashed, each policy version's reward (its
    own rollouts'), at the moment it began serving."""
    try:
        import matplotlib
    except ImportError:
        return "no curves drawn: matplotlib is not installed (pip install -e '.[plot]')"
    matplotlib.use("Agg")
    from matplotlib import pyplot

    regimes = list(dict.fromkeys(r["regime"] for r in records))
    figure, axes = pyplot.subplots(1, len(regimes), figsize=(7 * len(regimes), 5), squeeze=False)
    palette = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
    colours = dict(zip(CONFIGS, palette, strict=True))
    for axis, regime in zip(axes[0], regimes, strict=True):
        labelled: set[str] = set()
        for r in (r for r in records if r["regime"] == regime):
            label = None if r["config"] in labelled else r["config"]
            labelled.add(r["config"])
            xs = [p["wall_seconds"] for p in r["curve"]]
            axis.plot(
                xs, [p["reward"] for p in r["curve"]], color=colours.get(r["config"]), label=label, alpha=0.7
            )
            policies = _policy_points(r)  # dashed: each policy version's own reward, from when it served
            axis.plot(
                [p.published_seconds for p in policies],
                [p.reward for p in policies],
                color=colours.get(r["config"]),
                linestyle="--",
                alpha=0.5,
            )
        for threshold in thresholds:
            axis.axhline(threshold, color="grey", linewidth=0.5, linestyle=":")
        tool = next(r["tool_seconds"] for r in records if r["regime"] == regime)
        axis.set_title(f"{regime} (tool median {tool:g} s)")
        axis.set_xlabel("seconds from the first rollout")
        axis.set_ylabel("mean reward")
        axis.legend()
    figure.savefig(output, dpi=100, bbox_inches="tight")
    pyplot.close(figure)
    return f"curves: {output}"


# -- the driver ------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="default: %(default)s")
    parser.add_argument(
        "--regimes", nargs="+", choices=REGIMES, default=list(REGIMES), help="default: %(default)s"
    )
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument(
        "--thresholds",
        type=float,
        nargs="+",
        default=list(THRESHOLDS),
        help="rewards to time (default %(default)s)",
    )
    parser.add_argument("--steps", type=int, default=16, help="totalSteps of each run (default %(default)s)")
    parser.add_argument(
        "--latency-tool-seconds",
        type=float,
        default=3.0,
        help="the toy tool's median latency in the latency regime (default %(default)s)",
    )
    parser.add_argument(
        "--run-timeout", type=float, default=1200.0, help="a run is stopped after this (default %(default)s)"
    )
    parser.add_argument(
        "--records",
        type=Path,
        default=Path(".asyncrl/time-to-reward/records.jsonl"),
        help="one JSON line per run; runs already there are skipped (default %(default)s)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: sync and async, seed 0, quickstart regime, 3 steps"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.regimes, args.configs, args.steps = [0], ["quickstart"], ["sync", "async"], 3
    return args


def seconds_left(plans_left: Sequence[Plan], durations: dict[tuple[str, str], list[float]]) -> float | None:
    """Each run left at the mean duration of its regime and configuration so far (of all runs when that
    pair has not run yet: sync and async differ by 3x, so one mean for all would mislead)."""
    if not durations:
        return None
    overall = statistics.fmean(d for runs in durations.values() for d in runs)
    return sum(
        statistics.fmean(durations[(p.regime, p.config)]) if (p.regime, p.config) in durations else overall
        for p in plans_left
    )


def _interrupted(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM (`timeout`, `kill`) unwinds like Ctrl-C, so the run in progress is stopped (`run_one`'s finally)
    # instead of left running with its gateway, trainer and agents after this process is gone.
    signal.signal(signal.SIGTERM, _interrupted)
    args.records.parent.mkdir(parents=True, exist_ok=True)
    todo = plans(seeds=args.seeds, regimes=args.regimes, configs=args.configs, steps=args.steps)
    done = {
        (r["regime"], r["config"], r["seed"], r["steps"]) for r in read_records(args.records) if r["complete"]
    }
    pending = [plan for plan in todo if plan.key not in done]
    print(
        f"time_to_reward: {len(todo)} runs ({len(todo) - len(pending)} already in {args.records}), "
        f"{args.steps} steps each, {os.cpu_count()} cores",
        flush=True,
    )
    durations: dict[tuple[str, str], list[float]] = {}
    try:
        for index, plan in enumerate(pending, start=1):
            left = seconds_left(pending[index - 1 :], durations)
            eta = "" if left is None else f", about {left / 60:.0f} min left"
            print(
                f"[{index}/{len(pending)}] seed {plan.seed} {plan.regime} {plan.config}: started{eta}",
                flush=True,
            )
            record = asyncio.run(run_one(plan, args=args))
            durations.setdefault((plan.regime, plan.config), []).append(record["wall_seconds"])
            with args.records.open("a") as file:
                file.write(json.dumps(record) + "\n")
            reached = ", ".join(f"{t} at {_fmt(s)} s" for t, s in record["seconds_to_reward"].items())
            rewards = [p["reward"] for p in record["curve"]]
            print(
                f"[{index}/{len(pending)}] seed {plan.seed} {plan.regime} {plan.config}: "
                + ("finished" if record["complete"] else f"INCOMPLETE (exit {record['exit_code']})")
                + f" in {record['wall_seconds']:.0f} s; {len(rewards)} steps, reward "
                + (f"{rewards[0]:.2f} -> {rewards[-1]:.2f}" if rewards else "-")
                + f"; {reached}; {record['cores_busy']:.2f} cores busy",
                flush=True,
            )
    except KeyboardInterrupt:
        print("time_to_reward: interrupted; the runs finished so far are kept", flush=True)
    wanted = {plan.key for plan in todo}
    records = [
        r for r in read_records(args.records) if (r["regime"], r["config"], r["seed"], r["steps"]) in wanted
    ]
    print("\n".join(report(records, thresholds=args.thresholds)))
    if records:
        print(draw(records, args.records.with_suffix(".png"), thresholds=args.thresholds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
