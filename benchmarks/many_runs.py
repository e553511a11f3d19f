"""Many runs, one operator: what each concurrent run costs the operator and the API server (issue 25 item 9).

What it measures
    The same real parts as `operator_jobs.py`: etcd, kube-apiserver and kube-controller-manager on loopback,
    the committed CRD, the `asyncrl operator` process, and per run the `asyncrl gateway` process (the native
    sidecar of the run's trainer pod, started by the pod runner, which stands in for the kubelet). Stand-ins:
    the trainer container only keeps its pod alive, and every agent container is `true`.

    This script plays every run's trainer. For each size N (`--runs 1,10,50,100`) it starts a fresh operator
    process, applies N small runs at once, waits until every run is `Running`, then for `--minutes` drives
    each run as a trainer would: every `--step-seconds` (runs staggered across the interval) it posts
    `--rollouts-per-step` rollouts (each becomes an agent Job) and then the step's window summary
    (`PUT /api/window/summary`), noting the time. One namespace-wide watch of the runs notes when each
    run's `status.step` first shows that step: the **status lag** is the time between the two, i.e. from the
    gateway having the step to `kubectl get atr` showing it (the operator's long poll, its reconcile and its
    status patch, and the watch's delivery). Then the runs are deleted and collected before the next size.

    Per size: the operator's CPU seconds (utime + stime from /proc, its render workers included) per run
    and minute; its memory (peak VmHWM of the process, plus its render workers' VmRSS sampled every 2 s);
    API requests per run-minute over the window, twice: the operator's own (its client's counter,
    `asyncrl_operator_api_requests_total`; kopf's own requests are not in it) and the kube-apiserver's
    `apiserver_request_total` (all clients: the operator and kopf, kube-controller-manager, the pod runner and
    this script's watch), each broken down by verb and resource for the largest size; status lag p50 / p99 /
    max; steps never seen in the status within `--grace` seconds.

Failover (`--failover`, issue 38 item 3)
    Per size, two operators with `--leader-elect` instead of one. Once every run is Running, the leader (the
    Lease's holder) is SIGKILLed and the window starts at once, driven as above. The **failover time** is the
    kill to the first status write the watch sees from the new leader (writes within 1 s of the kill are
    the dead leader's last requests in flight); **recovery** is the kill to every run's status written by
    it. The status lag is reported for the steps posted after the failover (and, apart, for those posted
    during it, which wait for the new leader), and for those posted after the recovery. The operator's
    memory is the survivor's. A replica that exits before the kill (it lost the Lease under the load of
    starting the runs) is started again, as its Deployment would, and counted ("lost at start").
    Targets: failover under 15 s; status lag p99 <= 5 s after the failover.

Targets (issue 25 item 9)
    At 100 runs: status lag p99 <= 5 s; operator memory <= 1 GiB; the cost per run (the operator's CPU and
    its own API requests per run-minute) at the largest size within 1.5x of that at the smallest size of at
    least 10 runs (growing no faster than linearly, with room for noise on a shared machine). The API
    server's all-client count is printed but not held to it: at 100 runs kube-controller-manager (20
    requests/s by default) falls behind on the agent Jobs' pods, so its share per run-minute shrinks.

Run
    .venv/bin/python benchmarks/many_runs.py [--runs 1,10,50,100] [--minutes 2] [--step-seconds 15]
        [--rollouts-per-step 1] [--failover [--election LEASE,DEADLINE,RETRY]]
    Needs the provisioned control plane (scripts/provision-k8s.sh). The default run takes about 20 minutes on
    a 2-core machine, most of it starting and collecting 161 runs' pods.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import math
import os
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import table, verdict
from operator_jobs import (
    NAMESPACE,
    Gateway,
    _free_port_pair,
    _kubectl,
    apiserver_requests,
    cluster,
    gateway_key,
    operator_cpu_seconds,
    requests_delta,
    run_manifest,
    start_operator,
)

from asyncrl.api.types.meta import GROUP, PLURAL, VERSION
from asyncrl.operator.leadership import DEFAULT_LEASE_NAME
from asyncrl.testing.controlplane import ControlPlane
from asyncrl.testing.processes import ServerProcess
from asyncrl.testing.waiting import WaitTimeout, wait_for
from asyncrl.workloads import names

TARGET_RUNS = 100
TARGET_LAG_P99_SECONDS = 5.0
TARGET_MEMORY_BYTES = 1 << 30
LINEAR_SLACK = 1.5
JOBS_PER_MINUTE = 100_000  # no rate limit: the benchmark sets the pace


@dataclass
class SizeResult:
    runs: int
    window_seconds: float = 0.0
    startup_seconds: float = 0.0  # applying N runs until all are Running
    cleanup_seconds: float = 0.0
    lags: list[float] = field(default_factory=list)  # seconds, one per (run, step) seen in the status
    unseen_steps: int = 0  # steps posted but never shown in the status within the grace period
    steps_posted: int = 0
    rollouts_posted: int = 0
    operator_cpu: float = 0.0  # seconds over the window, the operator and its render workers
    operator_peak_bytes: int = 0  # VmHWM of the operator + the largest sampled VmRSS of its children
    requests: dict[tuple[str, str], float] = field(default_factory=dict)  # the API server's, all clients
    operator_requests: dict[tuple[str, str], float] = field(default_factory=dict)  # the operator's own

    @property
    def run_minutes(self) -> float:
        return self.runs * self.window_seconds / 60.0

    def cpu_per_run_minute(self) -> float:
        return self.operator_cpu / self.run_minutes

    def requests_per_run_minute(self) -> float:
        return sum(self.requests.values()) / self.run_minutes

    def operator_requests_per_run_minute(self) -> float:
        return sum(self.operator_requests.values()) / self.run_minutes

    def lag(self, quantile: float) -> float:
        if not self.lags:
            return math.nan
        ordered = sorted(self.lags)
        return ordered[min(len(ordered) - 1, math.ceil(quantile * len(ordered)) - 1)]


# -- the operator process, measured from /proc ------------------------------------------------------------


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _status_bytes(pid: int, key: str) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    return 0


def _cpu_with_children(pid: int) -> float:
    total = operator_cpu_seconds(pid)
    for child in _children(pid):
        with contextlib.suppress(OSError):
            total += operator_cpu_seconds(child)
    return total


class MemorySampler:
    """The operator's children's VmRSS every 2 s (the operator's own peak is its VmHWM)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.children_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(2.0):
            rss = sum(_status_bytes(child, "VmRSS") for child in _children(self.pid))
            self.children_peak = max(self.children_peak, rss)

    def peak_bytes(self) -> int:
        return _status_bytes(self.pid, "VmHWM") + self.children_peak


_METRIC_LABEL = re.compile(r'(\w+)="([^"]*)"')


def operator_requests(metrics_port: int) -> dict[tuple[str, str], float]:
    """The operator's own `asyncrl_operator_api_requests_total` by (verb, resource); kopf's not included."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    counts: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        if line.startswith("asyncrl_operator_api_requests_total{"):
            labels_text, _, value = line.rpartition("} ")
            labels = dict(_METRIC_LABEL.findall(labels_text))
            counts[(labels["verb"], labels["resource"])] = float(value)
    return counts


# -- the runs' status, watched ----------------------------------------------------------------------------


class StepWatch:
    """One watch of every run in the namespace: when each run's status.step first reached each value."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.seen: dict[tuple[str, int], float] = {}  # (run, step): monotonic time first seen
        self.phases: dict[str, str] = {}
        self.changes: dict[str, list[float]] = {}  # run: monotonic times its status changed
        self._statuses: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._streams: list[Any] = []
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> StepWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for stream in self._streams:
            stream.stop()

    def first_seen(self, run: str, step: int) -> float | None:
        with self._lock:
            return self.seen.get((run, step))

    def first_changes_after(self, moment: float) -> dict[str, float]:
        """Each run's first status change after `moment` (runs without one are absent)."""
        with self._lock:
            found = {
                run: next((at for at in times if at > moment), None) for run, times in self.changes.items()
            }
        return {run: at for run, at in found.items() if at is not None}

    def phase_counts(self) -> dict[str, int]:
        with self._lock:
            counts: dict[str, int] = {}
            for phase in self.phases.values():
                counts[phase] = counts.get(phase, 0) + 1
            return counts

    def _watch(self) -> None:
        from kubernetes import client, watch

        custom = client.CustomObjectsApi(self.api)
        resource_version = ""
        while not self._stop.is_set():
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            self._streams.append(stream)
            resume = {"resource_version": resource_version} if resource_version else {}
            try:
                for event in stream.stream(
                    custom.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    NAMESPACE,
                    PLURAL,
                    timeout_seconds=60,
                    **resume,
                ):
                    now = time.monotonic()
                    raw: dict[str, Any] = event["raw_object"]
                    resource_version = raw["metadata"]["resourceVersion"]
                    self._note(event["type"], raw, now)
                    if self._stop.is_set():
                        return
            except Exception:  # a dropped connection, or a resourceVersion too old: list again
                if self._stop.is_set():
                    return
                resource_version = ""
                time.sleep(0.5)

    def _note(self, event_type: str, run: dict[str, Any], now: float) -> None:
        name = run["metadata"]["name"]
        status = run.get("status") or {}
        with self._lock:
            if event_type == "DELETED":
                self.phases.pop(name, None)
                return
            self.phases[name] = str(status.get("phase", ""))
            if status != self._statuses.get(name):
                self.changes.setdefault(name, []).append(now)
                self._statuses[name] = status
            step = status.get("step")
            if isinstance(step, int):
                # A step the status jumped over (two summaries within one write) counts as shown then too.
                for earlier in range(step, -1, -1):
                    if (name, earlier) in self.seen:
                        break
                    self.seen[(name, earlier)] = now


# -- one size ---------------------------------------------------------------------------------------------


@dataclass
class RunHandle:
    name: str
    gateway: Gateway | None = None
    posted: dict[int, float] = field(default_factory=dict)  # step: monotonic time its summary was accepted


def _distinct_ports(runs: list[str]) -> dict[str, int]:
    """A gateway port per run (and its successor, the trainer's inference port), no two runs sharing one:
    nothing listens yet, so the kernel may offer the same free port twice."""
    taken: set[int] = set()
    ports: dict[str, int] = {}
    for run in runs:
        port = _free_port_pair()
        while {port, port + 1} & taken:
            port = _free_port_pair()
        taken.update((port, port + 1))
        ports[run] = port
    return ports


def _apply_runs(plane: ControlPlane, runs: list[str], ports: dict[str, int]) -> None:
    manifests = [
        run_manifest(name, gateway_port=ports[name], jobs_per_minute=JOBS_PER_MINUTE) for name in runs
    ]
    for manifest in manifests:
        manifest["spec"]["agents"]["ttlSecondsAfterFinished"] = 30  # collected while the window runs
    _kubectl(
        plane, "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    )


def _wait_started(api: Any, handles: list[RunHandle], watch: StepWatch, ports: dict[str, int]) -> None:
    """Every run's gateway key read and gateway answering, then every run Running; progress on the way."""
    pending = list(handles)
    deadline = time.monotonic() + 120 + 6 * len(handles)  # pods start one Python process pair each
    last_print = 0.0
    while pending:
        still = []
        for handle in pending:
            if handle.gateway is None:
                key = gateway_key(api, handle.name)
                if key is not None:
                    handle.gateway = Gateway(ports[handle.name], key)
            if handle.gateway is None or not handle.gateway.up():
                still.append(handle)
        pending = still
        if time.monotonic() - last_print > 15:
            print(f"  gateways answering: {len(handles) - len(pending)}/{len(handles)}", flush=True)
            last_print = time.monotonic()
        if time.monotonic() > deadline:
            silent = ", ".join(f"{h.name} (port {ports[h.name]})" for h in pending[:5])
            raise WaitTimeout(f"{len(pending)} of {len(handles)} gateways never answered: {silent}")
        if pending:
            time.sleep(1.0)
    wait_for(
        lambda: watch.phase_counts().get("Running", 0) == len(handles),
        timeout=120 + len(handles),
        what=f"all {len(handles)} runs Running (phases: {watch.phase_counts()})",
        interval=1.0,
    )


def _drive(handles: list[RunHandle], *, minutes: float, step_seconds: float, rollouts_per_step: int) -> int:
    """Play every run's trainer for `minutes`; each run's ticks are offset across the interval. Returns the
    rollouts posted."""
    began = time.monotonic()
    end = began + minutes * 60.0
    ticks = [(began + index * step_seconds / len(handles), index, 1) for index in range(len(handles))]
    heapq.heapify(ticks)
    rollouts = 0
    lock = threading.Lock()

    def tick(handle: RunHandle, step: int) -> None:
        nonlocal rollouts
        assert handle.gateway is not None
        batch = [
            {"rollout_id": f"s{step}-r{i}", "group_id": f"s{step}-g{i}", "step": step, "input": {"i": i}}
            for i in range(rollouts_per_step)
        ]
        try:
            if batch:
                handle.gateway.request("POST", "/api/rollouts", batch)
            handle.gateway.request("PUT", "/api/window/summary", {"step": step, "total_steps": 100_000})
        except (urllib.error.URLError, OSError) as error:
            print(f"  {handle.name} step {step}: the gateway refused: {error}", file=sys.stderr, flush=True)
            return
        with lock:
            handle.posted[step] = time.monotonic()
            rollouts += len(batch)

    with ThreadPoolExecutor(max_workers=8) as pool:
        while ticks:
            due, index, step = heapq.heappop(ticks)
            if due >= end:
                break
            time.sleep(max(0.0, due - time.monotonic()))
            pool.submit(tick, handles[index], step)
            heapq.heappush(ticks, (due + step_seconds, index, step + 1))
    return rollouts


def _collect_lags(handles: list[RunHandle], watch: StepWatch, grace: float, result: SizeResult) -> None:
    def all_seen() -> bool:
        return all(watch.first_seen(h.name, step) is not None for h in handles for step in h.posted)

    with contextlib.suppress(WaitTimeout):
        wait_for(all_seen, timeout=grace, what="every posted step in the status", interval=0.5)
    for handle in handles:
        for step, posted in handle.posted.items():
            result.steps_posted += 1
            seen = watch.first_seen(handle.name, step)
            if seen is None:
                result.unseen_steps += 1
            else:
                result.lags.append(max(0.0, seen - posted))


def _delete_all(api: Any, plane: ControlPlane, timeout: float) -> float:
    from kubernetes import client

    began = time.monotonic()
    _kubectl(plane, "delete", PLURAL, "--all", "-n", NAMESPACE, "--wait=false")

    def gone() -> bool:
        custom = client.CustomObjectsApi(api)
        if custom.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, limit=1)["items"]:
            return False
        pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=names.LABEL_RUN, limit=1)
        return not pods.items

    with contextlib.suppress(WaitTimeout):
        wait_for(gone, timeout=timeout, what="every run and pod collected", interval=1.0)
    return time.monotonic() - began


def measure_size(
    api: Any, plane: ControlPlane, work_dir: Path, runs: int, args: argparse.Namespace
) -> SizeResult:
    result = SizeResult(runs=runs)
    log_dir = work_dir / f"operator-{runs}"
    log_dir.mkdir(parents=True, exist_ok=True)
    operator, metrics_port = start_operator(plane, log_dir, tuple(args.operator_args))
    pid = operator.process.pid
    try:
        names_ = [f"run-{runs}-{index}" for index in range(runs)]
        ports = _distinct_ports(names_)
        handles = [RunHandle(name) for name in names_]
        with StepWatch(api) as watch, MemorySampler(pid) as memory:
            began = time.monotonic()
            _apply_runs(plane, names_, ports)
            _wait_started(api, handles, watch, ports)
            result.startup_seconds = time.monotonic() - began
            print(f"  all {runs} Running after {result.startup_seconds:.0f} s; driving", flush=True)
            requests_before = apiserver_requests(plane)
            own_before = operator_requests(metrics_port)
            cpu_before = _cpu_with_children(pid)
            window_began = time.monotonic()
            result.rollouts_posted = _drive(
                handles,
                minutes=args.minutes,
                step_seconds=args.step_seconds,
                rollouts_per_step=args.rollouts_per_step,
            )
            result.window_seconds = time.monotonic() - window_began
            result.operator_cpu = _cpu_with_children(pid) - cpu_before
            result.requests = requests_delta(requests_before, apiserver_requests(plane))
            result.operator_requests = requests_delta(own_before, operator_requests(metrics_port))
            _collect_lags(handles, watch, args.grace, result)
            result.operator_peak_bytes = memory.peak_bytes()
        result.cleanup_seconds = _delete_all(api, plane, timeout=300 + 3 * runs)
    except BaseException:
        print(operator.log()[-4000:], file=sys.stderr)
        raise
    finally:
        operator.stop()
    return result


# -- failover: two elected operators, the leader SIGKILLed --------------------------------------------------

LEADER_ELECT = ("--leader-elect",)
IN_FLIGHT_SECONDS = 1.0  # status writes seen this soon after the kill are the dead leader's last requests
TARGET_FAILOVER_SECONDS = 15.0


@dataclass
class FailoverResult:
    runs: int
    failover_seconds: float = math.nan  # the kill to the new leader's first status write
    recovery_seconds: float = math.nan  # the kill to every run's status written by the new leader
    recovered_runs: int = 0
    after: SizeResult = field(default_factory=lambda: SizeResult(runs=0))  # lags of steps posted after it
    during: list[float] = field(default_factory=list)  # lags of steps posted between the kill and it
    lost_after_kill: int = 0  # the survivor's own Lease losses (it exits: the runs stop being served)
    lost_while_starting: int = 0  # Leases lost under the load of starting the runs (the replica restarted)
    recovered: SizeResult = field(default_factory=lambda: SizeResult(runs=0))  # steps posted after recovery


def _lease_holder(api: Any) -> str:
    from kubernetes import client

    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(DEFAULT_LEASE_NAME, NAMESPACE)
    except client.exceptions.ApiException:
        return ""
    return str(lease.spec.holder_identity or "")


def measure_failover(
    api: Any, plane: ControlPlane, work_dir: Path, runs: int, args: argparse.Namespace
) -> FailoverResult:
    result = FailoverResult(runs=runs, after=SizeResult(runs=runs))

    def replica(name: str) -> tuple[ServerProcess, int]:
        log_dir = work_dir / f"failover-{runs}" / name
        log_dir.mkdir(parents=True, exist_ok=True)
        return start_operator(plane, log_dir, (*LEADER_ELECT, *args.election_args, *args.operator_args))

    operators = [replica("a"), replica("b")]
    restarting = threading.Event()

    def restart_exited() -> None:
        """What their Deployment would do: a replica that exited (it lost the Lease) starts again."""
        while not restarting.wait(1.0):
            for index, (operator, _) in enumerate(operators):
                if operator.process.poll() is not None:
                    result.lost_while_starting += operator.log().count("lost Lease")
                    print(f"  replica {index} exited (lost the Lease); restarting it", flush=True)
                    operators[index] = replica(f"{'ab'[index]}-{result.lost_while_starting}")

    restarter = threading.Thread(target=restart_exited, daemon=True)
    restarter.start()
    try:
        wait_for(lambda: _lease_holder(api), timeout=60, what="a leader")
        names_ = [f"run-{runs}-{index}" for index in range(runs)]
        ports = _distinct_ports(names_)
        handles = [RunHandle(name) for name in names_]
        with StepWatch(api) as watch:
            began = time.monotonic()
            _apply_runs(plane, names_, ports)
            _wait_started(api, handles, watch, ports)
            result.after.startup_seconds = time.monotonic() - began
            restarting.set()  # from here on, an exit is the measurement's (the SIGKILL, or a loss counted)
            restarter.join()
            pids = [operator.process.pid for operator, _ in operators]
            holder = wait_for(
                lambda: (h := _lease_holder(api)) and int(h.rsplit("-", 2)[-2]) in pids and h,
                timeout=60,
                what="a running replica to hold the Lease",
            )
            leader = pids.index(int(str(holder).rsplit("-", 2)[-2]))  # hostname-pid-random outside a pod
            survivor, metrics_port = operators[1 - leader]
            print(
                f"  all {runs} Running after {result.after.startup_seconds:.0f} s; killing the leader",
                flush=True,
            )
            own_before = operator_requests(metrics_port)
            cpu_before = _cpu_with_children(survivor.process.pid)
            with MemorySampler(survivor.process.pid) as memory:
                killed_at = time.monotonic()
                os.killpg(pids[leader], signal.SIGKILL)
                operators[leader][0].process.wait(timeout=30)
                result.after.rollouts_posted = _drive(
                    handles,
                    minutes=args.minutes,
                    step_seconds=args.step_seconds,
                    rollouts_per_step=args.rollouts_per_step,
                )
                result.after.window_seconds = time.monotonic() - killed_at
                result.after.operator_cpu = _cpu_with_children(survivor.process.pid) - cpu_before
                result.after.operator_requests = requests_delta(own_before, operator_requests(metrics_port))
                _collect_lags(handles, watch, args.grace, SizeResult(runs=runs))  # waits up to --grace
            result.after.operator_peak_bytes = memory.peak_bytes()
            result.lost_after_kill = survivor.log().count("lost Lease")
            firsts = watch.first_changes_after(killed_at + IN_FLIGHT_SECONDS)
            result.recovered_runs = len(firsts)
            if firsts:
                failover_at = min(firsts.values())
                result.failover_seconds = failover_at - killed_at
                recovered_at = max(firsts.values()) if len(firsts) == runs else math.inf
                result.recovery_seconds = recovered_at - killed_at
                _split_lags(handles, watch, failover_at, result)
                _split_lags(handles, watch, recovered_at, result, into=result.recovered)
        result.after.cleanup_seconds = _delete_all(api, plane, timeout=300 + 3 * runs)
    except BaseException:
        for operator, _ in operators:
            print(operator.log()[-3000:], file=sys.stderr)
        raise
    finally:
        restarting.set()
        for operator, _ in operators:
            operator.stop()
    return result


def _split_lags(
    handles: list[RunHandle],
    watch: StepWatch,
    failover_at: float,
    result: FailoverResult,
    into: SizeResult | None = None,
) -> None:
    """The lags of the steps posted after `failover_at` into `into` (default `result.after`), those posted
    before it (during the failover) into `result.during`."""
    after = result.after if into is None else into
    for handle in handles:
        for step, posted in handle.posted.items():
            seen = watch.first_seen(handle.name, step)
            if posted < failover_at:
                if seen is not None and into is None:
                    result.during.append(max(0.0, seen - posted))
                continue
            after.steps_posted += 1
            if seen is None:
                after.unseen_steps += 1
            else:
                after.lags.append(max(0.0, seen - posted))


def report_failover(results: list[FailoverResult]) -> bool:
    rows = [
        [
            r.runs,
            f"{r.failover_seconds:.1f}",
            f"{r.recovery_seconds:.1f}"
            if r.recovered_runs == r.runs
            else f"{r.recovered_runs}/{r.runs} runs",
            f"{len(r.during)}",
            f"{max(r.during, default=math.nan):.1f}",
            f"{r.after.steps_posted}",
            f"{r.after.unseen_steps}",
            f"{r.after.lag(0.5):.2f}",
            f"{r.after.lag(0.99):.2f}",
            f"{max(r.after.lags, default=math.nan):.2f}",
            f"{r.recovered.lag(0.5):.2f} / {r.recovered.lag(0.99):.2f}",
            f"{r.after.operator_peak_bytes >> 20}",
            f"{r.lost_while_starting}",
            f"{r.lost_after_kill}",
        ]
        for r in results
    ]
    headers = [
        "runs",
        "failover s",
        "recovery s",
        "steps during",
        "their lag max s",
        "steps after",
        "unseen",
        "lag p50 s",
        "lag p99 s",
        "lag max s",
        "after recovery p50/p99 s",
        "survivor MiB",
        "lost at start",
        "survivor lost Lease",
    ]
    print(table(headers, rows))
    met = True
    for r in results:
        checks = [
            (
                f"{r.runs} runs: failover under {TARGET_FAILOVER_SECONDS:.0f} s",
                r.failover_seconds < TARGET_FAILOVER_SECONDS,
                f"{r.failover_seconds:.1f} s",
            ),
            (
                f"{r.runs} runs: lag p99 <= {TARGET_LAG_P99_SECONDS:.0f} s after the failover, all shown",
                r.after.lag(0.99) <= TARGET_LAG_P99_SECONDS and r.after.unseen_steps == 0,
                f"p99 {r.after.lag(0.99):.2f} s, {r.after.unseen_steps} unseen",
            ),
            (
                f"{r.runs} runs: the new leader keeps the Lease",
                r.lost_after_kill == 0,
                f"{r.lost_after_kill} lost",
            ),
        ]
        for name, ok, detail in checks:
            print(verdict(name, ok, detail))
            met = met and ok
    return met


# -- the report -------------------------------------------------------------------------------------------


def report(results: list[SizeResult]) -> bool:
    mib = 1 << 20
    rows = [
        [
            r.runs,
            f"{r.startup_seconds:.0f}",
            f"{r.window_seconds:.0f}",
            f"{r.steps_posted}",
            f"{r.unseen_steps}",
            f"{r.lag(0.5):.2f}",
            f"{r.lag(0.99):.2f}",
            f"{max(r.lags, default=math.nan):.2f}",
            f"{r.operator_cpu:.1f}",
            f"{r.cpu_per_run_minute() * 1000:.0f}",
            f"{r.operator_peak_bytes / mib:.0f}",
            f"{r.operator_peak_bytes / mib / r.runs:.1f}",
            f"{sum(r.requests.values()):.0f}",
            f"{r.requests_per_run_minute():.1f}",
            f"{r.operator_requests_per_run_minute():.1f}",
        ]
        for r in results
    ]
    headers = [
        "runs",
        "start s",
        "window s",
        "steps",
        "unseen",
        "lag p50 s",
        "lag p99 s",
        "lag max s",
        "op CPU s",
        "CPU ms/run-min",
        "op MiB",
        "MiB/run",
        "API reqs",
        "reqs/run-min",
        "op reqs/run-min",
    ]
    print(table(headers, rows))
    largest = max(results, key=lambda r: r.runs)
    for title, requests in (
        ("the operator's own requests", largest.operator_requests),
        ("API server requests, all clients", largest.requests),
    ):
        print(f"\n{largest.runs} runs: {title} by verb and resource, largest first")
        if not requests:
            print("(none counted: an operator without asyncrl_operator_api_requests_total, an older version)")
            continue
        ordered = sorted(requests.items(), key=lambda item: -item[1])
        print(
            table(
                ["verb", "resource", "requests", "per run-minute"],
                [
                    [verb, resource, f"{count:.0f}", f"{count / largest.run_minutes:.2f}"]
                    for (verb, resource), count in ordered[:16]
                ],
            )
        )
    print()
    met = True
    if largest.runs >= TARGET_RUNS:
        checks = [
            (
                f"{largest.runs} runs: status lag p99 <= {TARGET_LAG_P99_SECONDS:.0f} s, every step shown",
                largest.lag(0.99) <= TARGET_LAG_P99_SECONDS and largest.unseen_steps == 0,
                f"p99 {largest.lag(0.99):.2f} s, {largest.unseen_steps} unseen",
            ),
            (
                f"{largest.runs} runs: operator memory <= 1 GiB",
                largest.operator_peak_bytes <= TARGET_MEMORY_BYTES,
                f"{largest.operator_peak_bytes / mib:.0f} MiB",
            ),
        ]
        for name, ok, detail in checks:
            print(verdict(name, ok, detail))
            met = met and ok
    else:
        print(f"(the lag and memory targets are for {TARGET_RUNS} runs; the largest here is {largest.runs})")
    baseline = min((r for r in results if r.runs >= 10), key=lambda r: r.runs, default=None)
    if baseline is not None and largest is not baseline:
        for name, small, large in (
            ("CPU per run-minute", baseline.cpu_per_run_minute(), largest.cpu_per_run_minute()),
            (
                "the operator's API requests per run-minute",
                baseline.operator_requests_per_run_minute(),
                largest.operator_requests_per_run_minute(),
            ),
        ):
            ratio = large / small if small else math.inf
            ok = ratio <= LINEAR_SLACK
            print(
                verdict(
                    f"{name} at {largest.runs} runs within {LINEAR_SLACK}x of {baseline.runs} runs",
                    ok,
                    f"{ratio:.2f}x",
                )
            )
            met = met and ok
    return met


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"--runs takes comma-separated counts, e.g. 1,10,50,100; got {text!r}"
        ) from error
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--runs needs counts >= 1, e.g. 1,10,50,100; got {text!r}")
    return sizes


def _durations(text: str) -> tuple[str, ...]:
    lease, deadline, retry = text.split(",")
    return (
        f"--leader-election-lease-seconds={lease}",
        f"--leader-election-renew-deadline-seconds={deadline}",
        f"--leader-election-retry-seconds={retry}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=parse_sizes, default=[1, 10, 50, 100], help="sizes, e.g. 1,10,50,100")
    parser.add_argument("--minutes", type=float, default=2.0, help="the measured window per size")
    parser.add_argument("--step-seconds", type=float, default=15.0, help="each run's step interval")
    parser.add_argument("--rollouts-per-step", type=int, default=1, help="agent Jobs per run and step")
    parser.add_argument("--grace", type=float, default=30.0, help="seconds a step may take to show after")
    parser.add_argument(
        "--failover",
        action="store_true",
        help="two operators with --leader-elect; SIGKILL the leader once the runs are Running (see above)",
    )
    parser.add_argument(
        "--election",
        type=_durations,
        default=(),
        metavar="LEASE,DEADLINE,RETRY",
        dest="election_args",
        help="with --failover: the election's durations in seconds (default: the operator's)",
    )
    parser.add_argument(
        "--operator-arg",
        action="append",
        default=[],
        dest="operator_args",
        metavar="FLAG",
        help="one more flag for each operator, e.g. --operator-arg=--api-workers=6 (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.step_seconds <= 0 or args.minutes <= 0 or args.rollouts_per_step < 0:
        parser.error("--minutes and --step-seconds must be > 0, --rollouts-per-step >= 0")
    began = time.monotonic()
    results: list[SizeResult] = []
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-many-runs-") as tmp:
        work_dir = Path(tmp)
        with cluster(work_dir) as (plane, api):
            if args.failover:
                return _main_failover(api, plane, work_dir, args, began)
            for runs in args.runs:
                print(f"{runs} runs: applying", flush=True)
                results.append(measure_size(api, plane, work_dir, runs, args))
                done = results[-1]
                print(
                    f"  done: lag p50 {done.lag(0.5):.2f} s, p99 {done.lag(0.99):.2f} s, "
                    f"{done.unseen_steps} unseen; operator {done.operator_peak_bytes >> 20} MiB, "
                    f"{done.cpu_per_run_minute() * 1000:.0f} ms CPU and "
                    f"{done.operator_requests_per_run_minute():.1f} requests per run-minute; "
                    f"collected in {done.cleanup_seconds:.0f} s",
                    flush=True,
                )
    print()
    met = report(results)
    print(
        f"\n(total {time.monotonic() - began:.0f} s, with the control plane's start; {os.cpu_count()} cores)"
    )
    return 0 if met else 1


def _main_failover(
    api: Any, plane: ControlPlane, work_dir: Path, args: argparse.Namespace, began: float
) -> int:
    results: list[FailoverResult] = []
    for runs in args.runs:
        print(f"{runs} runs, two elected operators: applying", flush=True)
        results.append(measure_failover(api, plane, work_dir, runs, args))
        done = results[-1]
        print(
            f"  done: failover {done.failover_seconds:.1f} s, lag after it p50 {done.after.lag(0.5):.2f} s, "
            f"p99 {done.after.lag(0.99):.2f} s",
            flush=True,
        )
    print()
    met = report_failover(results)
    print(
        f"\n(total {time.monotonic() - began:.0f} s, with the control plane's start; {os.cpu_count()} cores)"
    )
    return 0 if met else 1


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C, so the control plane and every run's pods are stopped, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
