"""`asyncrl runs summary|logs|port-forward`, run as a user runs them, against the real kube-apiserver.

The summary reads a real AsyncTrainingRun whose status the test writes through the status subresource (as
the operator would) and a real Event about it. What this control plane cannot show: logs and port-forwards
are served by a node's kubelet through the API server, and it has none (the test pod runner runs containers
as local processes and serves neither), and the API server's Service proxy refuses loopback endpoints, so
the trainer's metrics are never reachable here. What is tested of those is what a user meets before a
kubelet is involved: a pod not on a node yet (held by a scheduling gate, as a queue holds it), a pod whose
node's kubelet cannot be reached (the API server's own error, passed on), a run without a trainer pod, a
missing run, and the argument checks.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from asyncrl.api.types.meta import GROUP, PLURAL, VERSION
from asyncrl.cluster_cli import PortForwarder
from asyncrl.testing.controlplane import ControlPlane
from asyncrl.workloads import names
from tests.api.conftest import installed_crd  # noqa: F401  (a fixture used by these tests)
from tests.gateway.conftest import launch_upstream
from tests.support.kube import apply_ok, run_manifest


def _cluster(test: Any) -> Any:
    """A test against the control plane, with the CRD installed (slow: each command is a new process)."""
    return pytest.mark.controlplane(pytest.mark.slow(pytest.mark.usefixtures("installed_crd")(test)))


def asyncrl_runs(
    control_plane: ControlPlane, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "runs", *args, f"--kubeconfig={control_plane.kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _write_status(api_client: Any, namespace: str, name: str, status: dict[str, Any]) -> None:
    from kubernetes import client

    client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, name, {"status": status}
    )


def _event(api_client: Any, namespace: str, run: dict[str, Any], *, reason: str, message: str) -> None:
    from kubernetes import client

    now = datetime.now(UTC)
    core: Any = client.CoreV1Api(api_client)  # bodies as plain dicts
    core.create_namespaced_event(
        namespace,
        {
            "metadata": {"generateName": f"{run['metadata']['name']}."},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "AsyncTrainingRun",
                "name": run["metadata"]["name"],
                "namespace": namespace,
                "uid": run["metadata"]["uid"],
            },
            "type": "Normal",
            "reason": reason,
            "message": message,
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
            "source": {"component": "asyncrl-operator"},
        },
    )


def _created_run(api_client: Any, kubectl: list[str], namespace: str, name: str) -> dict[str, Any]:
    from kubernetes import client

    apply_ok(kubectl, namespace, run_manifest(name, totalSteps=10))
    return cast(
        dict[str, Any],
        client.CustomObjectsApi(api_client).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        ),
    )


def _trainer_pod(api_client: Any, namespace: str, run_name: str, **spec: Any) -> str:
    """A pod shaped as the run's trainer pod (its labels, the trainer container, the gateway sidecar)."""
    from kubernetes import client

    name = f"{run_name}-trainer-abcde"
    core: Any = client.CoreV1Api(api_client)  # bodies as plain dicts
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "labels": names.common_labels(run_name, names.COMPONENT_TRAINER)},
            "spec": {
                "initContainers": [
                    {
                        "name": "gateway",
                        "image": "asyncrl.test/shell",
                        "restartPolicy": "Always",
                        "ports": [{"name": "gateway", "containerPort": 8090}],
                    }
                ],
                "containers": [{"name": "trainer", "image": "asyncrl.test/shell"}],
                **spec,
            },
        },
    )
    return name


@_cluster
def test_summary_shows_phase_step_last_step_conditions_events_and_why_trainer_metrics_are_missing(
    control_plane: ControlPlane, api_client: Any, kubectl: list[str], namespace: str
) -> None:
    run = _created_run(api_client, kubectl, namespace, "demo")
    started = (datetime.now(UTC) - timedelta(minutes=30)).replace(microsecond=0)
    stepped = (datetime.now(UTC) - timedelta(minutes=5)).replace(microsecond=0)
    _write_status(
        api_client,
        namespace,
        "demo",
        {
            "phase": "Running",
            "message": "training",
            "step": 3,
            "startTime": started.isoformat().replace("+00:00", "Z"),
            "lastStepTime": stepped.isoformat().replace("+00:00", "Z"),
            "completedRollouts": 4,
            "carryOverAgeMaxSteps": 1,
            "proxyDrainSeconds": 0.25,
            "rollouts": {
                "queued": 1,
                "running": 2,
                "succeeded": 4,
                "failed": 1,
                "timedOut": 0,
                "cancelled": 0,
            },
            "conditions": [
                {
                    "type": "TrainerReady",
                    "status": "True",
                    "reason": "Running",
                    "message": "the trainer is up",
                    "lastTransitionTime": started.isoformat().replace("+00:00", "Z"),
                }
            ],
        },
    )
    _event(api_client, namespace, run, reason="StepFinished", message="step 3 trained on 4 rollouts")

    done = asyncrl_runs(control_plane, "summary", "demo", "-n", namespace)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"run:            {namespace}/demo" in lines
    assert "phase:          Running" in lines
    assert (
        "steps:          4/10 done; the last was step 3 (status.step, counted from 0 as in the trainer's log)"
        in lines
    )
    assert any(line.startswith("last step at:") and "(5m ago)" in line for line in lines), lines
    assert "  completedRollouts: 4" in lines
    assert "  carryOverAgeMaxSteps: 1" in lines
    assert "  proxyDrainSeconds: 0.25" in lines
    assert any(
        line.startswith("rollouts:") and "succeeded=4" in line and "failed=1" in line for line in lines
    )
    assert "  TrainerReady=True (Running): the trainer is up" in lines
    assert any("Normal StepFinished: step 3 trained on 4 rollouts" in line for line in lines), lines
    # No gateway Service here (no operator ran): the summary says why, and still succeeds.
    (metrics_line,) = [line for line in lines if line.startswith("trainer metrics")]
    assert f"not reachable: service {names.gateway_service_name('demo')} does not exist" in metrics_line

    as_json = asyncrl_runs(
        control_plane, "summary", "demo", "-n", namespace, "-o", "json", "--no-trainer-metrics"
    )
    assert as_json.returncode == 0, as_json.stderr
    document = json.loads(as_json.stdout)
    assert document["status"]["step"] == 3
    assert document["spec"]["totalSteps"] == 10
    assert document["trainerMetrics"] is None
    assert [event["reason"] for event in document["events"]] == ["StepFinished"]


@_cluster
def test_a_gateway_service_without_a_ready_endpoint_is_named_as_such_not_as_not_found(
    control_plane: ControlPlane, api_client: Any, kubectl: list[str], namespace: str
) -> None:
    """Issue 37 item 10: `runs summary` and `runs plot` said `404: services "quickstart-gateway" not found`
    while the Service existed; it had no ready endpoint (the trainer pod was not ready)."""
    from kubernetes import client

    _created_run(api_client, kubectl, namespace, "waiting")
    service = names.gateway_service_name("waiting")
    core: Any = client.CoreV1Api(api_client)
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": service},
            "spec": {
                "selector": names.common_labels("waiting", names.COMPONENT_TRAINER),
                "ports": [{"name": "metrics", "port": 9090}],
            },
        },
    )
    done = asyncrl_runs(control_plane, "summary", "waiting", "-n", namespace)
    assert done.returncode == 0, done.stderr
    (metrics_line,) = [line for line in done.stdout.splitlines() if line.startswith("trainer metrics")]
    assert f"service {service} exists but has no ready endpoint" in metrics_line, metrics_line
    assert "not found" not in metrics_line
    plot = asyncrl_runs(control_plane, "plot", "waiting", "-n", namespace)
    assert plot.returncode == 1
    assert f"service {service} exists but has no ready endpoint" in plot.stderr, plot.stderr


@_cluster
def test_a_run_without_status_is_summarised_as_such(
    control_plane: ControlPlane, api_client: Any, kubectl: list[str], namespace: str
) -> None:
    _created_run(api_client, kubectl, namespace, "fresh")
    done = asyncrl_runs(control_plane, "summary", "fresh", "-n", namespace, "--no-trainer-metrics")
    assert done.returncode == 0, done.stderr
    assert "phase:          (none yet: the operator has not written a status)" in done.stdout
    assert "steps:          none done yet of spec.totalSteps 10" in done.stdout
    # No operator is installed on this control plane (the tests start theirs as processes): said so.
    assert "operator:       no asyncrl operator Deployment found" in done.stdout, done.stdout


@_cluster
def test_a_missing_run_is_named_with_its_namespace(control_plane: ControlPlane, namespace: str) -> None:
    for command in ("summary", "logs", "port-forward"):
        done = asyncrl_runs(control_plane, command, "nope", "-n", namespace)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert f"no AsyncTrainingRun 'nope' in namespace '{namespace}'" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr


@_cluster
def test_a_run_without_a_trainer_pod_says_so(
    control_plane: ControlPlane, api_client: Any, kubectl: list[str], namespace: str
) -> None:
    _created_run(api_client, kubectl, namespace, "queued")
    for command in ("logs", "port-forward"):
        done = asyncrl_runs(control_plane, command, "queued", "-n", namespace)
        assert done.returncode == 1
        assert f"run {namespace}/queued has no trainer pod yet" in done.stderr


@_cluster
def test_logs_and_port_forward_of_a_pod_not_on_a_node_say_what_to_look_at(
    control_plane: ControlPlane, api_client: Any, kubectl: list[str], namespace: str
) -> None:
    """A scheduling gate keeps the pod off every node (as a queue does), whatever binds pods here."""
    _created_run(api_client, kubectl, namespace, "gated")
    pod = _trainer_pod(api_client, namespace, "gated", schedulingGates=[{"name": "asyncrl.test/held"}])
    for command, what in (("logs", "no logs"), ("port-forward", "no port to forward")):
        done = asyncrl_runs(control_plane, command, "gated", "-n", namespace)
        assert done.returncode == 1, done.stdout
        assert f"pod {namespace}/{pod} is not on a node yet (phase Pending), so it has {what}" in done.stderr
        assert f"kubectl describe pod {pod} -n {namespace}" in done.stderr
        assert "Traceback" not in done.stderr


@_cluster
def test_a_node_whose_kubelet_cannot_be_reached_gives_the_api_servers_reason(
    control_plane: ControlPlane, api_client: Any, kubectl: list[str], namespace: str
) -> None:
    _created_run(api_client, kubectl, namespace, "stranded")
    pod = _trainer_pod(api_client, namespace, "stranded", nodeName="asyncrl-test-node-without-kubelet")
    logs = asyncrl_runs(control_plane, "logs", "stranded", "-n", namespace, "--component", "gateway")
    assert logs.returncode == 1, logs.stdout
    assert f"the gateway log of pod {namespace}/{pod} (container gateway) could not be read: " in logs.stderr
    assert "asyncrl-test-node-without-kubelet" in logs.stderr  # the API server's reason names the node
    forward = asyncrl_runs(control_plane, "port-forward", "stranded", "-n", namespace, "--local-port", "0")
    assert forward.returncode == 1, forward.stdout
    assert (
        f"port-forward to pod {namespace}/{pod} port 8090 failed: 404 Not Found: "
        'pods "asyncrl-test-node-without-kubelet" not found'
    ) in forward.stderr
    assert "Traceback" not in logs.stderr + forward.stderr


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["logs", "demo", "--component", "agent"], "invalid choice: 'agent'"),
        (["logs", "demo", "--tail", "-3"], "give 0 or more lines"),
        (["port-forward", "demo", "--local-port", "70000"], "70000 is not a port (0-65535"),
        (["port-forward", "demo", "--local-port", "http"], "'http' is not a port number"),
        (["summary", "demo", "-o", "yaml"], "invalid choice: 'yaml'"),
        (["summary"], "the following arguments are required: NAME"),
    ],
)
def test_bad_arguments_are_refused_before_the_cluster_is_asked(args: list[str], complaint: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "runs", *args, "--kubeconfig=/nonexistent"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert complaint in done.stderr


class _LoopbackStream:
    """The one stand-in here: what `kubernetes.stream.portforward` returns, with its socket connected straight
    to a local server instead of through an API server and a kubelet (neither can forward here)."""

    def __init__(self, port: int) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port))

    def socket(self, port: int) -> socket.socket:
        del port
        return self._socket

    def error(self, port: int) -> None:
        del port

    def close(self) -> None:
        self._socket.close()


def test_each_local_connection_is_pumped_both_ways_to_the_pod(tmp_path: Path) -> None:
    """PortForwarder.serve with real sockets and a real HTTP server (the fake OpenAI upstream process) on the
    far side: several requests, one connection each, answered in full."""
    url, server = launch_upstream(tmp_path)
    port = int(url.rsplit(":", 1)[1])

    class Loopback(PortForwarder):
        def _open(self) -> Any:
            return _LoopbackStream(self.remote_port)

    forwarder = Loopback(cast(Any, None), pod_name="demo-trainer-abcde", remote_port=port)
    try:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            local = listener.getsockname()[1]

            def accept() -> None:
                for _ in range(3):
                    connection, _ = listener.accept()
                    threading.Thread(target=forwarder.serve, args=(connection,), daemon=True).start()

            acceptor = threading.Thread(target=accept, daemon=True)
            acceptor.start()
            answer_text = " ".join(f"word{index}" for index in range(40_000))  # ~350 KB: many chunks
            for call in range(3):
                with httpx.Client(timeout=30) as client:  # a new connection each time
                    answer = client.post(
                        f"http://127.0.0.1:{local}/v1/chat/completions",
                        json={
                            "model": "m",
                            "messages": [{"role": "user", "content": f"call {call}"}],
                            "fake_answer": answer_text,
                        },
                    )
                assert answer.status_code == 200
                assert answer.json()["choices"][0]["message"]["content"] == answer_text
            assert httpx.get(f"{url}/stats", timeout=30).json()["calls"] == 3
            acceptor.join(timeout=30)
    finally:
        server.stop()


@_cluster
def test_a_user_without_rights_gets_the_api_servers_refusal_in_the_contexts_namespace(
    control_plane: ControlPlane, api_client: Any, kubectl: list[str], namespace: str, tmp_path: Path
) -> None:
    """A ServiceAccount with no Role: the commands pass on the API server's RBAC message (verb, resource,
    namespace), and without -n they work in the kubeconfig context's namespace."""
    from kubernetes import client

    from tests.operator.test_rbac import service_account_kubeconfig

    _created_run(api_client, kubectl, namespace, "private")
    core: Any = client.CoreV1Api(api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "stranger"}})
    kubeconfig = service_account_kubeconfig(
        api_client, control_plane, namespace=namespace, name="stranger", path=tmp_path / "kubeconfig"
    )
    for command, refusal in (
        ("summary", 'cannot get resource "asynctrainingruns" in API group "asyncrl.dev"'),
        ("logs", 'cannot list resource "pods" in API group ""'),
    ):
        done = subprocess.run(
            [sys.executable, "-m", "asyncrl.cli", "runs", command, "private", f"--kubeconfig={kubeconfig}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 1, done.stdout
        assert refusal in done.stderr, done.stderr
        assert f'in the namespace "{namespace}"' in done.stderr
        assert "Traceback" not in done.stderr


def test_an_api_server_out_of_reach_is_one_line(tmp_path: Path) -> None:
    """Nothing listens at the kubeconfig's server (a free loopback port)."""
    import yaml

    from asyncrl.testing.controlplane import free_port

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "gone", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "runs", "summary", "demo", f"--kubeconfig={kubeconfig}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "asyncrl runs summary: cannot reach the Kubernetes API server: " in done.stderr
    assert "Traceback" not in done.stderr


@_cluster
def test_plot_of_a_run_whose_trainer_does_not_answer_says_where_its_metrics_are_kept(
    control_plane: ControlPlane, api_client: Any, kubectl: list[str], namespace: str, tmp_path: Path
) -> None:
    """No trainer pod answers here (no Service endpoints): the API server's proxy refuses, and the user is
    told where the per-step file is kept. The fetch itself needs a pod network (test_metrics_server.py asks
    the trainer's port directly)."""
    _created_run(api_client, kubectl, namespace, "curves")
    output = tmp_path / "curves.png"
    done = asyncrl_runs(control_plane, "plot", "curves", "-n", namespace, "-o", str(output))
    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith("asyncrl runs plot: the trainer's per-step metrics did not come through")
    assert "metrics/metrics.jsonl" in done.stderr
    assert not output.exists()
    missing = asyncrl_runs(control_plane, "plot", "nope", "-n", namespace)
    assert missing.returncode == 1
    assert f"no AsyncTrainingRun 'nope' in namespace '{namespace}'" in missing.stderr
