"""`asyncrl operator`: run the kopf operator for AsyncTrainingRuns in some namespaces or cluster-wide."""

from __future__ import annotations

import argparse
import logging

import stamina.instrumentation

from asyncrl.agent_templates.pod_policy import AgentPodPolicy
from asyncrl.agent_templates.renderer import RenderSettings
from asyncrl.operator.dispatcher.agent_pods import DEFAULT_START_TIMEOUT_SECONDS
from asyncrl.operator.metrics import OperatorMetrics


def add_arguments(parser: argparse.ArgumentParser) -> None:
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
    parser.add_argument(
        "--peering",
        default=None,
        metavar="NAME",
        help="coordinate replicas through kopf peering (needs kopf's peering CRD); default: standalone",
    )
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster or ~/.kube/config)"
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
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
        import os

        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it too
    if not args.namespace and not args.all_namespaces:
        raise SystemExit("asyncrl operator: give --namespace NS (repeatable) or --all-namespaces")
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
    )
    kopf.run(
        clusterwide=bool(args.all_namespaces),
        namespaces=list(args.namespace),
        standalone=args.peering is None,
        peering_name=args.peering,
        memo=kopf.Memo(config=config, metrics=metrics),
    )
    return 0
