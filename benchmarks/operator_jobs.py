"""Operator throughput: how fast queued rollouts become agent Jobs (or run in an agent pool), at what cost.

What it measures
    Everything Kubernetes is real and local: etcd, kube-apiserver and kube-controller-manager
    (`asyncrl.testing.ControlPlane`), the committed CRD, the `asyncrl operator` process (kopf, admin
    kubeconfig, `--metrics-port`), and the `asyncrl gateway` process, which runs as the native sidecar of the
    run's trainer pod. The pod runner (`asyncrl.testing.PodRunner`) stands in for the kubelet. Two stand-ins:
    the trainer container only keeps its pod alive (this script plays the trainer: it creates the rollouts in
    the gateway itself, `POST /api/rollouts` with the key from the run's generated Secret), and every agent
    container is `true`, so a Job ends as soon as its pod runs.

    Per scenario, one AsyncTrainingRun with `agents.maxJobsPerMinute` set to L; N rollouts posted at once
    (one group each); a label-selected watch of the run's agent Jobs timestamps each Job as it appears, and a
    watch of the run counts the events whose `.status` differs from the previous one (each is one status
    patch; kopf's own metadata patches are not counted). The operator's `asyncrl_operator_status_writes_total`
    counter is read before and after, as a cross-check. The window ends when every rollout is terminal in
    the gateway, plus --settle seconds.

    At scale (`--scale N`, issue 18 item 4): the same N rollouts twice in one invocation, once as N agent
    Jobs (limit off) and once with `agents.mode: Pool` (`--pool-replicas` long-lived pods of the pool runner,
    `asyncrl agent-pool`, each running the template's command `true` per rollout), printed side by side.
    Measured over the same window for both: rollouts/min (end to end: posted at once until the last is
    terminal), the operator process's CPU seconds (utime + stime from /proc), and the kube-apiserver's own
    `apiserver_request_total` before and after, by verb and resource. Those requests are every client's:
    the operator, kube-controller-manager (Job and ReplicaSet controllers, garbage collector), the pod
    runner (the kubelet's stand-in) and this script's two watches. The pool is ready (all pods running)
    before the clock starts; its start-up is reported apart. The documented size is N = 1000.

How to read it
    jobs/min (mean)   (Jobs - 1) / (last Job - first Job) x 60: creation throughput while Jobs were made.
    peak jobs/60s     the most Jobs created within any 60-second window: must be <= L when L binds.
    status writes     status changes seen on the run (and the operator's counter), per minute over the
                      window; `peak/60s` is the most in any 60-second window. Target: <= 60 per minute per
                      run (the operator writes at most once per second, and only when the status changed).

Run
    .venv/bin/python benchmarks/operator_jobs.py [--unlimited-rollouts 150] [--limited-rollouts 75]
        [--limit 60] [--settle 3] [--scale 1000 [--pool-replicas 4] [--skip-limits]]
    Needs the provisioned control plane (scripts/provision-k8s.sh). Default run: about 2 minutes.
    `--scale 1000 --skip-limits`: the Jobs-versus-Pool comparison alone (see docs/benchmarks.md for its time).
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import table, verdict

from asyncrl.api.crd import default_path
from asyncrl.api.types.meta import CRD_NAME, GROUP, PLURAL, VERSION
from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.testing.controlplane import ControlPlane, free_port
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.processes import ServerProcess, start_server
from asyncrl.testing.waiting import WaitTimeout, wait_for
from asyncrl.workloads import names

NAMESPACE = "bench"
GATEWAY_IMAGE = "asyncrl.bench/gateway"
IDLE_TRAINER_IMAGE = "asyncrl.bench/idle-trainer"
NOOP_AGENT_IMAGE = "asyncrl.bench/noop"
POOL_AGENT_IMAGE = "asyncrl.bench/pool"  # runs the container's own command: the pool runner, then `true`
TARGET_STATUS_WRITES_PER_MINUTE = 60
REPOSITORY = Path(__file__).resolve().parents[1]

AGENT_TEMPLATE = f"""\
apiVersion: batch/v1
kind: Job
spec:
  template:
    spec:
      containers:
      - name: agent
        image: {NOOP_AGENT_IMAGE}
"""

# agents.mode Pool runs the template's command inside the pool pod, so the trivial agent is a command here.
POOL_TEMPLATE = f"""\
apiVersion: batch/v1
kind: Job
spec:
  template:
    spec:
      containers:
      - name: agent
        image: {POOL_AGENT_IMAGE}
        command: ["true"]
"""


@dataclass
class Scenario:
    name: str
    rollouts: int
    jobs_per_minute: int
    mode: str = "Jobs"  # or "Pool"
    replicas: int = 0  # agents.pool.replicas in Pool mode


@dataclass
class Measured:
    scenario: Scenario
    job_times: list[float] = field(default_factory=list)  # monotonic, when each Job appeared
    status_times: list[float] = field(default_factory=list)  # monotonic, each observed status change
    started: float = 0.0
    finished: float = 0.0
    counter_writes: float = 0.0
    all_terminal: float = 0.0  # monotonic, when the last rollout was seen terminal
    operator_cpu: float = 0.0  # seconds over the window
    requests: dict[tuple[str, str], float] = field(default_factory=dict)  # (verb, resource): count
    pool_startup: float = float("nan")  # seconds from the run's creation to all pool pods ready
    outcomes: dict[str, int] = field(default_factory=dict)  # rollout state: count, at the end

    def rollouts_per_minute(self) -> float:
        return self.scenario.rollouts / (self.all_terminal - self.started) * 60.0

    @property
    def window_seconds(self) -> float:
        return self.finished - self.started

    def jobs_per_minute(self) -> float:
        times = sorted(self.job_times)
        if len(times) < 2 or times[-1] == times[0]:
            return float("nan")
        return (len(times) - 1) / (times[-1] - times[0]) * 60.0

    @staticmethod
    def peak_per_minute(times: list[float]) -> int:
        ordered = sorted(times)
        best, low = 0, 0
        for high, moment in enumerate(ordered):
            while ordered[low] <= moment - 60.0:
                low += 1
            best = max(best, high - low + 1)
        return best

    def status_writes_per_minute(self) -> float:
        return len(self.status_times) / self.window_seconds * 60.0


# -- the parts --------------------------------------------------------------------------------------------


def _kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [str(plane.bin_dir / "kubectl"), f"--kubeconfig={plane.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
    return done.stdout


@contextmanager
def cluster(work_dir: Path, *, controller_manager_qps: int = 0) -> Iterator[tuple[ControlPlane, Any]]:
    """The control plane, an API client, the pod runner with the benchmark's images, the CRD, a namespace.

    `controller_manager_qps`: kube-controller-manager's `--kube-api-qps` (and twice that as burst); 0 keeps
    its default (20/s, burst 30)."""
    from kubernetes import client, config

    extra = ()
    if controller_manager_qps:
        extra = (f"--kube-api-qps={controller_manager_qps}", f"--kube-api-burst={2 * controller_manager_qps}")
    with ControlPlane(work_dir=work_dir / "control-plane", controller_manager_args=extra) as plane:
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(plane.kubeconfig), client_configuration=configuration)
        api = client.ApiClient(configuration)
        images = ImageTable(
            {
                GATEWAY_IMAGE: Image(),  # the pod's own command: `asyncrl gateway ...`
                # Keeps the trainer pod (and its gateway sidecar) alive; the benchmark is the trainer.
                IDLE_TRAINER_IMAGE: Image(
                    entrypoint=(sys.executable, "-c", "import time; time.sleep(10**6)"), replace_command=True
                ),
                NOOP_AGENT_IMAGE: Image(entrypoint=("true",), replace_command=True),
                POOL_AGENT_IMAGE: Image(),  # the pool pod's command: `asyncrl agent-pool ...`
            }
        )
        path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        runner = PodRunner(
            api_client=api,
            images=images,
            work_dir=work_dir / "pods",
            base_env={"PATH": path, "LANG": "C.UTF-8", "PYTHONPATH": str(REPOSITORY / "src")},
        )
        with runner:
            _kubectl(plane, "apply", "--server-side", "-f", str(default_path()))
            _kubectl(plane, "wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
            client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
            try:
                yield plane, api
            finally:
                api.close()


def start_operator(
    plane: ControlPlane, log_dir: Path, extra_args: tuple[str, ...] = ()
) -> tuple[ServerProcess, int]:
    """`asyncrl operator` on the benchmark's namespace; `extra_args`: more flags (e.g. `--leader-elect`)."""
    health, metrics = free_port(), free_port()
    process = start_server(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "operator",
            "--namespace",
            NAMESPACE,
            "--gateway-address",
            "localhost",
            f"--kubeconfig={plane.kubeconfig}",
            f"--health-port={health}",
            f"--metrics-port={metrics}",
            "--log-level=warning",
            *extra_args,
        ],
        ready_url=f"http://127.0.0.1:{health}/healthz",
        log_path=log_dir / "operator.log",
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout_seconds=60,
    )
    return process, metrics


def status_writes_counter(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("asyncrl_operator_status_writes_total "):
                return float(line.split()[1])
    return 0.0


def operator_cpu_seconds(pid: int) -> float:
    """utime + stime of the operator process (the kopf process does its work in itself, no children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_METRIC_LABEL = re.compile(r'(\w+)="([^"]*)"')


def apiserver_requests(plane: ControlPlane) -> dict[tuple[str, str], float]:
    """The kube-apiserver's `apiserver_request_total`, summed by (verb, group/resource/subresource)."""
    counts: dict[tuple[str, str], float] = collections.defaultdict(float)
    for line in _kubectl(plane, "get", "--raw", "/metrics").splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line.rpartition("} ")
        labels = dict(_METRIC_LABEL.findall(labels_text))
        resource = "/".join(
            part for part in (labels.get("group"), labels.get("resource"), labels.get("subresource")) if part
        )
        counts[(labels.get("verb", "?"), resource or "(none)")] += float(value)
    return dict(counts)


def requests_delta(
    before: dict[tuple[str, str], float], after: dict[tuple[str, str], float]
) -> dict[tuple[str, str], float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items() if value - before.get(key, 0.0)}


def run_manifest(
    name: str, *, gateway_port: int, jobs_per_minute: int, mode: str = "Jobs", replicas: int = 0
) -> dict[str, Any]:
    agents: dict[str, Any] = {
        "template": {"inline": AGENT_TEMPLATE},
        "maxJobsPerMinute": jobs_per_minute,
        "ttlSecondsAfterFinished": 600,
    }
    if mode == "Pool":
        agents = {"mode": "Pool", "pool": {"replicas": replicas}, "template": {"inline": POOL_TEMPLATE}}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "AsyncTrainingRun",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "model": {"name": "tiny", "path": "/models/tiny"},
            "data": {"inline": [{"question": "unused: the benchmark creates the rollouts"}]},
            "trainBatchSize": 1,
            "rollout": {"samplesPerPrompt": 1},
            "trainer": {"backend": "Reference", "image": IDLE_TRAINER_IMAGE, "gpus": 0},
            "gateway": {
                "image": GATEWAY_IMAGE,
                "port": gateway_port,
                "agentURL": f"http://127.0.0.1:{gateway_port}",
            },
            "agents": agents,
            "logging": {"wandb": {"mode": "Disabled"}},
        },
    }


def _free_port_pair() -> int:
    """A gateway port whose successor (the trainer's inference port) is free too."""
    while True:
        port = free_port()
        if port < 65535:
            try:
                import socket

                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue


class Gateway:
    def __init__(self, port: int, key: str) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.key = key

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.url}{path}",
            data=data,
            method=method,
            headers={"authorization": f"Bearer {self.key}", "content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def up(self) -> bool:
        try:
            self.request("GET", "/proxy/state")
        except (urllib.error.URLError, OSError):
            return False
        return True


def gateway_key(api: Any, run: str) -> str | None:
    from kubernetes import client

    try:
        secret = client.CoreV1Api(api).read_namespaced_secret(names.gateway_key_secret_name(run), NAMESPACE)
    except client.exceptions.ApiException:
        return None
    return base64.b64decode(secret.data["key"]).decode()


class Recorder:
    """Two watches in threads: the run's agent Jobs (ADDED times) and the run (times its status changed).

    Each watch resumes from the last resourceVersion it saw, so no event falls between two watch requests.
    """

    def __init__(self, api: Any, run: str, measured: Measured) -> None:
        self.api = api
        self.run = run
        self.measured = measured
        self.stopping = threading.Event()
        self.watches: list[Any] = []
        self.threads = [
            threading.Thread(target=self._jobs, daemon=True),
            threading.Thread(target=self._status, daemon=True),
        ]

    def __enter__(self) -> Recorder:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stopping.set()
        for stream in self.watches:
            stream.stop()

    def _events(self, list_call: Any, *args: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """Raw watch events (list first, then changes) until stopped; resumes after each server timeout."""
        from kubernetes import watch

        resource_version = ""
        while not self.stopping.is_set():
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            self.watches.append(stream)
            resume = {"resource_version": resource_version} if resource_version else {}
            try:
                for event in stream.stream(list_call, *args, timeout_seconds=30, **kwargs, **resume):
                    if self.stopping.is_set():
                        return
                    raw: dict[str, Any] = event["raw_object"]
                    resource_version = raw["metadata"]["resourceVersion"]
                    yield {"type": event["type"], "object": raw}
            except Exception:  # a dropped connection; after stop, the control plane going away
                if self.stopping.is_set():
                    return
                time.sleep(0.5)

    def _jobs(self) -> None:
        from kubernetes import client

        selector = f"{names.AGENT_JOB_SELECTOR},{names.LABEL_RUN}={self.run}"
        seen: set[str] = set()
        for event in self._events(
            client.BatchV1Api(self.api).list_namespaced_job, NAMESPACE, label_selector=selector
        ):
            name = event["object"]["metadata"]["name"]
            if event["type"] == "ADDED" and name not in seen:
                seen.add(name)
                self.measured.job_times.append(time.monotonic())

    def _status(self) -> None:
        from kubernetes import client

        last: Any = None
        first = True
        for event in self._events(
            client.CustomObjectsApi(self.api).list_namespaced_custom_object,
            GROUP,
            VERSION,
            NAMESPACE,
            PLURAL,
            field_selector=f"metadata.name={self.run}",
        ):
            status = event["object"].get("status")
            if status != last and not first:
                self.measured.status_times.append(time.monotonic())
            last, first = status, False


def pool_ready(api: Any, run: str, replicas: int) -> bool:
    from kubernetes import client

    try:
        deployment = client.AppsV1Api(api).read_namespaced_deployment(names.agent_pool_name(run), NAMESPACE)
    except client.exceptions.ApiException:
        return False
    status = deployment.status
    return status is not None and (status.ready_replicas or 0) >= replicas


def measure(
    api: Any,
    plane: ControlPlane,
    scenario: Scenario,
    *,
    metrics_port: int,
    operator_pid: int,
    settle: float,
    timeout: float,
) -> Measured:
    from kubernetes import client

    port = _free_port_pair()
    manifest = run_manifest(
        scenario.name,
        gateway_port=port,
        jobs_per_minute=scenario.jobs_per_minute,
        mode=scenario.mode,
        replicas=scenario.replicas,
    )
    created = time.monotonic()
    _kubectl(plane, "apply", "-f", "-", stdin=json.dumps(manifest))
    key = wait_for(lambda: gateway_key(api, scenario.name), timeout=60, what="the run's gateway key Secret")
    gateway = Gateway(port, key)
    wait_for(gateway.up, timeout=90, what="the run's gateway (trainer pod sidecar)")
    measured = Measured(scenario)
    if scenario.mode == "Pool":
        wait_for(
            lambda: pool_ready(api, scenario.name, scenario.replicas),
            timeout=180,
            what=f"{scenario.replicas} pool pods ready",
            interval=0.2,
        )
        measured.pool_startup = time.monotonic() - created
    time.sleep(2.0)  # let the run's first status writes (Pending -> Running) pass before measuring
    with Recorder(api, scenario.name, measured):
        time.sleep(1.0)  # both watches are established
        before = status_writes_counter(metrics_port)
        requests_before = apiserver_requests(plane)
        cpu_before = operator_cpu_seconds(operator_pid)
        rollouts = [
            {"rollout_id": f"r{index}", "group_id": f"g{index}", "step": 0, "input": {"index": index}}
            for index in range(scenario.rollouts)
        ]
        measured.started = time.monotonic()
        gateway.request("POST", "/api/rollouts", rollouts)
        jobs_expected = scenario.rollouts if scenario.mode == "Jobs" else 0

        def all_terminal() -> bool:
            counts = gateway.request("GET", "/api/stats")["rollouts"]
            return sum(counts.get(state, 0) for state in ("queued", "running")) == 0 and bool(
                len(measured.job_times) >= jobs_expected
            )

        wait_for(all_terminal, timeout=timeout, what=f"{scenario.rollouts} rollouts to finish", interval=0.5)
        measured.all_terminal = time.monotonic()
        measured.outcomes = {
            state: count for state, count in gateway.request("GET", "/api/stats")["rollouts"].items() if count
        }
        time.sleep(settle)
        measured.finished = time.monotonic()
        measured.counter_writes = status_writes_counter(metrics_port) - before
        measured.operator_cpu = operator_cpu_seconds(operator_pid) - cpu_before
        measured.requests = requests_delta(requests_before, apiserver_requests(plane))
    client.CustomObjectsApi(api).delete_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, PLURAL, scenario.name
    )
    return measured


def wait_cleared(api: Any, run: str, timeout: float) -> float:
    """Seconds until the deleted run's agent Jobs and pods are gone (garbage collected), so the next
    scenario is not measured while the collector deletes hundreds of objects; at most `timeout`."""
    from kubernetes import client

    began = time.monotonic()

    def gone() -> bool:
        selector = f"{names.LABEL_RUN}={run}"
        jobs = client.BatchV1Api(api).list_namespaced_job(NAMESPACE, label_selector=selector, limit=1)
        pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=selector, limit=1)
        return not jobs.items and not pods.items

    with contextlib.suppress(WaitTimeout):
        wait_for(gone, timeout=timeout, what=f"run {run}'s Jobs and pods to be collected", interval=1.0)
    return time.monotonic() - began


def report(results: list[Measured]) -> None:
    rows = []
    for result in results:
        scenario = result.scenario
        minutes = result.window_seconds / 60.0
        rows.append(
            [
                scenario.name,
                scenario.jobs_per_minute,
                len(result.job_times),
                f"{(max(result.job_times) - result.started):.1f}" if result.job_times else "n/a",
                f"{result.jobs_per_minute():.0f}",
                Measured.peak_per_minute(result.job_times),
                f"{result.window_seconds:.1f}",
                len(result.status_times),
                f"{result.counter_writes:.0f}",
                f"{len(result.status_times) / minutes:.1f}",
                Measured.peak_per_minute(result.status_times),
            ]
        )
    headers = [
        "scenario",
        "limit/min",
        "jobs",
        "last job s",
        "jobs/min (mean)",
        "peak jobs/60s",
        "window s",
        "status writes",
        "(counter)",
        "writes/min",
        "peak writes/60s",
    ]
    print(table(headers, rows))
    print()
    for result in results:
        limit = result.scenario.jobs_per_minute
        if result.scenario.rollouts > limit:
            peak = Measured.peak_per_minute(result.job_times)
            print(verdict(f"{result.scenario.name}: <= {limit} Jobs in any 60 s", peak <= limit, f"{peak}"))
        peak_writes = Measured.peak_per_minute(result.status_times)
        print(
            verdict(
                f"{result.scenario.name}: <= {TARGET_STATUS_WRITES_PER_MINUTE} status writes/min per run",
                peak_writes <= TARGET_STATUS_WRITES_PER_MINUTE
                and result.status_writes_per_minute() <= TARGET_STATUS_WRITES_PER_MINUTE,
                f"{result.status_writes_per_minute():.1f}/min mean, {peak_writes} peak in 60 s",
            )
        )


def report_scale(results: list[Measured]) -> None:
    """Jobs and Pool with the same rollouts, side by side (issue 18 item 4)."""
    if not results:
        return
    print("\nJobs versus Pool, the same rollouts:")
    headers = ["", *(f"{r.scenario.name} ({r.scenario.mode})" for r in results)]

    def row(label: str, value: Any) -> list[str]:
        return [label, *(value(r) for r in results)]

    def per_rollout(r: Measured) -> float:
        return sum(r.requests.values()) / r.scenario.rollouts

    rows = [
        row("rollouts", lambda r: str(r.scenario.rollouts)),
        row("pool pods", lambda r: str(r.scenario.replicas) if r.scenario.mode == "Pool" else "-"),
        row(
            "pool start-up s (apart)", lambda r: f"{r.pool_startup:.1f}" if r.scenario.mode == "Pool" else "-"
        ),
        row("all terminal after s", lambda r: f"{r.all_terminal - r.started:.1f}"),
        row("rollouts/min (end to end)", lambda r: f"{r.rollouts_per_minute():.0f}"),
        row("agent Jobs created", lambda r: str(len(r.job_times))),
        row("Jobs/min (creation, mean)", lambda r: f"{r.jobs_per_minute():.0f}" if r.job_times else "-"),
        row("operator CPU s", lambda r: f"{r.operator_cpu:.1f}"),
        row("operator CPU ms/rollout", lambda r: f"{r.operator_cpu / r.scenario.rollouts * 1000:.1f}"),
        row("API requests (all clients)", lambda r: f"{sum(r.requests.values()):.0f}"),
        row("API requests/rollout", lambda r: f"{per_rollout(r):.1f}"),
        row("status writes (counter)", lambda r: f"{len(r.status_times)} ({r.counter_writes:.0f})"),
        row("outcomes", lambda r: " ".join(f"{k}={v}" for k, v in sorted(r.outcomes.items()))),
    ]
    print(table(headers, rows))
    for result in results:
        print(f"\n{result.scenario.name}: API requests by verb and resource (per rollout), largest first")
        ordered = sorted(result.requests.items(), key=lambda item: -item[1])
        print(
            table(
                ["verb", "resource", "requests", "per rollout"],
                [
                    [verb, resource, f"{count:.0f}", f"{count / result.scenario.rollouts:.2f}"]
                    for (verb, resource), count in ordered[:14]
                ],
            )
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--unlimited-rollouts", type=int, default=150, help="rollouts with the limit off")
    parser.add_argument("--limited-rollouts", type=int, default=75, help="rollouts with the limit on")
    parser.add_argument("--limit", type=int, default=60, help="maxJobsPerMinute of the limited scenario")
    parser.add_argument("--off", type=int, default=100000, help="maxJobsPerMinute meaning 'no limit'")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds measured after the last rollout")
    parser.add_argument(
        "--scale", type=int, default=0, help="also N rollouts as N Jobs and in a Pool (documented: 1000)"
    )
    parser.add_argument("--pool-replicas", type=int, default=4, help="agents.pool.replicas at --scale")
    parser.add_argument("--skip-limits", action="store_true", help="only the --scale comparison")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per scenario")
    parser.add_argument(
        "--controller-manager-qps",
        type=int,
        default=0,
        help="kube-controller-manager's --kube-api-qps (0: its default, 20/s): the Job controller's pace",
    )
    args = parser.parse_args()
    scale = []
    if args.scale:
        # Pool first: the Jobs scenario leaves N Jobs and pods for the garbage collector.
        scale = [
            Scenario(f"pool-{args.scale}", args.scale, args.off, mode="Pool", replicas=args.pool_replicas),
            Scenario(f"jobs-{args.scale}", args.scale, args.off),
        ]
    limits = (
        []
        if args.skip_limits
        else [
            Scenario("limit-off", args.unlimited_rollouts, args.off),
            Scenario("limit-on", args.limited_rollouts, args.limit),
        ]
    )
    scenarios = [*scale, *limits]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-operator-") as tmp:
        work_dir = Path(tmp)
        with cluster(work_dir, controller_manager_qps=args.controller_manager_qps) as (plane, api):
            operator, metrics_port = start_operator(plane, work_dir)
            try:
                results = []
                for index, scenario in enumerate(scenarios):
                    limit = scenario.jobs_per_minute
                    print(
                        f"{scenario.name}: {scenario.rollouts} rollouts, mode {scenario.mode}, "
                        f"maxJobsPerMinute {limit}",
                        flush=True,
                    )
                    results.append(
                        measure(
                            api,
                            plane,
                            scenario,
                            metrics_port=metrics_port,
                            operator_pid=operator.process.pid,
                            settle=args.settle,
                            timeout=args.timeout,
                        )
                    )
                    print(f"  done in {results[-1].window_seconds:.1f} s", flush=True)
                    if index + 1 < len(scenarios):
                        cleared = wait_cleared(api, scenario.name, timeout=600)
                        print(f"  its objects collected in {cleared:.1f} s", flush=True)
            except BaseException:
                print(operator.log()[-4000:], file=sys.stderr)
                raise
            finally:
                operator.stop()
    print()
    report(results)
    report_scale(results[: len(scale)])
    print(f"\n(total {time.monotonic() - began:.0f} s, including the control plane's start)")


if __name__ == "__main__":
    main()
