"""A running run's reconcile knows its children from the operator's watches, not by reading them (issue 25
item 9: those reads were three quarters of an idle run's API requests, 25 per run-minute).

Real parts: kube-apiserver, the `asyncrl operator` process (its own request counter, scraped from
`--metrics-port`), the gateway sidecar. Stand-ins: the pod runner for the kubelet, and a trainer container
that only sleeps, so the run stays Running as long as the test needs.
"""

from __future__ import annotations

import re
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from asyncrl.launch.podspec import Image, ImageTable
from asyncrl.testing.controlplane import ControlPlane, free_port
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for
from tests.support.kube import apply_ok, run_manifest, start_operator_process, wait_for_phase

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

IDLE_TRAINER_IMAGE = "asyncrl.test/idle-trainer"


@pytest.fixture(autouse=True)
def _idle_trainer(image_table: ImageTable) -> None:
    image_table[IDLE_TRAINER_IMAGE] = Image(
        entrypoint=(sys.executable, "-c", "import time; time.sleep(3600)"), replace_command=True
    )


def _requests(metrics_port: int) -> dict[tuple[str, str], float]:
    """The operator's `asyncrl_operator_api_requests_total` by (verb, resource)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    counts = {}
    for found in re.finditer(r"^asyncrl_operator_api_requests_total\{(.*)\} (\S+)$", text, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
        counts[(labels["verb"], labels["resource"])] = float(found.group(2))
    return counts


def test_a_running_run_reads_no_watched_child_and_its_key_secret_every_30_seconds(
    control_plane: ControlPlane,
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    installed_crd: Path,
    tmp_path: Path,
) -> None:
    metrics_port = free_port()
    operator = start_operator_process(
        kubeconfig=control_plane.kubeconfig,
        scope=["--namespace", namespace],
        log_path=tmp_path / "operator.log",
        extra_args=[f"--metrics-port={metrics_port}"],
    )
    try:
        manifest = run_manifest("watched")
        manifest["spec"]["trainer"]["image"] = IDLE_TRAINER_IMAGE
        apply_ok(kubectl, namespace, manifest)
        wait_for_phase(api_client, namespace, "watched", "Running", timeout=120, what="the run to be Running")
        before = _requests(metrics_port)
        # Two reads of the key Secret: at least 30 s of reconciles, each requeue (5 s) included. A reconcile
        # that read its children at every requeue, as before, made 6 or more reads of each in that time.
        wait_for(
            lambda: (
                _requests(metrics_port).get(("get", "secrets"), 0) >= before.get(("get", "secrets"), 0) + 2
            ),
            timeout=240,
            what="two more reads of the key Secret",
            interval=1.0,
        )
        after = _requests(metrics_port)
        read = {
            resource: after.get(("get", resource), 0) - before.get(("get", resource), 0)
            for resource in ("services", "configmaps", "batch/jobs", "secrets")
        }
        assert read["services"] == read["configmaps"] == read["batch/jobs"] == 0, read
        assert read["secrets"] <= 3, read  # every 30 s, not every requeue
        for resource in ("services", "configmaps", "batch/jobs"):  # what told the reconcile instead
            assert after.get(("watch", resource), 0) >= 1, (resource, after)
    finally:
        operator.stop()


def test_the_config_map_and_service_watches_carry_names_not_data(api_client: Any, namespace: str) -> None:
    """A run's ConfigMap may hold 1 MiB of inline rows: its watch asks the API server for metadata only, and
    a deletion still arrives (the reconcile recreates from it)."""
    import asyncio

    from kubernetes import client

    from asyncrl.operator.kube import Kube, LabelWatch
    from asyncrl.workloads import names

    labels = {names.LABEL_MANAGED_BY: names.MANAGED_BY, names.LABEL_RUN: "meta"}
    core = client.CoreV1Api(api_client)
    core.create_namespaced_config_map(
        namespace,
        {"metadata": {"name": "meta-config", "labels": labels}, "data": {"run.yaml": "x" * 100_000}},
    )
    listed: list[list[dict[str, Any]]] = []
    events: list[tuple[str, dict[str, Any]]] = []

    async def watch_until_deleted() -> None:
        watch = LabelWatch(
            Kube(api_client),
            "ConfigMap",
            namespace,
            deliver=lambda event_type, item: events.append((event_type, item)),
            listed=listed.append,
        )
        watch.start()
        try:
            deadline = asyncio.get_running_loop().time() + 60
            while not listed and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.1)
            await asyncio.to_thread(core.delete_namespaced_config_map, "meta-config", namespace)
            while not any(kind == "DELETED" for kind, _ in events):
                if asyncio.get_running_loop().time() > deadline:
                    raise AssertionError(f"no DELETED event within 60 s; events: {events}")
                await asyncio.sleep(0.1)
        finally:
            watch.stop()

    asyncio.run(watch_until_deleted())
    (items,) = listed[:1]
    assert [item["metadata"]["name"] for item in items] == ["meta-config"]
    assert all("data" not in item for item in items), items[0].keys()
    assert items[0]["kind"] == "PartialObjectMetadata"
    deleted = [item for kind, item in events if kind == "DELETED"]
    assert deleted[0]["metadata"]["name"] == "meta-config"
    assert "data" not in deleted[0]
