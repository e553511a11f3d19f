"""`asyncrl runs ...`: the cluster-side commands a user reaches for, as `kubectl ray` offers for Ray.

- `summary NAME`: the run's phase, step and last step's status fields, conditions, latest events, and the
  trainer's latest metrics when its metrics port answers through the API server's Service proxy;
- `logs NAME`: the trainer's (or `--component gateway`: the gateway sidecar's) log;
- `port-forward NAME`: the run's gateway on 127.0.0.1, for a hand test with curl or the OpenAI SDK.

They use the user's kubeconfig (`--kubeconfig`, `--context`, else KUBECONFIG or ~/.kube/config) through the
Kubernetes client, so they need no kubectl. Logs and port-forwards are served by the node's kubelet through
the API server: a pod not yet on a node has neither, and the error says so rather than the API's 400.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import socket
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from asyncrl.api.types.meta import GROUP, KIND, PLURAL, VERSION
from asyncrl.plot import PlotError, draw, read_curves
from asyncrl.run_summary import (
    EventLine,
    OperatorWatch,
    TrainerMetrics,
    operator_lines,
    parse_gauges,
    summary_lines,
)
from asyncrl.trainer.metrics_server import HISTORY_PATH
from asyncrl.workloads import names

logger = logging.getLogger(__name__)

COMPONENT_CONTAINERS = {"trainer": "trainer", "gateway": "gateway"}
EVENTS_SHOWN = 8
FORWARD_HOST = "127.0.0.1"


class ClusterCommandError(Exception):
    """What went wrong, in one line for the user (printed without a traceback, exit code 1)."""


@dataclass(frozen=True)
class Cluster:
    """The user's API clients and the namespace the command works in."""

    api_client: Any
    namespace: str

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    @property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api_client)

    @property
    def discovery(self) -> Any:
        from kubernetes import client

        return client.DiscoveryV1Api(self.api_client)


def connect(args: argparse.Namespace) -> Cluster:
    """Clients from the kubeconfig (or, with none, the pod's service account); `-n`, else the context's
    namespace, else `default`."""
    from kubernetes import client, config

    configuration = client.Configuration()
    namespace = args.namespace
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=args.kubeconfig, context=args.context, client_configuration=configuration
        )
        if namespace is None:
            _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
            chosen = active
            if args.context is not None:
                contexts, _ = config.list_kube_config_contexts(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
                chosen = next((c for c in contexts if c["name"] == args.context), active)
            namespace = (chosen or {}).get("context", {}).get("namespace")
    except config.ConfigException as error:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            raise ClusterCommandError(
                f"no cluster to talk to: {str(error).rstrip('.')}. Give --kubeconfig, set KUBECONFIG, or run "
                "`kubectl config use-context` first"
            ) from None
    return Cluster(api_client=client.ApiClient(configuration), namespace=namespace or "default")


def _api_reason(error: Any) -> str:
    """The API server's own message of an ApiException, else its reason."""
    try:
        body = json.loads(error.body)
        return str(body.get("message") or error.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(error, "reason", error))


def _stream_reason(error: Exception) -> str:
    """The API server's message of a refused port-forward stream: the client puts the handshake's status,
    headers and body in one string, `status -+-+- headers -+-+- body`."""
    text = str(getattr(error, "reason", None) or error)
    status, _, rest = text.partition(" -+-+- ")
    body = rest.rpartition(" -+-+- ")[2]
    try:
        message = json.loads(body)["message"]
    except (ValueError, KeyError, TypeError):
        return text
    return f"{status.removeprefix('Handshake status ')}: {message}"


def read_run(cluster: Cluster, name: str) -> dict[str, Any]:
    from kubernetes.client.exceptions import ApiException

    try:
        run: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, PLURAL, name
        )
    except ApiException as error:
        if error.status == 404:
            raise ClusterCommandError(
                f"no AsyncTrainingRun {name!r} in namespace {cluster.namespace!r} "
                "(`kubectl get atr -A` lists them; -n NAMESPACE picks another namespace)"
            ) from None
        raise ClusterCommandError(f"reading run {cluster.namespace}/{name}: {_api_reason(error)}") from None
    return run


def run_events(cluster: Cluster, name: str) -> list[EventLine]:
    """The run's latest events, oldest first."""
    from kubernetes.client.exceptions import ApiException

    selector = f"involvedObject.kind={KIND},involvedObject.name={name}"
    try:
        listing = cluster.core.list_namespaced_event(cluster.namespace, field_selector=selector)
    except ApiException as error:
        logger.debug("events of %s not readable: %s", name, _api_reason(error))
        return []

    def when(event: Any) -> datetime:
        moment = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
        return moment or datetime.min.replace(tzinfo=UTC)

    latest = sorted(listing.items, key=when)[-EVENTS_SHOWN:]
    return [
        EventLine(
            time=when(event),
            type=event.type or "",
            reason=event.reason or "",
            message=event.message or "",
            count=event.count or 1,
        )
        for event in latest
    ]


def service_unreachable(cluster: Cluster, run: str, error: Any) -> str:
    """Why the API server's proxy to the run's gateway Service failed, in words: a 404 or 503 from the proxy
    reads the same whether the Service is missing or has no ready endpoint, so look at which."""
    from kubernetes.client.exceptions import ApiException

    service = names.gateway_service_name(run)
    said = f"{error.status}: {_api_reason(error)}"
    if error.status not in (404, 503):
        return said
    try:
        cluster.core.read_namespaced_service(service, cluster.namespace)
    except ApiException as missing:
        if missing.status == 404:
            return (
                f"service {service} does not exist (the run has no trainer yet, or its children were removed)"
            )
        return said
    try:
        slices = cluster.discovery.list_namespaced_endpoint_slice(
            cluster.namespace, label_selector=f"kubernetes.io/service-name={service}"
        )
    except ApiException:
        return said  # not allowed to read EndpointSlices: the proxy's words are all there is
    ready = sum(
        1
        for endpoint_slice in slices.items
        for endpoint in endpoint_slice.endpoints or []
        if endpoint.conditions is None or endpoint.conditions.ready is not False
    )
    if ready:
        return said
    return (
        f"service {service} exists but has no ready endpoint: the trainer pod is not running or not ready "
        f"yet (`asyncrl runs logs {run} -n {cluster.namespace}`, "
        f"`kubectl get pods -n {cluster.namespace} -l {names.LABEL_RUN}={run}`)"
    )


def trainer_metrics(cluster: Cluster, name: str) -> TrainerMetrics:
    """The trainer's /metrics through the API server's proxy to the run's gateway Service (port `metrics`)."""
    from kubernetes.client.exceptions import ApiException

    service = names.gateway_service_name(name)
    source = f"service {service}, port metrics, through the API server"
    try:
        text = cluster.core.connect_get_namespaced_service_proxy_with_path(
            f"{service}:metrics", cluster.namespace, "metrics"
        )
    except ApiException as error:
        return TrainerMetrics(gauges={}, source=source, unavailable=service_unreachable(cluster, name, error))
    except OSError as error:
        return TrainerMetrics(gauges={}, source=source, unavailable=str(error))
    try:
        return TrainerMetrics(gauges=parse_gauges(str(text)), source=source)
    except ValueError as error:
        return TrainerMetrics(gauges={}, source=source, unavailable=f"not Prometheus text: {error}")


def trainer_history(cluster: Cluster, name: str) -> str:
    """The trainer's per-step JSON lines, as its metrics port serves them (`/history.jsonl`), through the API
    server's proxy to the run's gateway Service."""
    from kubernetes.client.exceptions import ApiException

    service = names.gateway_service_name(name)
    try:
        text = cluster.core.connect_get_namespaced_service_proxy_with_path(
            f"{service}:metrics", cluster.namespace, HISTORY_PATH.lstrip("/")
        )
    except ApiException as error:
        raise ClusterCommandError(
            f"the trainer's per-step metrics did not come through the API server (service {service}, "
            f"port metrics: {service_unreachable(cluster, name, error)}). A run whose trainer pod is gone "
            "keeps them on its checkpoint volume, at metrics/metrics.jsonl: copy that file and run "
            "`asyncrl plot` on it"
        ) from error
    return str(text)


# -- the trainer pod ----------------------------------------------------------------------------------------


def trainer_pod(cluster: Cluster, name: str) -> Any:
    """The run's trainer pod (the Job's, or a multi-node run's Ray head): the running one, else the newest."""
    selector = (
        f"{names.LABEL_RUN}={name},{names.LABEL_COMPONENT}={names.COMPONENT_TRAINER},"
        f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"
    )
    pods = cluster.core.list_namespaced_pod(cluster.namespace, label_selector=selector).items
    if not pods:
        read_run(cluster, name)  # a missing run is the better message
        raise ClusterCommandError(
            f"run {cluster.namespace}/{name} has no trainer pod yet (`asyncrl runs summary {name}` shows its "
            "phase; a suspended or queued run has none)"
        )
    running = [pod for pod in pods if pod.status and pod.status.phase == "Running"]
    return max(running or pods, key=lambda pod: pod.metadata.creation_timestamp)


def require_node(pod: Any, *, what: str) -> None:
    """Logs and port-forwards come from the pod's kubelet: refuse clearly when the pod has no node."""
    if not pod.spec.node_name:
        phase = pod.status.phase if pod.status else None
        raise ClusterCommandError(
            f"pod {pod.metadata.namespace}/{pod.metadata.name} is not on a node yet (phase {phase}), "
            f"so it has no {what}: `kubectl describe pod {pod.metadata.name} -n {pod.metadata.namespace}` "
            "shows what it waits for (scheduling, quota, images)"
        )


# -- the commands -------------------------------------------------------------------------------------------


def installed_operators(cluster: Cluster) -> tuple[list[OperatorWatch] | None, str]:
    """The asyncrl operator Deployments of the cluster and what each watches (from its --namespace and
    --all-namespaces arguments); (None, why) when they cannot be listed."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        listing = client.AppsV1Api(cluster.api_client).list_deployment_for_all_namespaces(
            label_selector="app.kubernetes.io/name=asyncrl-operator"
        )
    except ApiException as error:
        return None, f"listing Deployments: {error.status}: {_api_reason(error)}"
    found = []
    deployments: list[Any] = list(listing.items)  # the client's models, read as such
    for deployment in deployments:
        args = [
            arg
            for container in deployment.spec.template.spec.containers
            for arg in [*(container.command or []), *(container.args or [])]
        ]
        watches = (
            None
            if "--all-namespaces" in args
            else tuple(arg.removeprefix("--namespace=") for arg in args if arg.startswith("--namespace="))
        )
        found.append(
            OperatorWatch(str(deployment.metadata.namespace), str(deployment.metadata.name), watches)
        )
    return found, ""


def run_summary(args: argparse.Namespace) -> int:
    cluster = connect(args)
    run = read_run(cluster, args.name)
    events = run_events(cluster, args.name)
    operators: list[str] = []
    if not (run.get("status") or {}).get("phase"):
        found, why = installed_operators(cluster)
        operators = operator_lines(cluster.namespace, found, why)
    trainer = None if args.no_trainer_metrics else trainer_metrics(cluster, args.name)
    if args.output == "json":
        document = {
            "run": {"namespace": cluster.namespace, "name": args.name},
            "spec": {"totalSteps": (run.get("spec") or {}).get("totalSteps")},
            "status": run.get("status") or {},
            "events": [
                {**event.__dict__, "time": event.time.isoformat() if event.time else None} for event in events
            ],
            "trainerMetrics": None
            if trainer is None
            else {
                "source": trainer.source,
                "unavailable": trainer.unavailable,
                "gauges": dict(trainer.gauges),
            },
        }
        print(json.dumps(document, indent=2, sort_keys=True))
        return 0
    print(
        "\n".join(
            summary_lines(run, events=events, trainer=trainer, now=datetime.now(UTC), operators=operators)
        )
    )
    return 0


def run_plot(args: argparse.Namespace) -> int:
    cluster = connect(args)
    read_run(cluster, args.name)  # a missing run is the better message
    text = trainer_history(cluster, args.name)
    output: Path = args.output or Path(f"{args.name}-metrics.png")
    kept = output.with_suffix(".jsonl")
    try:
        curves = read_curves(text.splitlines(), source=f"run {cluster.namespace}/{args.name}'s trainer")
        kept.write_text(text, encoding="utf-8")
        title = f"{cluster.namespace}/{args.name}: steps {curves.steps[0]} to {curves.steps[-1]}"
        draw(curves, output, title=title)
    except PlotError as error:
        raise ClusterCommandError(str(error)) from error
    print(f"wrote {output} ({len(curves.steps)} steps) and the metrics it was drawn from, {kept}")
    return 0


def run_logs(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException

    cluster = connect(args)
    pod = trainer_pod(cluster, args.name)
    require_node(pod, what="logs")
    container = COMPONENT_CONTAINERS[args.component]
    try:
        if args.follow:
            response = cluster.core.read_namespaced_pod_log(
                pod.metadata.name,
                cluster.namespace,
                container=container,
                follow=True,
                previous=args.previous,
                tail_lines=args.tail,
                _preload_content=False,
            )
            for chunk in response.stream():
                sys.stdout.write(chunk.decode(errors="replace"))
                sys.stdout.flush()
            return 0
        text = cluster.core.read_namespaced_pod_log(
            pod.metadata.name,
            cluster.namespace,
            container=container,
            previous=args.previous,
            tail_lines=args.tail,
        )
    except ApiException as error:
        raise ClusterCommandError(
            f"the {args.component} log of pod {cluster.namespace}/{pod.metadata.name} "
            f"(container {container}) could not be read: {_api_reason(error)}"
        ) from None
    sys.stdout.write(text)
    return 0


def gateway_port(pod: Any) -> int:
    """The port the gateway sidecar listens on (its container port named `gateway`)."""
    for container in [*(pod.spec.init_containers or []), *pod.spec.containers]:
        for port in container.ports or []:
            if port.name == "gateway":
                return int(port.container_port)
    raise ClusterCommandError(f"pod {pod.metadata.name} has no container port named gateway")


def run_port_forward(args: argparse.Namespace) -> int:
    cluster = connect(args)
    pod = trainer_pod(cluster, args.name)
    require_node(pod, what="port to forward")
    remote = gateway_port(pod)
    with socket.create_server((FORWARD_HOST, args.local_port)) as listener:
        local = listener.getsockname()[1]
        forwarder = PortForwarder(cluster, pod_name=pod.metadata.name, remote_port=remote)
        forwarder.check()
        print(
            f"Forwarding http://{FORWARD_HOST}:{local} -> pod {cluster.namespace}/{pod.metadata.name} port "
            f"{remote} (the gateway). Try `curl http://{FORWARD_HOST}:{local}/readyz`; the management routes "
            f"take the key in Secret {names.gateway_key_secret_name(args.name)} "
            "(or spec.gateway.keySecretRef). Ctrl-C stops.",
            flush=True,
        )
        try:
            for connection in _accepted(listener):
                threading.Thread(target=forwarder.serve, args=(connection,), daemon=True).start()
        except KeyboardInterrupt:
            return 0
    return 0


def _accepted(listener: socket.socket) -> Iterator[socket.socket]:
    while True:
        connection, _ = listener.accept()
        yield connection


class PortForwarder:
    """One API-server port-forward stream per local connection, bytes pumped both ways."""

    def __init__(self, cluster: Cluster, *, pod_name: str, remote_port: int) -> None:
        self.cluster, self.pod_name, self.remote_port = cluster, pod_name, remote_port

    def _open(self) -> Any:
        from kubernetes.stream import portforward

        return portforward(
            self.cluster.core.connect_get_namespaced_pod_portforward,
            self.pod_name,
            self.cluster.namespace,
            ports=str(self.remote_port),
        )

    def check(self) -> None:
        """Open (and close) one stream, so a refused port-forward is reported before anything listens."""
        try:
            stream = self._open()
            error = stream.error(self.remote_port)
            stream.close()
        except Exception as failure:  # ApiException, the websocket's errors, OSError: all say why
            reason = _stream_reason(failure)
            raise ClusterCommandError(
                f"port-forward to pod {self.cluster.namespace}/{self.pod_name} port {self.remote_port} "
                f"failed: {reason}"
            ) from None
        if error:
            raise ClusterCommandError(f"port-forward to pod {self.pod_name} port {self.remote_port}: {error}")

    def serve(self, connection: socket.socket) -> None:
        try:
            stream = self._open()
        except Exception as error:
            logger.warning("port-forward stream failed: %s", error)
            connection.close()
            return
        remote = stream.socket(self.remote_port)
        remote.setblocking(True)

        def pump(source: socket.socket, target: socket.socket) -> None:
            try:
                while data := source.recv(65536):
                    target.sendall(data)
            except OSError:
                pass
            finally:
                for end in (source, target):
                    with contextlib.suppress(OSError):
                        end.shutdown(socket.SHUT_RDWR)

        back = threading.Thread(target=pump, args=(remote, connection), daemon=True)
        back.start()
        pump(connection, remote)
        back.join(timeout=30)
        connection.close()
        stream.close()


# -- arguments ----------------------------------------------------------------------------------------------


def _local_port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535; 0 picks a free one)")
    return port


def _lines(text: str) -> int:
    try:
        lines = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines") from None
    if lines < 0:
        raise argparse.ArgumentTypeError(f"{lines}: give 0 or more lines")
    return lines


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the AsyncTrainingRun")
    parser.add_argument("-n", "--namespace", default=None, help="its namespace (default: the context's)")
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")


def _guarded(handler: Any) -> Any:
    """The command, its failures as one line on stderr and exit code 1: ours, the API server's refusals
    (e.g. RBAC: its message names the verb and resource), an API server out of reach."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    def run(args: argparse.Namespace) -> int:
        try:
            return int(handler(args))
        except ClusterCommandError as error:
            problem = str(error)
        except ApiException as error:
            problem = f"the API server refused ({error.status}): {_api_reason(error)}"
        except HTTPError as error:
            problem = f"cannot reach the Kubernetes API server: {error}"
        print(f"asyncrl runs {args.runs_command}: {problem}", file=sys.stderr)
        return 1

    return run


def add_commands(commands: Any) -> None:
    """`asyncrl runs summary|plot|logs|port-forward NAME`."""
    runs = commands.add_parser(
        "runs", help="a run on the cluster: summary, plot, logs, port-forward to its gateway"
    )
    subcommands = runs.add_subparsers(dest="runs_command", metavar="COMMAND", required=True)

    summary = subcommands.add_parser(
        "summary", help="phase, step, last step, conditions, events, trainer metrics"
    )
    _cluster_arguments(summary)
    summary.add_argument("-o", "--output", choices=("text", "json"), default="text")
    summary.add_argument(
        "--no-trainer-metrics",
        action="store_true",
        help="skip reading the trainer's /metrics through the API",
    )
    summary.set_defaults(handler=_guarded(run_summary))

    plot = subcommands.add_parser(
        "plot", help="the run's curves (reward, carry-over, step time) from its trainer, as `asyncrl plot`"
    )
    _cluster_arguments(plot)
    plot.add_argument(
        "-o", "--output", type=Path, default=None, help="the PNG to write (default: NAME-metrics.png)"
    )
    plot.set_defaults(handler=_guarded(run_plot))

    logs = subcommands.add_parser("logs", help="the trainer's or the gateway's log")
    _cluster_arguments(logs)
    logs.add_argument("--component", choices=tuple(COMPONENT_CONTAINERS), default="trainer")
    logs.add_argument(
        "-p", "--previous", action="store_true", help="the previous (restarted) container's log"
    )
    logs.add_argument("-f", "--follow", action="store_true", help="keep streaming new lines")
    logs.add_argument("--tail", type=_lines, default=None, metavar="LINES", help="only the last LINES lines")
    logs.set_defaults(handler=_guarded(run_logs))

    forward = subcommands.add_parser("port-forward", help="the run's gateway on 127.0.0.1, for a hand test")
    _cluster_arguments(forward)
    forward.add_argument(
        "--local-port", type=_local_port, default=0, help="local port on 127.0.0.1 (default 0: a free one)"
    )
    forward.set_defaults(handler=_guarded(run_port_forward))
