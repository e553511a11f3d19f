"""Agent pods that cannot start show on the run, and the run fails when none ever starts (issue 37 item 6).

Before, a run whose agent image did not exist stayed Running, "training", Ready=True, at 0 steps, for the 7
minutes watched; nothing on the run said that its pods could not pull, and it could not fail before
`rolloutTimeoutSeconds` (30 minutes by default).

Real parts: kube-apiserver, the Job controller, the `asyncrl operator` process, the gateway. Stand-in: the pod
runner for the kubelet, which answers an image it does not have with the kubelet's ErrImageNeverPull
(tests/node/test_cluster_quickstart.py meets a real image pull failure on the real node).
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from asyncrl.testing.controlplane import ControlPlane
from asyncrl.testing.podrunner import PodRunner
from asyncrl.testing.waiting import wait_for
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    AGENT_IMAGE,
    AGENT_TEMPLATE,
    apply_ok,
    events,
    run_manifest,
    run_status,
    status_condition,
    wait_for_phase,
)

pytestmark = [pytest.mark.controlplane, pytest.mark.slow]

MISSING_IMAGE = "ghcr.io/asyncrl/agnet:0.1.0"
START_TIMEOUT_SECONDS = 20


def test_an_agent_image_that_cannot_be_pulled_is_named_on_the_run_and_fails_it(
    control_plane: ControlPlane,
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    start_operator(f"--agent-start-timeout-seconds={START_TIMEOUT_SECONDS}")
    assert AGENT_IMAGE in AGENT_TEMPLATE
    manifest = run_manifest("typo", template=AGENT_TEMPLATE.replace(AGENT_IMAGE, MISSING_IMAGE))
    apply_ok(kubectl, namespace, manifest)

    def stuck_condition() -> dict[str, Any] | None:
        condition = status_condition(run_status(api_client, namespace, "typo"), "AgentPodsStarting")
        return condition if condition is not None and condition["status"] == "False" else None

    # Shown within a minute of the pods: the condition with the kubelet's reason, the image and a pod.
    condition = wait_for(stuck_condition, timeout=120, what="the AgentPodsStarting=False condition")
    assert condition["reason"] == "ErrImageNeverPull", condition
    assert MISSING_IMAGE in condition["message"], condition
    assert "pod typo-r-" in condition["message"], condition
    (warning, *_) = wait_for(
        lambda: events(kubectl, namespace, reason="AgentPodCannotStart"),
        timeout=60,
        what="the AgentPodCannotStart event",
    )
    assert warning["type"] == "Warning"
    assert MISSING_IMAGE in warning["note"]
    summary = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "runs", "summary", "typo", "-n", namespace],
        capture_output=True,
        text=True,
        timeout=120,
        env={"KUBECONFIG": str(control_plane.kubeconfig), "PATH": "/usr/bin:/bin"},
    )
    assert summary.returncode == 0, summary.stderr
    assert "AgentPodsStarting=False (ErrImageNeverPull)" in summary.stdout, summary.stdout

    # No agent pod of the run ever started: failed after the start timeout, not the rollout timeout.
    status = wait_for_phase(api_client, namespace, "typo", "Failed", timeout=180, what="the run to fail")
    assert f"no agent pod of this run started within {START_TIMEOUT_SECONDS} s" in status["message"]
    assert MISSING_IMAGE in status["message"]
    assert events(kubectl, namespace, reason="AgentPodsCannotStart")
