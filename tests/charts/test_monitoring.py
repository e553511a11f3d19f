"""The chart's Prometheus and Grafana objects: the runs' ServiceMonitor, the alert rules, the dashboard.

What they name must exist: the ServiceMonitor selects the labels and ports of the gateway Service the operator
really builds (children.py), whose ports reach containers that really name them; and every metric in every
rule and dashboard expression (parsed by a PromQL parser) is one the components really export: the gateway's
from a real `asyncrl gateway` process's /metrics, the trainer's from a real step loop (real gateway, agents
and upstream; a recording backend in place of torch, so the names are the loop's, not one backend's) served
on 127.0.0.1, and the operator's from its registry after it observed a run with every status field set.
Against the control plane, the API server checks the rendered objects against the prometheus-operator CRDs
(provisioned from its Go module by scripts/provision-prometheus-crds.sh).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from asyncrl.api import AsyncTrainingRunStatus, Phase, load_run
from asyncrl.api.types.status import RolloutCounts
from asyncrl.operator.metrics import OperatorMetrics
from asyncrl.testing.controlplane import ControlPlane, free_port
from asyncrl.trainer.data import PromptSource
from asyncrl.trainer.loop import StepLoop
from asyncrl.trainer.metrics import MetricsSinks, PrometheusSink
from asyncrl.trainer.pause_holding import PauseHoldingClient
from asyncrl.workloads import children, names
from asyncrl.workloads.ray_cluster import ray_cluster
from tests.charts.test_chart import CHART, KUBE_VERSION, _helm, _values, documents, one, render
from tests.operator.test_ray_cluster import _run as multi_node_run
from tests.support.kube import kubectl_for, run_manifest
from tests.trainer.test_restarts import (
    KEY,
    ROWS,
    RecordingBackend,
    _gateway,
    _run_with_agents,
    _settings,
    _upstream,
)

ALL_ON = {
    "serviceMonitor.enabled": True,
    "runServiceMonitor.enabled": True,
    "prometheusRule.enabled": True,
    "grafanaDashboard.enabled": True,
}
PROMETHEUS_CRDS = ("servicemonitors", "podmonitors", "prometheusrules")
Manifest = dict[str, Any]


# -- what the objects say -------------------------------------------------------------------------------


def _rules(docs: list[Manifest]) -> dict[str, Manifest]:
    (group,) = one(docs, "PrometheusRule")["spec"]["groups"]
    return {rule["alert"]: rule for rule in group["rules"]}


def _dashboard(docs: list[Manifest]) -> Manifest:
    config_map = next(
        doc for doc in docs if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-dashboard")
    )
    (source,) = config_map["data"].values()
    dashboard: Manifest = json.loads(source)
    return dashboard


def _expressions(docs: list[Manifest]) -> dict[str, str]:
    """Every PromQL expression of the rules and the dashboard, keyed by where it is."""
    found = {f"alert {name}": rule["expr"] for name, rule in _rules(docs).items()}
    dashboard = _dashboard(docs)
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("definition", "")
        if query.startswith("label_values("):  # Grafana's function; its first argument is a selector
            found[f"variable {variable['name']}"] = query.removeprefix("label_values(").rsplit(",", 1)[0]
    return found


def metric_names(expression: str) -> set[str]:
    """The metric names an expression selects (by name or by a `__name__` matcher)."""
    selected: set[str] = set()

    def visit(node: Any) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                selected.add(node.name)
            selected.update(m.value for m in node.matchers.matchers if m.name == "__name__")
        return True

    promql_parser.walk(promql_parser.parse(expression), visit)
    return selected


def test_metric_names_are_read_from_the_parsed_expression() -> None:
    expression = (
        'histogram_quantile(0.9, sum by (le, name) (rate(a_bucket{name=~"$run"}[5m]))) '
        'and on (namespace, name) b offset 5m unless {__name__="c"} > bool 3'
    )
    assert metric_names(expression) == {"a_bucket", "b", "c"}


def test_nothing_is_rendered_for_prometheus_or_grafana_by_default(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    kinds = [doc["kind"] for doc in documents(render(helm, helm_env))]
    assert "ServiceMonitor" not in kinds
    assert "PrometheusRule" not in kinds
    assert "ConfigMap" not in kinds


def test_the_run_monitor_selects_the_gateway_service_the_operator_builds_and_its_ports(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    docs = documents(
        render(helm, helm_env, namespace="ops", **{"watch.namespaces": ["team-a", "team-b"], **ALL_ON})
    )
    monitor = next(
        doc for doc in docs if doc["kind"] == "ServiceMonitor" and doc["metadata"]["name"].endswith("-runs")
    )
    run = {**run_manifest("demo"), "metadata": {"name": "demo", "namespace": "team-a", "uid": "u-1"}}
    spec = load_run(run).spec
    service = children.gateway_service(run, spec)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    service_ports = {port["name"]: port["targetPort"] for port in service["spec"]["ports"]}
    endpoints = {endpoint["port"]: endpoint for endpoint in monitor["spec"]["endpoints"]}
    assert set(endpoints) == {"gateway", "metrics"} == set(service_ports)
    # Each Service port reaches a container port of that name in the pod the Service selects: the trainer
    # Job's pod, and a multi-node run's Ray head pod (its Service is built the same way).
    multi_node, multi_node_spec = multi_node_run()
    head = ray_cluster(multi_node, multi_node_spec)[0]["spec"]["headGroupSpec"]["template"]
    multi_node_service = children.gateway_service(multi_node, multi_node_spec)
    for pod, pod_service in (
        (children.trainer_job(run, spec)["spec"]["template"], service),
        (head, multi_node_service),
    ):
        assert pod_service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_service["metadata"]["labels"].items()
        containers = {c["name"]: c for c in pod["spec"]["initContainers"] + pod["spec"]["containers"]}
        named = {port["name"]: name for name, c in containers.items() for port in c.get("ports", [])}
        targets = {port["name"]: port["targetPort"] for port in pod_service["spec"]["ports"]}
        assert {port: named[target] for port, target in targets.items()} == {
            "gateway": "gateway",
            "metrics": children.TRAINER_CONTAINER,
        }
    # The run's name becomes the label `name` (as on the operator's asyncrl_run_* gauges).
    sanitized = "__meta_kubernetes_service_label_" + names.LABEL_RUN.replace(".", "_").replace("/", "_")
    for endpoint in endpoints.values():
        assert endpoint["path"] == "/metrics"
        assert {"sourceLabels": [sanitized], "targetLabel": "name"} in endpoint["relabelings"]
    cluster_wide = documents(render(helm, helm_env, **{"watch.clusterWide": True, **ALL_ON}))
    wide = next(
        d for d in cluster_wide if d["kind"] == "ServiceMonitor" and d["metadata"]["name"].endswith("-runs")
    )
    assert wide["spec"]["namespaceSelector"] == {"any": True}


def test_the_operator_monitor_keeps_the_runs_namespace_label(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    """Without honorLabels, Prometheus renames asyncrl_run_*'s `namespace` (the run's) to exported_namespace
    and the alerts would name the operator's namespace."""
    docs = documents(render(helm, helm_env, **{"serviceMonitor.enabled": True}))
    (endpoint,) = one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True


def test_alert_thresholds_are_values(helm: list[str], helm_env: dict[str, str]) -> None:
    values = {
        "prometheusRule.enabled": True,
        "prometheusRule.noStepMinutes": 45,
        "prometheusRule.pausedWithoutUpdateMinutes": 7,
        "prometheusRule.failedRolloutRatio": 0.25,
        "prometheusRule.failedRolloutMinutes": 9,
        "prometheusRule.trainerRestarts": 4,
        "prometheusRule.trainerRestartWindowMinutes": 60,
        "prometheusRule.severity": "page",
        "prometheusRule.labels": {"release": "prom"},
    }
    docs = documents(render(helm, helm_env, **values))
    assert one(docs, "PrometheusRule")["metadata"]["labels"]["release"] == "prom"
    rules = _rules(docs)
    assert sorted(rules) == [
        "AsyncRLFailedRolloutRatio",
        "AsyncRLGatewayPausedWithoutUpdate",
        "AsyncRLRunWithoutStep",
        "AsyncRLTrainerRestartLoop",
    ]
    assert rules["AsyncRLRunWithoutStep"]["expr"].endswith("> 2700")
    assert rules["AsyncRLGatewayPausedWithoutUpdate"]["for"] == "7m"
    assert rules["AsyncRLFailedRolloutRatio"]["expr"].endswith("> 0.25")
    assert rules["AsyncRLFailedRolloutRatio"]["for"] == "9m"
    assert "Over 25% of run" in rules["AsyncRLFailedRolloutRatio"]["annotations"]["summary"]
    restart = rules["AsyncRLTrainerRestartLoop"]["expr"]
    assert "[60m]" in restart
    assert restart.endswith(">= 4")
    assert {rule["labels"]["severity"] for rule in rules.values()} == {"page"}
    # Prometheus's own templates survive Helm's.
    assert (
        "{{ $labels.namespace }}/{{ $labels.name }}"
        in rules["AsyncRLRunWithoutStep"]["annotations"]["summary"]
    )


def test_the_dashboard_is_a_config_map_the_grafana_sidecar_picks_up(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    docs = documents(render(helm, helm_env, namespace="ml", **{"grafanaDashboard.enabled": True}))
    (config_map,) = [doc for doc in docs if doc["kind"] == "ConfigMap"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "ml"
    titles = [panel["title"] for panel in _dashboard(docs)["panels"]]
    for topic in (
        "Reward",
        "Steps per minute",
        "Carry-over",
        "Drain",
        "Gateway latency",
        "Rollouts by state",
    ):
        assert any(title.startswith(topic) for title in titles), (topic, titles)
    moved = documents(
        render(
            helm,
            helm_env,
            **{
                "grafanaDashboard.enabled": True,
                "grafanaDashboard.namespace": "monitoring",
                "grafanaDashboard.annotations": {"grafana_folder": "asyncrl"},
            },
        )
    )
    (config_map,) = [doc for doc in moved if doc["kind"] == "ConfigMap"]
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "asyncrl"}


def test_out_of_range_alert_values_are_refused_by_the_schema(
    helm: list[str], helm_env: dict[str, str]
) -> None:
    args = ["template", "asyncrl", str(CHART), f"--kube-version={KUBE_VERSION}"]
    for key, value in (("prometheusRule.failedRolloutRatio", 1.5), ("prometheusRule.noStepMinutes", 0)):
        done = _helm(helm, helm_env, *args, *_values(**{key: value}), check=False)
        assert done.returncode != 0, key
        assert key.split(".")[1] in done.stderr
    typo = _helm(helm, helm_env, *args, *_values(**{"runServiceMonitor.enable": True}), check=False)
    assert typo.returncode != 0
    assert "enable" in typo.stderr


# -- every metric named is exported -----------------------------------------------------------------------


def exported_names(exposition: str) -> set[str]:
    """The series names a Prometheus scrape of this text yields (counters with _total, histograms with
    _bucket/_sum/_count), also for families that have no sample yet."""
    found: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        found.update(sample.name for sample in family.samples)
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(
            family.type, ("",)
        )
        found.update(family.name + suffix for suffix in suffixes)
    return found


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body.decode()


@dataclass
class Observed:
    """What a real two-step run showed: the scrapes, and the pause gauges seen during each update."""

    gateway: str = ""
    trainer: str = ""
    during_update: list[tuple[float | None, float | None]] = field(default_factory=list)  # (gateway, trainer)


def _gauge(exposition: str, name: str) -> float | None:
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    return None


@pytest.fixture(scope="module")
def real_run(upstream_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    log_dir = tmp_path_factory.mktemp("monitoring-run")
    port = free_port()
    gateway_url = f"http://127.0.0.1:{port}"
    gateway = _gateway(port, log_dir)
    sink = PrometheusSink()
    trainer_port = free_port()
    server, thread = start_http_server(trainer_port, addr="127.0.0.1", registry=sink.registry)
    observed = Observed()

    def during_update(step: int) -> None:
        del step
        observed.during_update.append(
            (
                _gauge(_scrape(f"{gateway_url}/metrics"), "asyncrl_gateway_paused"),
                _gauge(_scrape(f"http://127.0.0.1:{trainer_port}/metrics"), "asyncrl_trainer_holding_pause"),
            )
        )

    backend = RecordingBackend(upstream_url, during_update=during_update)
    sinks = MetricsSinks([sink])

    async def main() -> None:
        async with PauseHoldingClient(gateway_url, KEY, report=sinks.report_holding_pause) as client:
            loop = StepLoop(
                settings=_settings(steps=2, checkpoint_dir=None),
                gateway=client,
                backend=backend,
                prompts=PromptSource(ROWS, shuffle=False, seed=0),
                sinks=sinks,
            )
            await _run_with_agents(loop, gateway_url)

    try:
        asyncio.run(main())
        observed.gateway = _scrape(f"{gateway_url}/metrics")
        observed.trainer = _scrape(f"http://127.0.0.1:{trainer_port}/metrics")
        yield observed
    finally:
        server.shutdown()
        thread.join(timeout=10)
        gateway.stop()


@pytest.fixture(scope="module")
def upstream_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url, server = _upstream(tmp_path_factory.mktemp("monitoring-upstream"))
    yield url
    server.stop()


def _operator_exposition() -> str:
    from prometheus_client import generate_latest

    metrics = OperatorMetrics()
    now = datetime.now(UTC)
    status = AsyncTrainingRunStatus(
        phase=Phase.RUNNING,
        step=3,
        active_groups=2,
        carry_over_age_max_steps=1,
        rollouts=RolloutCounts(),
        start_time=now,
        last_step_time=now,
    )
    metrics.observe_run(namespace="ns", name="run", status=status)
    return generate_latest(metrics.registry).decode()


@pytest.mark.slow
def test_every_metric_in_the_rules_and_the_dashboard_is_exported_by_a_component(
    helm: list[str], helm_env: dict[str, str], real_run: Observed
) -> None:
    exported = (
        exported_names(real_run.gateway)
        | exported_names(real_run.trainer)
        | exported_names(_operator_exposition())
    )
    assert "asyncrl_critic_score_mean" in exported  # the scrape of the real step loop is there
    expressions = _expressions(documents(render(helm, helm_env, **ALL_ON)))
    assert len(expressions) >= 15
    missing = {where: sorted(metric_names(expr) - exported) for where, expr in expressions.items()}
    assert {where: names for where, names in missing.items() if names} == {}


@pytest.mark.slow
def test_the_trainer_holds_the_pause_only_while_it_updates(real_run: Observed) -> None:
    """What AsyncRLGatewayPausedWithoutUpdate joins: during each update the gateway reports paused and the
    trainer reports holding it; after the run the gateway is open and the trainer holds nothing."""
    assert real_run.during_update == [(1.0, 1.0), (1.0, 1.0)]
    assert _gauge(real_run.gateway, "asyncrl_gateway_paused") == 0.0
    assert _gauge(real_run.trainer, "asyncrl_trainer_holding_pause") == 0.0


@pytest.mark.slow
def test_the_gateway_counts_each_trainer_start(real_run: Observed, upstream_url: str, tmp_path: Path) -> None:
    """What AsyncRLTrainerRestartLoop counts: one registration per trainer start on the same gateway."""
    assert _gauge(real_run.gateway, "asyncrl_gateway_upstream_registrations_total") == 1.0
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = _gateway(port, tmp_path)
    try:
        with httpx.Client(base_url=url, headers={"authorization": f"Bearer {KEY}"}, timeout=30) as client:
            for _ in range(3):  # three trainers starting in turn
                client.put("/api/upstreams", json={"upstreams": [upstream_url]}).raise_for_status()
        assert _gauge(_scrape(f"{url}/metrics"), "asyncrl_gateway_upstream_registrations_total") == 3.0
    finally:
        gateway.stop()


def test_the_operator_exports_when_a_run_started_and_last_stepped() -> None:
    """What AsyncRLRunWithoutStep compares with time(); the series go with the run."""
    metrics = OperatorMetrics()
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    stepped = datetime(2026, 1, 2, 3, 14, 5, tzinfo=UTC)
    labels = {"namespace": "ns", "name": "run"}
    metrics.observe_run(
        namespace="ns", name="run", status=AsyncTrainingRunStatus(phase=Phase.RUNNING, start_time=started)
    )
    registry = metrics.registry
    assert registry.get_sample_value("asyncrl_run_start_timestamp_seconds", labels) == started.timestamp()
    assert registry.get_sample_value("asyncrl_run_last_step_timestamp_seconds", labels) is None
    status = AsyncTrainingRunStatus(phase=Phase.RUNNING, step=0, start_time=started, last_step_time=stepped)
    metrics.observe_run(namespace="ns", name="run", status=status)
    assert registry.get_sample_value("asyncrl_run_last_step_timestamp_seconds", labels) == stepped.timestamp()
    metrics.forget_run(namespace="ns", name="run")
    assert registry.get_sample_value("asyncrl_run_start_timestamp_seconds", labels) is None
    assert registry.get_sample_value("asyncrl_run_last_step_timestamp_seconds", labels) is None


# -- against the API server -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def prometheus_crds(control_plane: ControlPlane) -> list[str]:
    cache = Path(os.environ.get("ASYNCRL_CACHE_DIR", Path.home() / ".cache" / "asyncrl"))
    found = sorted((cache / "prometheus-operator").glob("v*/crds/monitoring.coreos.com_*.yaml"))
    if not found:
        pytest.fail(
            "the prometheus-operator CRDs are not provisioned; run scripts/provision-prometheus-crds.sh",
            pytrace=False,
        )
    kubectl = kubectl_for(control_plane)
    for path in found:
        done = subprocess.run(
            [*kubectl, "apply", "--server-side", "-f", str(path)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
    for plural in PROMETHEUS_CRDS:
        subprocess.run(
            [
                *kubectl,
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                f"crd/{plural}.monitoring.coreos.com",
            ],
            check=True,
            capture_output=True,
        )
    return kubectl


@pytest.mark.controlplane
@pytest.mark.parametrize(
    "scope",
    [{"watch.namespaces": ["NAMESPACE"]}, {"watch.clusterWide": True}],
    ids=["namespaced", "cluster-wide"],
)
def test_the_monitors_rules_and_dashboard_are_accepted_by_the_api_server(
    helm: list[str],
    helm_env: dict[str, str],
    prometheus_crds: list[str],
    namespace: str,
    scope: dict[str, Any],
) -> None:
    """Applied for real, checked by the API server against the prometheus-operator CRDs' schemas."""
    values = {key: [namespace] if value == ["NAMESPACE"] else value for key, value in scope.items()}
    rendered = render(helm, helm_env, namespace=namespace, **values, **ALL_ON)
    wanted = [
        doc for doc in documents(rendered) if doc["kind"] in ("ServiceMonitor", "PrometheusRule", "ConfigMap")
    ]
    assert sorted(doc["kind"] for doc in wanted) == [
        "ConfigMap",
        "PrometheusRule",
        "ServiceMonitor",
        "ServiceMonitor",
    ]
    done = subprocess.run(
        [*prometheus_crds, "apply", "--server-side", "--validate=strict", "-n", namespace, "-f", "-"],
        input=yaml.safe_dump_all(wanted),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = subprocess.run(
        [
            *prometheus_crds,
            "get",
            "-n",
            namespace,
            "servicemonitors,prometheusrules,configmaps",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    stored = {(item["kind"], item["metadata"]["name"]): item for item in json.loads(got.stdout)["items"]}
    # Nothing was pruned as unknown (the API server may add defaults, e.g. a relabeling's action).
    for doc in wanted:
        if doc["kind"] != "ConfigMap":
            assert _holds(stored[(doc["kind"], doc["metadata"]["name"])]["spec"], doc["spec"]), doc["kind"]


def _holds(stored: Any, wanted: Any) -> bool:
    """Whether `stored` has everything `wanted` has (and maybe more keys in its mappings)."""
    if isinstance(wanted, dict):
        return isinstance(stored, dict) and all(
            k in stored and _holds(stored[k], v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return isinstance(stored, list) and len(stored) == len(wanted) and all(map(_holds, stored, wanted))
    return bool(stored == wanted)


@pytest.mark.slow
def test_a_resume_that_fails_lets_go_of_the_pause(tmp_path: Path) -> None:
    """Once the trainer tries to resume, a gateway still paused is not its update any more: the alert on a
    gateway paused without an update must fire then, not wait for the trainer to die. Against a real gateway
    that is stopped between the pause and the resume."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = _gateway(port, tmp_path)
    reports: list[bool] = []

    async def pause_then_resume() -> None:
        async with PauseHoldingClient(url, KEY, report=reports.append, timeout_seconds=5) as client:
            await client.pause(reason="update", wait_seconds=1)
            assert reports == [True]
            gateway.stop()
            with pytest.raises(httpx.TransportError):
                await client.resume(model_version=1)

    try:
        asyncio.run(pause_then_resume())
    finally:
        gateway.stop()
    assert reports == [True, False]
