"""The multi-node preflight's checks of the Ray cluster, on fake clusters and a fake clock.

`FakeCluster` stands in for Ray (nodes that join at given times, each node's container checks as its task
would report them), so every verdict, the wait for late workers and the deadline run in milliseconds. The
real Ray side (the join, `ray.nodes()`, the task on each node) runs in test_cluster_preflight_on_ray.py, and
through the real `asyncrl trainer` on KubeRay in tests/operator/test_kuberay_controlplane.py.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from asyncrl.trainer.failures import ClusterNotReady
from asyncrl.trainer.main import stop_on_failures
from asyncrl.trainer.preflight import Check, failures
from asyncrl.trainer.preflight_cluster import (
    ClusterAccess,
    ClusterNeeds,
    NodeRequest,
    RayCluster,
    RayJoinError,
    RayNode,
    check_ray_cluster,
)

HEAD = RayNode(node_id="a" * 40, hostname="run-ray-head", alive=True, head=True, gpus=8, cpus=96)
WORKER = RayNode(node_id="b" * 40, hostname="run-ray-worker", alive=True, head=False, gpus=8, cpus=96)
NEEDS = ClusterNeeds(
    nodes=2, gpus_per_node=8, storage_units=8, model_path="/models/m", checkpoint_dir=Path("/ckpt")
)
GOOD_NODE = (
    Check("cuda", True, "CUDA 13.0, torch 2.11.0"),
    Check("gpus", True, "8 visible, spec.trainer.gpusPerNode is 8"),
    Check("/dev/shm", True, "64.0 GiB (at least 8 GiB for 8 GPU(s))"),
    Check("model", True, "/models/m"),
    Check("checkpoints", True, "/ckpt is writable"),
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeCluster:
    clock: Clock
    joins_at: dict[RayNode, float]  # node -> when it shows up in ray.nodes()
    reports: dict[str, tuple[Check, ...] | str] = field(default_factory=dict)
    requests: list[NodeRequest] = field(default_factory=list)
    closed: bool = False

    def nodes(self) -> list[RayNode]:
        return [node for node, at in self.joins_at.items() if at <= self.clock()]

    def node_reports(
        self, nodes: Sequence[RayNode], request: NodeRequest, *, timeout_seconds: float
    ) -> Mapping[str, tuple[Check, ...] | str]:
        self.requests.append(request)
        return {node.node_id: self.reports.get(node.node_id, GOOD_NODE) for node in nodes}

    def close(self) -> None:
        self.closed = True


def access_to(cluster: RayCluster, clock: Clock, *, wait_seconds: float = 600) -> ClusterAccess:
    return ClusterAccess(
        join=lambda address, wait: cluster, wait_seconds=wait_seconds, clock=clock, sleep=clock.sleep
    )


def check(cluster: FakeCluster, needs: ClusterNeeds = NEEDS, **access: float) -> dict[str, Check]:
    checks = check_ray_cluster(
        needs, address="127.0.0.1:6379", access=access_to(cluster, cluster.clock, **access)
    )
    assert cluster.closed  # the preflight's connection never outlives it: verl joins with its own
    return {c.name: c for c in checks}


def test_a_cluster_with_every_node_passes_and_each_nodes_container_was_checked_once() -> None:
    cluster = FakeCluster(Clock(), {HEAD: 0, WORKER: 0})
    checks = check(cluster)
    assert list(checks) == [
        "ray head",
        "ray nodes",
        "ray gpus",
        "ray cpus",
        "cuda on every node",
        "gpus on every node",
        "/dev/shm on every node",
        "model on every node",
        "checkpoints on every node",
    ]
    assert all(c.ok for c in checks.values())
    assert checks["ray gpus"].detail == (
        "16 in Ray (run-ray-head (head aaaaaaaa) 8, run-ray-worker (worker bbbbbbbb) 8); "
        "verl needs 2 nodes x 8 (spec.trainer.gpusPerNode)"
    )
    assert checks["ray cpus"].detail.startswith(
        "29 needed on every node (1 for TransferQueue's controller + 4 of its 8 storage units over 2 nodes + "
        "3 x 8 GPU bundle(s))"
    )
    assert cluster.requests == [NodeRequest(gpus=8, model_path="/models/m", checkpoint_dir="/ckpt")]


def test_a_worker_that_joins_late_is_waited_for_with_progress_lines(caplog: pytest.LogCaptureFixture) -> None:
    cluster = FakeCluster(Clock(), {HEAD: 0, WORKER: 95})
    with caplog.at_level(logging.INFO, logger="asyncrl.trainer.preflight_cluster"):
        checks = check(cluster)
    assert failures(list(checks.values())) == []
    assert checks["ray nodes"].detail.startswith("2 of 2 joined")
    progress = [r.getMessage() for r in caplog.records if "Ray nodes joined" in r.getMessage()]
    assert len(progress) == 6  # one each 15 s (16 with 2 s polls) in the 95 s the worker was missing
    assert progress[0] == (
        "preflight: 1 of 2 Ray nodes joined (run-ray-head (head aaaaaaaa)); waiting for 1 more, 600 s left"
    )


def test_a_worker_that_never_joins_fails_after_the_deadline_naming_who_is_missing_as_transient() -> None:
    cluster = FakeCluster(Clock(), {HEAD: 0, WORKER: 10_000})
    checks = check(cluster, wait_seconds=120)
    assert list(checks) == ["ray head", "ray nodes"]  # nothing more is asked of half a cluster
    nodes = checks["ray nodes"]
    assert (nodes.ok, nodes.transient) == (False, True)
    assert nodes.detail == "1 of 2 joined after 120 s (run-ray-head (head aaaaaaaa)); 1 worker(s) missing"
    assert "kubectl get pods -l ray.io/node-type=worker" in nodes.fix
    assert cluster.clock() == pytest.approx(120)
    assert cluster.requests == []


def test_a_head_that_does_not_answer_fails_the_ray_head_check_as_transient() -> None:
    def unreachable(address: str, wait: float) -> RayCluster:
        raise RayJoinError(
            f"nothing answers at {address} after {wait:.0f} s (Connection refused)", "see ray-head"
        )

    clock = Clock()
    access = ClusterAccess(join=unreachable, wait_seconds=30, clock=clock, sleep=clock.sleep)
    (head,) = check_ray_cluster(NEEDS, address="127.0.0.1:6379", access=access)
    assert (head.name, head.ok, head.transient) == ("ray head", False, True)
    assert head.line() == (
        "FAIL  ray head: nothing answers at 127.0.0.1:6379 after 30 s (Connection refused); fix: see ray-head"
    )


def test_fewer_gpus_than_nodes_times_gpus_per_node_fail_as_configuration_before_any_node_task() -> None:
    short = RayNode(node_id="c" * 40, hostname="run-ray-worker", alive=True, head=False, gpus=4, cpus=96)
    cluster = FakeCluster(Clock(), {HEAD: 0, short: 0})
    checks = check(cluster)
    gpus = checks["ray gpus"]
    assert (gpus.ok, gpus.transient) == (False, False)
    assert gpus.detail.startswith(
        "12 in Ray (run-ray-head (head aaaaaaaa) 8, run-ray-worker (worker cccccccc) 4)"
    )
    assert "nvidia.com/gpu limit (spec.trainer.gpusPerNode)" in gpus.fix
    assert cluster.requests == []


def test_a_node_without_cpus_for_its_bundles_and_storage_units_fails_with_the_numbers() -> None:
    small = RayNode(node_id="d" * 40, hostname="run-ray-worker", alive=True, head=False, gpus=8, cpus=28)
    checks = check(FakeCluster(Clock(), {HEAD: 0, small: 0}))
    cpus = checks["ray cpus"]
    assert not cpus.ok
    assert "run-ray-worker (worker dddddddd) 28" in cpus.detail
    assert "raise spec.trainer.resources.limits.cpu (each Ray node's CPUs) to at least 29" in cpus.fix


def test_each_node_that_fails_its_container_checks_is_named_and_the_rest_are_summed_up() -> None:
    no_cuda = (Check("cuda", False, "torch 2.11.0 sees no CUDA device", "run on a GPU node"), *GOOD_NODE[2:])
    cluster = FakeCluster(Clock(), {HEAD: 0, WORKER: 0}, reports={WORKER.node_id: no_cuda})
    checks = check(cluster)
    assert checks["cuda on run-ray-worker (worker bbbbbbbb)"].line() == (
        "FAIL  cuda on run-ray-worker (worker bbbbbbbb): torch 2.11.0 sees no CUDA device; "
        "fix: run on a GPU node"
    )
    assert checks["cuda on run-ray-head (head aaaaaaaa)"].ok
    assert checks["model on every node"].ok
    assert not checks["cuda on run-ray-worker (worker bbbbbbbb)"].transient


def test_a_node_whose_task_does_not_answer_fails_as_transient() -> None:
    cluster = FakeCluster(Clock(), {HEAD: 0, WORKER: 0}, reports={HEAD.node_id: "no answer within 180 s"})
    failed = failures(list(check(cluster).values()))
    assert [(c.name, c.transient) for c in failed] == [("node run-ray-head (head aaaaaaaa)", True)]
    assert "its check task did not report: no answer within 180 s" in failed[0].detail


def test_only_transient_failures_restart_the_trainer_and_any_other_fails_the_run() -> None:
    """ClusterNotReady exits 1 (the container restarts and waits again); SystemExit with a message is a
    configuration error (78, the run fails at once)."""
    missing = Check("ray nodes", False, "1 of 2 joined", "see the worker pods", transient=True)
    no_cuda = Check("cuda on w", False, "no CUDA device", "run on a GPU node")
    stop_on_failures([Check("packages", True, "ok")])  # nothing failed: on to verl
    with pytest.raises(ClusterNotReady, match="1 of 2 joined"):
        stop_on_failures([missing])
    with pytest.raises(SystemExit, match="no CUDA device"):
        stop_on_failures([missing, no_cuda])
