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
