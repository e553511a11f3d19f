"""Multi-node runs where KubeRay is absent, on the real control plane with a real operator process.

KubeRay is an optional prerequisite: a run with `trainer.nodes > 1` in a cluster without the RayCluster CRD
must fail once with what to install, not retry forever; a `nodes: 1` run must not notice KubeRay at all.
(The run with KubeRay itself: tests/operator/test_kuberay_controlplane.py, on its own control plane.)
"""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.testing.podrunner import PodRunner
from asyncrl.workloads import names
from tests.operator.conftest import OperatorStarter
from tests.support.kube import (
    apply_ok,
    create_claim,
    events,
    multi_node_manifest,
    run_manifest,
    run_status,
    trainer_job,
    wait_for_phase,
    wait_for_trainer_job,
)

pytestmark = [pytest.mark.controlplane]


def test_without_kuberay_a_multi_node_run_fails_once_with_what_to_install_and_a_one_node_run_works(
    api_client: Any,
    pod_runner: PodRunner,
    namespace: str,
    kubectl: list[str],
    start_operator: OperatorStarter,
) -> None:
    from kubernetes import client

    start_operator()
    create_claim(api_client, namespace, "shared", "ReadWriteMany")
    apply_ok(kubectl, namespace, multi_node_manifest("multi", claim="shared"))
    apply_ok(kubectl, namespace, run_manifest("single"))

    status = wait_for_phase(api_client, namespace, "multi", "Failed", timeout=120, what="multi Failed")
    assert "no RayCluster CRD" in status["message"]
    assert "install KubeRay" in status["message"]
    assert "spec.trainer.nodes: 1" in status["message"]
    assert trainer_job(api_client, namespace, "multi") is None  # no one-node fallback behind the user's back

    # The one-node run in the same namespace is untouched by KubeRay's absence: its trainer Job runs.
    wait_for_trainer_job(api_client, namespace, "single", timeout=120, what="single's trainer Job")
    wait_for_phase(
        api_client, namespace, "single", "Running", "Succeeded", timeout=240, what="single Running"
    )
    assert "rayCluster" not in run_status(api_client, namespace, "single")

    # No crash loop: one Warning, and a restarted operator leaves the failed run alone.
    assert len(events(kubectl, namespace, reason="RayClusterRejected")) == 1
    assert not events(kubectl, namespace, reason="ReconcileError")
    start_operator()
    wait_for_phase(
        api_client,
        namespace,
        "single",
        "Running",
        "Succeeded",
        timeout=120,
        what="single still Running after the restart",
    )
    assert len(events(kubectl, namespace, reason="RayClusterRejected")) == 1
    pods = client.CoreV1Api(api_client).list_namespaced_pod(
        namespace, label_selector=f"{names.LABEL_RUN}=multi"
    )
    assert pods.items == []


def test_a_checkpoint_claim_only_one_node_can_mount_fails_the_run_naming_read_write_many(
    api_client: Any, namespace: str, kubectl: list[str], start_operator: OperatorStarter
) -> None:
    start_operator()
    create_claim(api_client, namespace, "single-node", "ReadWriteOnce")
    apply_ok(kubectl, namespace, multi_node_manifest("multi", claim="single-node"))
    status = wait_for_phase(api_client, namespace, "multi", "Failed", timeout=120, what="multi Failed")
    assert "spec.trainer.checkpoint.claimName" in status["message"]
    assert "ReadWriteMany" in status["message"]
    assert "ReadWriteOnce" in status["message"]


def test_a_multi_node_run_waits_for_its_missing_checkpoint_claim_saying_so_then_goes_on(
    api_client: Any, namespace: str, kubectl: list[str], start_operator: OperatorStarter
) -> None:
    """The user may create the claim after the run: the run says what it waits for, and goes on once it
    exists (here to the next check, KubeRay's absence on this control plane)."""
    start_operator()
    apply_ok(kubectl, namespace, multi_node_manifest("multi", claim="later"))
    status = wait_for_phase(api_client, namespace, "multi", "Pending", timeout=120, what="multi Pending")
    assert status["message"] == (
        f"spec.trainer.checkpoint.claimName: waiting for the PersistentVolumeClaim 'later' in namespace "
        f"{namespace!r}; create it (ReadWriteMany) and the run starts"
    )
    assert events(kubectl, namespace, reason="WaitingForClaim")
    assert not events(kubectl, namespace, reason="ReconcileError")

    create_claim(api_client, namespace, "later", "ReadWriteMany")
    status = wait_for_phase(api_client, namespace, "multi", "Failed", timeout=120, what="multi Failed")
    assert "no RayCluster CRD" in status["message"]
