"""Where the verl backend's Ray comes from: a private one in the trainer pod, or the run's RayCluster.

One node (`trainer.nnodes: 1`): `ray.init()` starts Ray inside the trainer container, sized to the pod
(resources.py). More nodes: the operator built a KubeRay RayCluster whose head pod holds this trainer as the
driver (asyncrl.workloads.ray_cluster); the driver joins it at `RAY_ADDRESS` (127.0.0.1:6379, the GCS in
the same pod) and must not size or start anything itself: the cluster's resources are the nodes' own. vLLM's
replicas then run on every node, and `llm_server_manager.get_addresses()` returns each replica's pod address,
which the step loop registers with the gateway like the one-node replicas.

Pure: the decision takes verl's config and the environment, so it is tested without Ray.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_CLUSTER_ADDRESS = "127.0.0.1:6379"


@dataclass(frozen=True)
class RayConnection:
    """The arguments of `ray.init` (besides the runtime env) and what they mean, for the log."""

    address: str | None  # None: start a private Ray in this process's container
    needs_cpu_plan: bool  # a private Ray is sized to the pod (resources.plan_ray_cpus)
    init_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        if self.address is None:
            return "a private Ray in the trainer pod"
        return f"the run's Ray cluster at {self.address}"


def ray_connection(*, nnodes: int, env: Mapping[str, str]) -> RayConnection:
    """How to start or join Ray for a run of `nnodes` nodes (verl's trainer.nnodes)."""
    if nnodes <= 1:
        return RayConnection(address=None, needs_cpu_plan=True, init_kwargs={"include_dashboard": False})
    address = env.get("RAY_ADDRESS") or DEFAULT_CLUSTER_ADDRESS
    return RayConnection(address=address, needs_cpu_plan=False, init_kwargs={"address": address})
