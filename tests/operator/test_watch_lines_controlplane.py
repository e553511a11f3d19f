"""`kubectl get atr -w` during a run, as a user watches it (issue 37 item 9).

Real parts: kube-apiserver, kubectl, the `asyncrl operator` process and the gateway; the stand-in trainer
and the pod runner as in the other operator tests. Before, each agent Job's start and end patched the
status (its counts are not among the default columns), so the watch printed 308 lines for 114 distinct
states on the quickstart; now counts alone are written at most every `COUNTS_MIN_INTERVAL_SECONDS`.
"""

from __future__ import annotations

import itertools
import math
import subprocess
import time
from typing import Any

import pytest

from asyncrl.operator.reconciliation.status_writes import COUNTS_MIN_INTERVAL_SECONDS
from asyncrl.testing.podrunner import PodRunner
from tests.operator.conftest import OperatorStarter
from tests.support.kube import apply_ok, run_manifest, run_status, wait_for_phase

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]


def test_kubectl_get_w_prints_a_line_per_visible_change_not_per_agent_job(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    start_operator()
    # 4 steps of 4 rollouts: 16 agent Jobs, each of which changed the counts twice (started, finished).
    manifest = run_manifest("watched", totalSteps=4, rollout={"samplesPerPrompt": 4})
    watch = subprocess.Popen(
        [*kubectl, "-n", namespace, "get", "atr", "--watch", "--output-watch-events"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        started = time.monotonic()
        apply_ok(kubectl, namespace, manifest)
        ended = wait_for_phase(
            api_client, namespace, "watched", "Succeeded", "Failed", timeout=300, what="the run to end"
        )
        seconds = time.monotonic() - started
    finally:
        watch.terminate()
        output, _ = watch.communicate(timeout=30)
    assert ended["phase"] == "Succeeded", ended
    assert run_status(api_client, namespace, "watched")["progress"] == "4/4"
    lines = [line.split() for line in output.splitlines() if line.split()[:1] in (["ADDED"], ["MODIFIED"])]
    assert lines, output
    # EVENT NAME PHASE STEPS REWARD ACTIVE CARRY-OVER MAX-AGE DRAIN AGE: the age is the only column that
    # changes on its own; a line whose other columns repeat the previous line's shows the user nothing new.
    shown = [tuple(line[1:-1]) for line in lines]
    repeats = sum(1 for before, after in itertools.pairwise(shown) if before == after)
    distinct = len(shown) - repeats
    allowed = math.ceil(seconds / COUNTS_MIN_INTERVAL_SECONDS) + 2
    print(f"{len(lines)} lines, {distinct} changes, {repeats} repeats in {seconds:.0f} s\n{output}")
    assert repeats <= allowed, f"{repeats} lines repeat the one before (at most {allowed}):\n{output}"
