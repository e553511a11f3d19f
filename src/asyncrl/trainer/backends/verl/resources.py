"""How many CPUs Ray may use in the trainer pod, and whether verl's bundles fit in them.

`ray.init()` without `num_cpus` counts the node's CPUs, not the pod's CPU limit; verl then asks for
placement groups that the pod cannot run and `pg.ready()` waits forever. What verl 0.9.1 reserves: one CPU
for TransferQueue's controller and one per storage unit (`num_cpus=1` each, 8 units by verl's default
config), and one bundle of `{CPU: 3, GPU: 1}` per GPU (`ResourcePoolManager.max_colocate_count`). Ray is
therefore started with the pod's limit, and a pod that cannot hold the bundles is refused with the numbers.

Pure apart from reading the cgroup files (their root is a parameter, so tests use a temporary one).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CPUS_PER_GPU_BUNDLE = 3  # verl's ResourcePoolManager.max_colocate_count
TRANSFER_QUEUE_CONTROLLER_CPUS = 1
DEFAULT_STORAGE_UNITS = 8  # verl's transfer_queue.backend.SimpleStorage.num_data_storage_units


class RayResourcesError(RuntimeError):
    """The pod cannot hold verl's Ray bundles; the message names the numbers and the fix."""

    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(f"{detail}. {fix}")
        self.detail = detail
        self.fix = fix


@dataclass(frozen=True)
class RayCpuPlan:
    needed: int  # CPUs verl's actors and bundles reserve
    available: int  # CPUs Ray is started with
    limit_source: str  # where `available` comes from (the cgroup's limit, or the node's CPU count)

    def describe(self) -> str:
        return f"{self.needed} CPUs needed, {self.available} available ({self.limit_source})"


def cpus_needed(*, gpus: int, storage_units: int) -> int:
    return TRANSFER_QUEUE_CONTROLLER_CPUS + storage_units + CPUS_PER_GPU_BUNDLE * gpus


def cpus_needed_per_node(*, gpus_per_node: int, storage_units: int, nodes: int) -> int:
    """CPUs every node of a multi-node cluster must hold: its placement group of `gpus_per_node` bundles
    (verl asks for one STRICT_PACK group per node), its share of TransferQueue's storage units (spread
    round-robin over the alive nodes: transfer_queue/utils/common.py) and the controller, which may land on
    any node."""
    share = math.ceil(storage_units / max(nodes, 1))
    return TRANSFER_QUEUE_CONTROLLER_CPUS + share + CPUS_PER_GPU_BUNDLE * gpus_per_node


def describe_cpus_per_node(*, gpus_per_node: int, storage_units: int, nodes: int) -> str:
    share = math.ceil(storage_units / max(nodes, 1))
    return (
        f"{TRANSFER_QUEUE_CONTROLLER_CPUS} for TransferQueue's controller + {share} of its {storage_units} "
        f"storage units over {nodes} nodes + {CPUS_PER_GPU_BUNDLE} x {gpus_per_node} GPU bundle(s)"
    )


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU limit of this container (cgroup v2 `cpu.max`, else v1 CFS quota), or None when unlimited."""
    v2 = root / "cpu.max"
    if v2.is_file():
        quota, _, period = v2.read_text().strip().partition(" ")
        if quota == "max":
            return None
        return int(quota) / int(period or "100000")
    quota_file, period_file = root / "cpu" / "cpu.cfs_quota_us", root / "cpu" / "cpu.cfs_period_us"
    if quota_file.is_file() and period_file.is_file():
        quota_us = int(quota_file.read_text().strip())
        if quota_us <= 0:
            return None
        return quota_us / int(period_file.read_text().strip())
    return None


def plan_ray_cpus(
    *, gpus: int, storage_units: int, cgroup_root: Path = Path("/sys/fs/cgroup"), node_cpus: int | None = None
) -> RayCpuPlan:
    """Ray's `num_cpus` for this pod; RayResourcesError when verl's reservations cannot fit in it."""
    needed = cpus_needed(gpus=gpus, storage_units=storage_units)
    limit = cgroup_cpu_limit(cgroup_root)
    node = node_cpus if node_cpus is not None else (os.cpu_count() or 1)
    if limit is not None and limit < node:
        available, source = math.floor(limit), f"the pod's CPU limit {limit:g}"
    else:
        available, source = node, "the node's CPU count"
    plan = RayCpuPlan(needed=needed, available=available, limit_source=source)
    if available < needed:
        raise RayResourcesError(
            f"verl cannot place its Ray actors in this pod: {plan.describe()}; it needs "
            f"{TRANSFER_QUEUE_CONTROLLER_CPUS} for TransferQueue's controller + {storage_units} for its "
            f"storage units + {CPUS_PER_GPU_BUNDLE} x {gpus} GPU(s)",
            f"raise spec.trainer.resources.limits.cpu to at least {needed}, or lower the storage units "
            "with spec.trainer.verlOverrides transfer_queue.backend.SimpleStorage.num_data_storage_units",
        )
    return plan


def storage_units_of(config: Any) -> int:
    """TransferQueue's storage units in verl's config (`transfer_queue.backend.SimpleStorage...`)."""
    try:
        return int(config.transfer_queue.backend.SimpleStorage.num_data_storage_units)
    except (AttributeError, KeyError, TypeError, ValueError):
        return DEFAULT_STORAGE_UNITS
