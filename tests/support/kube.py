"""What the control-plane tests ask of a cluster, in one copy: start the control plane and the operator, build
a run's manifest and its agents, apply it, read its status, Jobs and Events, and wait for a phase.

One copy so that every test starts, reads and waits on the cluster the same way; the fixtures (conftest.py)
call these, and a test with a control plane of its own (KubeRay's) calls the same functions.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest

from asyncrl.api.types.meta import GROUP, PLURAL, VERSION
from asyncrl.launch.processes import free_port
from asyncrl.testing.controlplane import ControlPlane, ControlPlaneError, default_bin_dir, missing_binaries
from asyncrl.testing.processes import ServerProcess, start_server
from asyncrl.testing.waiting import WaitTimeout, wait_for
from asyncrl.workloads import names

REPO = Path(__file__).resolve().parents[2]

GATEWAY_IMAGE = "asyncrl.test/gateway"
TRAINER_IMAGE = "asyncrl.test/stub-trainer"
AGENT_IMAGE = "asyncrl.test/python"


def agent_template(*, command: Sequence[str], env: Mapping[str, str]) -> str:
    """An agent Job template: one container on the test Python image running `command` (an argument with
    lines becomes a YAML block), with `env` (values as written, Jinja included)."""
    lines = [
        "apiVersion: batch/v1",
        "kind: Job",
        "spec:",
        "  template:",
        "    spec:",
        "      containers:",
        "      - name: agent",
        f"        image: {AGENT_IMAGE}",
        "        command:",
    ]
    for argument in command:
        if "\n" in argument:
            lines += ["        - |", *(f"          {line}" for line in argument.strip("\n").splitlines())]
        else:
            lines.append(f"        - {argument}")
    lines.append("        env:")
    for name, value in env.items():
        lines += [f"        - name: {name}", f"          value: {value}"]
    return "\n".join(lines) + "\n"


# An agent that asks the model its row's question and rewards any answer.
AGENT_TEMPLATE = agent_template(
    command=[
        "python",
        "-c",
        """
import os
from asyncrl.agent import chat, report_reward
answer = chat([{"role": "user", "content": os.environ["QUESTION"]}])
report_reward(1.0 if answer["choices"][0]["message"]["content"] else 0.0)
""",
    ],
    env={"QUESTION": "{{ question }}"},
)


def run_manifest(name: str, *, template: str = AGENT_TEMPLATE, **spec: Any) -> dict[str, Any]:
    """A small run on the test images (two rows, two steps, the stand-in trainer); `spec` replaces fields."""
    port = free_port()
    body: dict[str, Any] = {
        "apiVersion": "asyncrl.dev/v1alpha1",
        "kind": "AsyncTrainingRun",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "tiny", "path": "/models/tiny"},
            "data": {"inline": [{"question": "what is 2+2?"}, {"question": "and 3+3?"}]},
            "trainBatchSize": 1,
            "rollout": {"samplesPerPrompt": 2},
            "async": {"enabled": True, "windowSize": 2},
            "totalSteps": 2,
            "trainer": {"backend": "Reference", "image": TRAINER_IMAGE, "gpus": 0},
            "gateway": {"image": GATEWAY_IMAGE, "port": port, "agentURL": f"http://127.0.0.1:{port}"},
            "agents": {"template": {"inline": template}, "ttlSecondsAfterFinished": 600},
            "logging": {"wandb": {"mode": "Disabled"}},
        },
    }
    body["spec"].update(spec)
    return body


# Counted executions: the fault tests count what ran rather than trust what the gateway or the Job names say.


def multi_node_manifest(name: str, *, claim: str = "shared", **trainer: Any) -> dict[str, Any]:
    """A two-node Verl run (one GPU per node) checkpointing to `claim`; `trainer` adds or replaces fields."""
    manifest = run_manifest(name)
    manifest["spec"]["trainer"].update(
        backend="Verl", nodes=2, gpusPerNode=1, checkpoint={"claimName": claim}, **trainer
    )
    return manifest


def create_claim(api_client: Any, namespace: str, name: str, mode: str = "ReadWriteMany") -> None:
    """A 1 GiB PersistentVolumeClaim with one access mode (a multi-node run's checkpoints need RWX)."""
    from kubernetes import client

    client.CoreV1Api(api_client).create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )


def counting_agent_template(executions: Path) -> str:
    """An agent that appends its execution (rollout URL, own pid, parent pid) to `executions`, then behaves
    as its row says: `behaviour` ok (a model call, `seconds` of work, a reward), fail (exit 3) or hang."""
    return agent_template(
        command=["python", "-c", _COUNTING_AGENT],
        env={
            "EXECUTIONS": f'"{executions}"',
            "BEHAVIOUR": '"{{ behaviour }}"',
            "SECONDS": '"{{ seconds | default(0) }}"',
        },
    )


_COUNTING_AGENT = """
import os, sys, time
with open(os.environ["EXECUTIONS"], "a") as log:
    log.write(f"{os.environ['AGL_EVENT_URL']} {os.getpid()} {os.getppid()}\\n")
if os.environ["BEHAVIOUR"] == "fail":
    sys.exit(3)
if os.environ["BEHAVIOUR"] == "hang":
    time.sleep(600)
from asyncrl.agent import chat, report_reward
chat([{"role": "user", "content": "hi"}])
time.sleep(float(os.environ["SECONDS"]))
report_reward(1.0)
"""


def execution_lines(path: Path) -> list[tuple[str, int, int]]:
    """(rollout id, agent pid, parent pid) per execution the counting agent recorded, in order."""
    if not path.exists():
        return []
    found = []
    for line in path.read_text().splitlines():
        match = re.search(r"/api/rollouts/([^/]+)/attempt/\S+ (\d+) (\d+)$", line)
        assert match is not None, line
        found.append((match[1], int(match[2]), int(match[3])))
    return found


def executions_per_rollout(path: Path) -> collections.Counter[str]:
    """Executions per rollout id (the id is part of the event URL each agent was given)."""
    return collections.Counter(rollout for rollout, _, _ in execution_lines(path))


# The control plane and the operator: the bodies of the session's fixtures, and of a test's own plane.


@contextmanager
def running_control_plane(work_dir: Path) -> Iterator[ControlPlane]:
    """The provisioned control plane started in `work_dir`, stopped on exit; a test failure saying what to
    provision when it cannot start."""
    bin_dir = default_bin_dir()
    missing = missing_binaries(bin_dir)
    if missing:
        pytest.fail(
            f"the local control plane is not provisioned ({', '.join(missing)} missing in {bin_dir}); "
            "run scripts/provision-k8s.sh first",
            pytrace=False,
        )
    plane = ControlPlane(bin_dir=bin_dir, work_dir=work_dir)
    try:
        plane.start()
    except ControlPlaneError as error:
        pytest.fail(str(error), pytrace=False)
    try:
        yield plane
    finally:
        plane.stop()


@contextmanager
def api_client_for(plane: ControlPlane) -> Iterator[Any]:
    """A kubernetes ApiClient with the plane's admin identity."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(plane.kubeconfig), client_configuration=configuration
    )
    with client.ApiClient(configuration) as api:
        yield api


def kubectl_for(plane: ControlPlane) -> list[str]:
    """argv prefix for the provisioned kubectl pointed at the plane."""
    return [str(Path(plane.bin_dir) / "kubectl"), f"--kubeconfig={plane.kubeconfig}"]


@contextmanager
def fresh_namespace(api_client: Any, *, prefix: str) -> Iterator[str]:
    """A new namespace `<prefix>-<8 hex>`, deleted on exit (the namespace controller empties it)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    name = f"{prefix}-{os.urandom(4).hex()}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)


def pod_base_env() -> dict[str, str]:
    """The environment the pod runner gives every container: this venv's `python` and `asyncrl` first on
    PATH, as the images would have them, and this checkout's code first on PYTHONPATH (also when the venv
    holds an install of another checkout)."""
    path = f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {"PATH": path, "LANG": "C.UTF-8", "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}


def start_operator_process(
    *,
    kubeconfig: Path,
    scope: Sequence[str],
    log_path: Path,
    extra_args: Sequence[str] = (),
    health_port: int | None = None,
) -> ServerProcess:
    """`asyncrl operator <scope>` (`--namespace <name>` or `--all-namespaces`) as a real process with the
    identity of `kubeconfig`, returned once its liveness endpoint answers (on `health_port` when given)."""
    health = health_port or free_port()
    return start_server(
        [
            sys.executable,
            "-m",
            "asyncrl.cli",
            "operator",
            *scope,
            "--gateway-address",
            "localhost",
            f"--kubeconfig={kubeconfig}",
            f"--health-port={health}",
            *extra_args,
        ],
        ready_url=f"http://127.0.0.1:{health}/healthz",
        log_path=log_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        timeout_seconds=60,
    )


# Reading and changing the cluster.


def kubectl_run(kubectl: list[str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """kubectl with `args`, its output captured; a call that hangs past 120 s fails the test there."""
    return subprocess.run(
        [*kubectl, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def wait_established(kubectl: list[str], crd: str, *, timeout: float = 120) -> None:
    """Wait until the CRD is Established. `kubectl wait` fails at once (not waits) while a just-created CRD
    has no conditions yet, which a busy API server shows for a moment: it is asked again until it passes."""
    last: list[str] = []

    def established() -> bool:
        done = kubectl_run(kubectl, "wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
        last[:] = [done.stderr.strip()]
        return done.returncode == 0

    try:
        wait_for(established, timeout=timeout, what=f"CRD {crd} Established", interval=1.0)
    except WaitTimeout as error:
        raise WaitTimeout(f"{error}; kubectl wait said: {last}") from error


def apply_run(
    kubectl: list[str], namespace: str, manifest: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    """`kubectl apply` of a manifest, sent as JSON as a user's YAML would arrive (JSON, not PyYAML's YAML:
    it writes the key `n` bare, which kubectl, reading YAML 1.1, would take for false)."""
    return kubectl_run(kubectl, "apply", "-n", namespace, "-f", "-", stdin=json.dumps(manifest))


def apply_ok(kubectl: list[str], namespace: str, manifest: dict[str, Any]) -> None:
    """`apply_run` that the API server must admit; its refusal fails the test with kubectl's words."""
    applied = apply_run(kubectl, namespace, manifest)
    assert applied.returncode == 0, applied.stderr


def delete_run(
    kubectl: list[str], namespace: str, name: str, *, timeout: str = "60s"
) -> subprocess.CompletedProcess[str]:
    """`kubectl delete atr <name> --wait`: returns once the run is gone (its children go after it, by GC)."""
    return kubectl_run(kubectl, "delete", "atr", name, "-n", namespace, "--wait=true", f"--timeout={timeout}")


def run_object(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    found = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return cast(dict[str, Any], found)


def find_run(api_client: Any, namespace: str, name: str) -> dict[str, Any] | None:
    """The run, or None when there is none (never created, or deleted)."""
    from kubernetes import client

    try:
        return run_object(api_client, namespace, name)
    except client.exceptions.ApiException as error:
        if error.status == 404:
            return None
        raise


def run_status(api_client: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(run_object(api_client, namespace, name).get("status") or {})


def status_condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


def agent_jobs(api_client: Any, namespace: str, run: str | None = None) -> list[Any]:
    from kubernetes import client

    selector = names.AGENT_JOB_SELECTOR + (f",{names.LABEL_RUN}={run}" if run else "")
    return list(client.BatchV1Api(api_client).list_namespaced_job(namespace, label_selector=selector).items)


def trainer_job(api_client: Any, namespace: str, run: str) -> Any:
    """The run's trainer Job, or None while it does not exist."""
    from kubernetes import client

    try:
        return client.BatchV1Api(api_client).read_namespaced_job(names.trainer_job_name(run), namespace)
    except client.exceptions.ApiException:
        return None


def events(kubectl: list[str], namespace: str, *, reason: str | None = None) -> list[dict[str, Any]]:
    listing = kubectl_run(kubectl, "get", "events.events.k8s.io", "-n", namespace, "-o", "json")
    assert listing.returncode == 0, listing.stderr
    items: list[dict[str, Any]] = json.loads(listing.stdout)["items"]
    return [item for item in items if reason is None or item.get("reason") == reason]


# Waits, on wait_for: each names what it waited for when it times out.


def wait_for_phase(
    api_client: Any, namespace: str, name: str, *phases: str, timeout: float, what: str, interval: float = 0.2
) -> dict[str, Any]:
    """The run's status once its phase is one of `phases`."""

    def in_phase() -> dict[str, Any] | None:
        status = run_status(api_client, namespace, name)
        return status if status.get("phase") in phases else None

    return wait_for(in_phase, timeout=timeout, what=what, interval=interval)


def explain_run(
    api_client: Any,
    kubectl: list[str],
    namespace: str,
    run: str,
    *,
    logs: Sequence[Path] = (),
    lines: int = 30,
) -> str:
    """What a test that waited on `run` in vain prints: its status, the namespace's events, its Jobs and pods,
    and the tails of `logs` (the operator's, and every container log under a pod runner's pod folders)."""
    parts = [f"status: {json.dumps(run_status(api_client, namespace, run), indent=1, default=str)}"]
    listing = kubectl_run(kubectl, "get", "jobs,pods", "-n", namespace, "-o", "wide")
    parts.append(f"jobs and pods:\n{listing.stdout}{listing.stderr}")
    for event in events(kubectl, namespace)[-40:]:
        parts.append(f"event {event.get('type')} {event.get('reason')}: {event.get('note')}")
    for path in logs:
        text = path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else ["(no file)"]
        parts.append(f"--- {path} (last {lines} lines)\n" + "\n".join(text))
    return "\n".join(parts)


def pod_logs(pods_dir: Path, namespace: str) -> list[Path]:
    """Every container log the pod runner wrote for `namespace` (`PodRunner.pod_dir` layout)."""
    return sorted(pods_dir.glob(f"pods/{namespace}_*/*.log"))


def wait_for_trainer_job(api_client: Any, namespace: str, run: str, *, timeout: float, what: str) -> Any:
    """The run's trainer Job once it exists."""
    return wait_for(lambda: trainer_job(api_client, namespace, run), timeout=timeout, what=what)


def wait_for_no_jobs_or_pods(api_client: Any, namespace: str, *, timeout: float, what: str) -> None:
    """Until the namespace holds no Job and no pod (the garbage collector has removed a run's children)."""
    from kubernetes import client

    batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)

    def nothing_left() -> bool:
        return (
            not batch.list_namespaced_job(namespace).items and not core.list_namespaced_pod(namespace).items
        )

    wait_for(nothing_left, timeout=timeout, what=what)


def wait_for_trainer_stopped(api_client: Any, namespace: str, run: str, *, timeout: float, what: str) -> None:
    """Until the run's trainer Job is suspended and none of its pods is left (a run that ended stops its
    trainer and frees the GPUs)."""
    from kubernetes import client

    def stopped() -> bool:
        job = trainer_job(api_client, namespace, run)
        pods = client.CoreV1Api(api_client).list_namespaced_pod(
            namespace, label_selector=f"job-name={names.trainer_job_name(run)}"
        )
        return bool(job and job.spec.suspend and not pods.items)

    wait_for(stopped, timeout=timeout, what=what)
