"""The operator's per-run gauges, scraped from a real `asyncrl operator --metrics-port`."""

from __future__ import annotations

import re
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from asyncrl.testing.controlplane import ControlPlane, free_port
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for
from tests.support.kube import apply_ok, delete_run, find_run, run_manifest, start_operator_process

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]


def _series(text: str, metric: str, **labels: str) -> float | None:
    """The value of `metric` whose labels include `labels`, or None when no such series is exported."""
    for line in text.splitlines():
        found = re.fullmatch(rf"{metric}\{{(.*)\}} (\S+)", line)
        if found is None:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', found.group(1)))
        if all(have.get(key) == value for key, value in labels.items()):
            return float(found.group(2))
    return None


def test_the_operator_exports_phase_step_groups_and_age_per_run_and_forgets_a_deleted_run(
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
        apply_ok(kubectl, namespace, run_manifest("gauged"))

        def scrape() -> str:
            url = f"http://127.0.0.1:{metrics_port}/metrics"
            return str(urllib.request.urlopen(url, timeout=10).read().decode())

        run = {"namespace": namespace, "name": "gauged"}
        text = wait_for(
            lambda: (
                (t := scrape()) and _series(t, "asyncrl_run_phase", **run, phase="Succeeded") == 1.0 and t
            ),
            timeout=180,
            what="the Succeeded phase gauge",
        )
        assert _series(text, "asyncrl_run_phase", **run, phase="Running") == 0.0
        assert _series(text, "asyncrl_run_step", **run) == 1.0  # two steps: 0 and 1
        assert _series(text, "asyncrl_run_active_groups", **run) is not None
        assert _series(text, "asyncrl_run_carry_over_age_max_steps", **run) == 1.0
        # What the chart's AsyncRLRunWithoutStep alert compares with time(): the status's times, Unix seconds.
        status = (find_run(api_client, namespace, "gauged") or {})["status"]
        for metric, field in (
            ("asyncrl_run_start_timestamp_seconds", "startTime"),
            ("asyncrl_run_last_step_timestamp_seconds", "lastStepTime"),
        ):
            stamp = datetime.fromisoformat(status[field].replace("Z", "+00:00")).timestamp()
            assert _series(text, metric, **run) == stamp, (metric, status[field])
        # The reward, as REWARD and BEST show it (issue 37 item 11: the operator exported no reward).
        assert _series(text, "asyncrl_run_reward", **run) == status["reward"]["last"]
        assert _series(text, "asyncrl_run_reward_best", **run) == status["reward"]["best"]

        deleted = delete_run(kubectl, namespace, "gauged")
        assert deleted.returncode == 0, deleted.stderr
        wait_for(
            lambda: _series(scrape(), "asyncrl_run_step", **run) is None,
            timeout=60,
            what="the deleted run's series to go",
        )
        assert _series(scrape(), "asyncrl_run_phase", **run, phase="Succeeded") is None
        assert _series(scrape(), "asyncrl_run_last_step_timestamp_seconds", **run) is None
        assert _series(scrape(), "asyncrl_run_reward", **run) is None
    finally:
        operator.stop()
