"""`asyncrl operator`: run the kopf operator for AsyncTrainingRuns in some namespaces or cluster-wide."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence

import pydantic
import stamina.instrumentation

from asyncrl.agent_templates.pod_policy import AgentPodPolicy
from asyncrl.agent_templates.renderer import RenderSettings
from asyncrl.operator.dispatcher.agent_pods import DEFAULT_START_TIMEOUT_SECONDS
from asyncrl.operator.elector import default_identity
from asyncrl.operator.leadership import (
    DEFAULT_LEASE_NAME,
    LEASE_SECONDS,
    RENEW_DEADLINE_SECONDS,
    RETRY_SECONDS,
    LeaderElectionConfig,
)
from asyncrl.operator.metrics import OperatorMetrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _scope_and_serving_arguments(parser)
    _election_arguments(parser)
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster or ~/.kube/config)"
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    _template_arguments(parser)


def _scope_and_serving_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace", "-n", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    parser.add_argument(
        "--gateway-address",
        choices=["service", "localhost"],
        default="service",
        help="reach each run's gateway through its Service (in a cluster) or on 127.0.0.1 (local tests)",
    )
    parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus metrics here (0: off)")
    parser.add_argument(
        "--health-port",
        type=int,
        default=0,
        help="serve /healthz (liveness) and /readyz (503 naming any permission the operator lacks) here "
        "(0: off)",
    )


def _election_arguments(parser: argparse.ArgumentParser) -> None:
    election = parser.add_argument_group('leader election (docs/install.md, "Replicas and leader election")')
    election.add_argument(
        "--leader-elect",
        action="store_true",
        help="act only while holding a coordination.k8s.io Lease, so that several replicas fail over "
        "(the chart sets it); off: act at once, alone",
    )
    election.add_argument(
        "--leader-election-lease",
        default=DEFAULT_LEASE_NAME,
        metavar="NAME",
        help="the Lease's name (default: %(default)s)",
    )
    for flag, default, meaning in (
        ("lease", LEASE_SECONDS, "a standby takes over a Lease left unrenewed this long"),
        ("renew-deadline", RENEW_DEADLINE_SECONDS, "the leader exits when it could not renew for this long"),
        ("retry", RETRY_SECONDS, "the leader renews, and a standby looks, this often"),
    ):
        election.add_argument(
            f"--leader-election-{flag}-seconds",
            type=_positive_float,
            default=default,
            metavar="SECONDS",
            help=f"{meaning} (default: %(default)s; retry < renew deadline < lease)",
        )
    election.add_argument(
        "--leader-election-namespace",
        default=None,
        metavar="NS",
        help="the Lease's namespace (default: env POD_NAMESPACE, else the single --namespace)",
    )


def _template_arguments(parser: argparse.ArgumentParser) -> None:
    templates = parser.add_argument_group("agent templates (see docs/security.md)")
    templates.add_argument(
        "--agent-pod-policy",
        choices=[str(policy) for policy in AgentPodPolicy],
        default=str(AgentPodPolicy.RESTRICTED),
        help="restricted (default): refuse agent Jobs with privileged or host access, another service "
        "account, or Secret references; unrestricted: run what the template says",
    )
    templates.add_argument(
        "--agent-start-timeout-seconds",
        type=_positive_float,
        default=DEFAULT_START_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="an agent pod that cannot start (image pull, configuration) fails its rollout after this; the "
        "run fails when none of its agent pods has started by then (default: %(default)s)",
    )
    templates.add_argument(
        "--template-render-seconds",
        type=_positive_float,
        default=RenderSettings.timeout_seconds,
        metavar="SECONDS",
        help="time limit of one template render (default: %(default)s)",
    )
    templates.add_argument(
        "--template-render-workers",
        type=_positive_int,
        default=RenderSettings.workers,
        metavar="N",
        help="processes rendering templates, shared by all runs (default: %(default)s)",
    )


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def render_settings(args: argparse.Namespace) -> RenderSettings:
    return RenderSettings(
        policy=AgentPodPolicy(args.agent_pod_policy),
        timeout_seconds=args.template_render_seconds,
        workers=args.template_render_workers,
    )


def election_namespace(flag: str | None, environ: Mapping[str, str], namespaces: Sequence[str]) -> str:
    """Where the Lease lives: the flag, else env POD_NAMESPACE (the pod's own namespace), else the one watched
    namespace. ValueError naming the flag when none of them decides it."""
    if flag:
        return flag
    if environ.get("POD_NAMESPACE"):
        return environ["POD_NAMESPACE"]
    if len(namespaces) == 1:
        return namespaces[0]
    raise ValueError(
        "--leader-elect needs the Lease's namespace: give --leader-election-namespace NS (or set env "
        "POD_NAMESPACE); it cannot be decided with --all-namespaces or several --namespace"
    )


def leader_election(args: argparse.Namespace, environ: Mapping[str, str]) -> LeaderElectionConfig | None:
    """The election's settings from the flags (None without `--leader-elect`); ValueError saying what is
    wrong with them."""
    if not args.leader_elect:
        return None
    try:
        return LeaderElectionConfig(
            lease_name=args.leader_election_lease,
            namespace=election_namespace(args.leader_election_namespace, environ, args.namespace),
            identity=default_identity(dict(environ)),
            lease_seconds=args.leader_election_lease_seconds,
            renew_deadline_seconds=args.leader_election_renew_deadline_seconds,
            retry_seconds=args.leader_election_retry_seconds,
        )
    except pydantic.ValidationError as error:
        reasons = "; ".join(str(item["msg"]) for item in error.errors())
        raise ValueError(f"--leader-election-*-seconds: {reasons}") from error


def _api_client(kubeconfig: str | None) -> object:
    from kubernetes import client, config

    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=configuration
        )
    return client.ApiClient(configuration)


def run(args: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    import asyncrl.operator.handlers as handlers

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # Our retry sites log their own line with the reason; stamina's default hooks would add a WARNING without
    # context per retry and a Prometheus counter labelled by attempt number (unbounded for endless retries).
    stamina.instrumentation.set_on_retry_hooks(())
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it too
    if not args.namespace and not args.all_namespaces:
        raise SystemExit("asyncrl operator: give --namespace NS (repeatable) or --all-namespaces")
    try:
        election = leader_election(args, os.environ)
    except ValueError as error:
        raise SystemExit(f"asyncrl operator: {error}") from error
    logging.getLogger(__name__).info("agent pod policy: %s", args.agent_pod_policy)
    metrics = OperatorMetrics()
    if args.metrics_port:
        start_http_server(args.metrics_port, addr="0.0.0.0", registry=metrics.registry)
    config = handlers.OperatorConfig(
        namespaces=list(args.namespace),
        gateway_address=args.gateway_address,
        api_client=_api_client(args.kubeconfig),
        render=render_settings(args),
        agent_start_timeout_seconds=args.agent_start_timeout_seconds,
        health_port=args.health_port,
        leader_election=election,
    )
    kopf.run(
        clusterwide=bool(args.all_namespaces),
        namespaces=list(args.namespace),
        standalone=True,  # no kopf peering: equal peers all pause; replicas fail over by --leader-elect
        memo=kopf.Memo(config=config, metrics=metrics),
    )
    return 0
