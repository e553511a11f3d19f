"""What verl needs of a multi-node run's Ray cluster, checked by the driver before verl asks for it.

With `spec.trainer.nodes > 1`, `asyncrl trainer` is the Ray driver in the head pod, a container without GPUs
(asyncrl.workloads.ray_cluster); verl's GPUs, CPUs and /dev/shm are the Ray nodes' (the `ray-head` and
`ray-worker` containers). So the driver joins the cluster and checks there:
- the head answers at RAY_ADDRESS, then every node has joined. Workers join after the head (scheduling,
  image pulls, KubeRay's wait-gcs-ready), so the driver waits up to a deadline, logging who is missing. verl
  must not start earlier anyway: TransferQueue spreads its storage units over the nodes alive at that time;
- GPUs: verl asks for one STRICT_PACK placement group of `gpusPerNode` `{CPU: 3, GPU: 1}` bundles per node
  (verl/single_controller/ray/base.py), so `nodes` nodes must each hold `gpusPerNode` GPUs in Ray;
- CPUs: every node holds its bundles and its share of TransferQueue's actors (resources.cpus_needed_per_node);
- each node's container, through a Ray task on that node holding the node's GPUs: preflight.node_checks
  (CUDA and the GPUs it sees, /dev/shm, the model, the checkpoint folder).

What the cluster *has* (GPUs, CPUs, CUDA, volumes) is the run's configuration and fails the run; the cluster
not being *there yet* (no head, a node missing, a node whose task did not answer) is `transient`: the
driver exits to be restarted, and waits again.

Pure: the cluster is reached through `ClusterAccess` (join, clock and sleep are parameters), so the checks
are tested with fake clusters; asyncrl.trainer.preflight_ray is the real one, on Ray.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from asyncrl.trainer.backends.verl.resources import cpus_needed_per_node, describe_cpus_per_node
from asyncrl.trainer.preflight import Check

logger = logging.getLogger(__name__)

DEFAULT_WAIT_SECONDS = 600.0  # for the head and every node to join
NODE_REPORT_SECONDS = 180.0  # for every node's task: a worker process starts and imports torch
POLL_SECONDS = 2.0
PROGRESS_EVERY_SECONDS = 15.0


@dataclass(frozen=True)
class RayNode:
    """One node as Ray's GCS lists it (`ray.nodes()`)."""

    node_id: str
    hostname: str  # the raylet's host: the pod's name on Kubernetes
    alive: bool
    head: bool
    gpus: float
    cpus: float

    @property
    def label(self) -> str:
        return f"{self.hostname} ({'head' if self.head else 'worker'} {self.node_id[:8]})"


@dataclass(frozen=True)
class NodeRequest:
    """What the task on each node checks there (sent to every node; its answer is a tuple of `Check`)."""

    gpus: int
    model_path: str
    checkpoint_dir: str | None


class RayCluster(Protocol):
    def nodes(self) -> list[RayNode]: ...

    def node_reports(
        self, nodes: Sequence[RayNode], request: NodeRequest, *, timeout_seconds: float
    ) -> Mapping[str, tuple[Check, ...] | str]:
        """Each node's checks by node id, or why there are none (its task failed or did not answer)."""
        ...

    def close(self) -> None: ...


class RayJoinError(Exception):
    """The driver could not join the cluster at its address."""

    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(f"{detail}; {fix}")
        self.detail = detail
        self.fix = fix


@dataclass(frozen=True)
class ClusterNeeds:
    """What the run asks of its cluster (spec.trainer.nodes, gpusPerNode, verl's storage units)."""

    nodes: int
    gpus_per_node: int
    storage_units: int
    model_path: str
    checkpoint_dir: Path | None


@dataclass(frozen=True)
class ClusterAccess:
    """How the driver reaches the cluster: `join(address, wait_seconds)` raises RayJoinError."""

    join: Callable[[str, float], RayCluster]
    wait_seconds: float = DEFAULT_WAIT_SECONDS
    node_report_seconds: float = NODE_REPORT_SECONDS
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def check_ray_cluster(needs: ClusterNeeds, *, address: str, access: ClusterAccess) -> list[Check]:
    """The cluster's checks, in order; each stage runs only when the one before passed."""
    started = access.clock()
    try:
        cluster = access.join(address, access.wait_seconds)
    except RayJoinError as error:
        return [Check("ray head", False, error.detail, error.fix, transient=True)]
    try:
        joined = f"joined the run's Ray cluster at {address} after {access.clock() - started:.0f} s"
        checks = [Check("ray head", True, joined)]
        alive = _wait_for_nodes(cluster, needs, deadline=started + access.wait_seconds, access=access)
        checks.append(_check_nodes_joined(alive, needs, waited=access.clock() - started))
        if not checks[-1].ok:
            return checks
        checks += [_check_gpus(alive, needs), _check_cpus(alive, needs)]
        if not all(check.ok for check in checks):
            return checks
        request = NodeRequest(
            gpus=needs.gpus_per_node,
            model_path=needs.model_path,
            checkpoint_dir=None if needs.checkpoint_dir is None else str(needs.checkpoint_dir),
        )
        logger.info("preflight: checking the containers of %d Ray nodes with a task on each", len(alive))
        reports = cluster.node_reports(alive, request, timeout_seconds=access.node_report_seconds)
        return checks + _per_node_checks(alive, reports)
    finally:
        cluster.close()


def _wait_for_nodes(
    cluster: RayCluster, needs: ClusterNeeds, *, deadline: float, access: ClusterAccess
) -> list[RayNode]:
    next_progress = access.clock()
    while True:
        alive = [node for node in cluster.nodes() if node.alive]
        now = access.clock()
        if len(alive) >= needs.nodes or now >= deadline:
            return alive
        if now >= next_progress:
            logger.info(
                "preflight: %d of %d Ray nodes joined (%s); waiting for %d more, %.0f s left",
                len(alive),
                needs.nodes,
                ", ".join(node.label for node in alive) or "none",
                needs.nodes - len(alive),
                deadline - now,
            )
            next_progress = now + PROGRESS_EVERY_SECONDS
        access.sleep(min(POLL_SECONDS, max(deadline - now, 0.0)))


def _labels(nodes: Sequence[RayNode]) -> str:
    return ", ".join(node.label for node in nodes) or "none"


def _check_nodes_joined(alive: list[RayNode], needs: ClusterNeeds, *, waited: float) -> Check:
    if len(alive) >= needs.nodes:
        return Check("ray nodes", True, f"{len(alive)} of {needs.nodes} joined: {_labels(alive)}")
    return Check(
        "ray nodes",
        False,
        f"{len(alive)} of {needs.nodes} joined after {waited:.0f} s ({_labels(alive)}); "
        f"{needs.nodes - len(alive)} worker(s) missing",
        "see why the worker pods are not running: kubectl get pods -l ray.io/node-type=worker and kubectl "
        "describe pod (Pending: no node with their GPUs, or no quota; Init: wait-gcs-ready cannot reach the "
        "head); the run's status.rayCluster counts the ready workers. The restarted trainer waits again",
        transient=True,
    )


def _check_gpus(alive: list[RayNode], needs: ClusterNeeds) -> Check:
    holding = [node for node in alive if node.gpus >= needs.gpus_per_node]
    per_node = ", ".join(f"{node.label} {node.gpus:g}" for node in alive)
    detail = (
        f"{sum(node.gpus for node in alive):g} in Ray ({per_node}); verl needs {needs.nodes} nodes x "
        f"{needs.gpus_per_node} (spec.trainer.gpusPerNode)"
    )
    if len(holding) >= needs.nodes:
        return Check("ray gpus", True, detail)
    return Check(
        "ray gpus",
        False,
        detail,
        "each Ray node's GPUs are its container's nvidia.com/gpu limit (spec.trainer.gpusPerNode), which "
        "KubeRay passes to ray start --num-gpus: check the pods' limits and their nodes' GPUs",
    )


def _check_cpus(alive: list[RayNode], needs: ClusterNeeds) -> Check:
    shape = {"gpus_per_node": needs.gpus_per_node, "storage_units": needs.storage_units, "nodes": len(alive)}
    needed = cpus_needed_per_node(**shape)
    per_node = ", ".join(f"{node.label} {node.cpus:g}" for node in alive)
    detail = f"{needed} needed on every node ({describe_cpus_per_node(**shape)}); {per_node}"
    if all(node.cpus >= needed for node in alive):
        return Check("ray cpus", True, detail)
    return Check(
        "ray cpus",
        False,
        detail,
        f"raise spec.trainer.resources.limits.cpu (each Ray node's CPUs) to at least {needed}, or lower the "
        "storage units with spec.trainer.verlOverrides "
        "transfer_queue.backend.SimpleStorage.num_data_storage_units",
    )


def _per_node_checks(alive: list[RayNode], reports: Mapping[str, tuple[Check, ...] | str]) -> list[Check]:
    """One line per check name for the nodes that passed it, one per node that failed it."""
    passed: dict[str, list[tuple[RayNode, Check]]] = defaultdict(list)
    checks: list[Check] = []
    for node in alive:
        report = reports.get(node.node_id, "no report")
        if isinstance(report, str):
            checks.append(
                Check(
                    f"node {node.label}",
                    False,
                    f"its check task did not report: {report}",
                    "the task asks Ray for the node's gpusPerNode GPUs, which must be free; see the node's "
                    "Ray container log (kubectl logs POD -c ray-head or -c ray-worker)",
                    transient=True,
                )
            )
            continue
        for check in report:
            if check.ok:
                passed[check.name].append((node, check))
            else:
                checks.append(replace(check, name=f"{check.name} on {node.label}"))
    summaries = [_passed_on(name, found, total=len(alive)) for name, found in passed.items()]
    return summaries + checks


def _passed_on(name: str, found: list[tuple[RayNode, Check]], *, total: int) -> Check:
    where = "every node" if len(found) == total else _labels([node for node, _ in found])
    details = {check.detail for _, check in found}
    if len(details) == 1:
        return Check(f"{name} on {where}", True, details.pop())
    return Check(
        f"{name} on {where}", True, "; ".join(f"{node.label}: {check.detail}" for node, check in found)
    )
