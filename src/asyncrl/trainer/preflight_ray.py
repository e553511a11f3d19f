"""The real Ray side of the multi-node preflight (asyncrl.trainer.preflight_cluster): wait for the head's
port, join the cluster, list its nodes, and run the container checks on each node with a Ray task.

`ray.init(address=...)` with nothing at the address retries for minutes without a word, so the driver first
waits for the GCS port itself, with a deadline and progress lines (the head's `ray-head` container starts
beside the driver). The task on each node asks for the node's GPUs (`num_gpus=gpusPerNode`, pinned to the
node): it sees what verl's workers there will see (Ray sets CUDA_VISIBLE_DEVICES to its GPUs), needs none of
the node's CPUs, and its worker process exits after it (`max_calls=1`), so no CUDA state stays behind. The
preflight's connection is closed before verl joins with its own runtime environment.

A head lost after the join is Ray's to report: its driver waits for the GCS and, after 60 s, Ray ends the
process ("Failed to connect to GCS within 60 seconds"), exit 1; the trainer container is restarted.

I/O only; the decisions are in preflight_cluster.py. It sits beside the preflight, not in backends/verl: the
preflight reads the backends (verl's resource plan), so the backends import no preflight.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from asyncrl.trainer.preflight import Check, node_checks
from asyncrl.trainer.preflight_cluster import NodeRequest, RayJoinError, RayNode

logger = logging.getLogger(__name__)

PROGRESS_EVERY_SECONDS = 15.0
HEAD_FIX = (
    "the head pod's ray-head container runs Ray's GCS there (kubectl logs POD -c ray-head); RAY_ADDRESS "
    "names it (the operator sets 127.0.0.1:6379)"
)


def join(address: str, wait_seconds: float) -> RayClusterOnRay:
    """The run's cluster at `address` (host:port of the GCS), once its port answers; RayJoinError if not."""
    _wait_for_port(address, wait_seconds)
    try:
        import ray
    except ImportError as error:
        raise RayJoinError(f"cannot import ray ({error})", "use the trainer image") from error
    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except Exception as error:  # Ray raises ConnectionError, RuntimeError (version mismatch), ...
        raise RayJoinError(
            f"ray.init could not join {address}: {type(error).__name__}: {_first_line(error)}",
            "the trainer container shares /tmp/ray (the raylet's sockets) with ray-head and runs the same "
            f"Ray and Python; {HEAD_FIX}",
        ) from error
    return RayClusterOnRay()


def _wait_for_port(address: str, wait_seconds: float) -> None:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return  # not host:port (e.g. "auto"): ray.init finds the cluster its own way
    started = time.monotonic()
    next_progress = started + PROGRESS_EVERY_SECONDS
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2.0):
                return
        except OSError as error:
            waited = time.monotonic() - started
            if waited >= wait_seconds:
                raise RayJoinError(
                    f"nothing answers at {address} after {waited:.0f} s ({error.strerror or error})", HEAD_FIX
                ) from error
            if time.monotonic() >= next_progress:
                logger.info(
                    "preflight: waiting for the Ray head at %s; %.0f s left", address, wait_seconds - waited
                )
                next_progress = time.monotonic() + PROGRESS_EVERY_SECONDS
            time.sleep(1.0)


class RayClusterOnRay:
    """A `preflight_cluster.RayCluster` on the `ray` this process joined."""

    def nodes(self) -> list[RayNode]:
        import ray

        return [_ray_node(node) for node in ray.nodes()]  # type: ignore[no-untyped-call]

    def node_reports(
        self, nodes: Sequence[RayNode], request: NodeRequest, *, timeout_seconds: float
    ) -> Mapping[str, tuple[Check, ...] | str]:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0, max_calls=1)(checks_on_this_node)
        refs = {
            node.node_id: task.options(
                num_gpus=request.gpus,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
                name="asyncrl-preflight",
            ).remote(request)
            for node in nodes
        }
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_seconds)
        reports: dict[str, tuple[Check, ...] | str] = {}
        for node_id, ref in refs.items():
            if ref not in ready:
                ray.cancel(ref, force=True)
                reports[node_id] = f"no answer within {timeout_seconds:.0f} s"
                continue
            try:
                reports[node_id] = ray.get(ref)
            except ray.exceptions.RayError as error:
                reports[node_id] = f"{type(error).__name__}: {_first_line(error)}"
        return reports

    def close(self) -> None:
        import ray

        ray.shutdown()


def checks_on_this_node(request: NodeRequest) -> tuple[Check, ...]:
    """Runs on a Ray node, in its container (the trainer image, as the driver's)."""
    checkpoint_dir = None if request.checkpoint_dir is None else Path(request.checkpoint_dir)
    return tuple(node_checks(gpus=request.gpus, model_path=request.model_path, checkpoint_dir=checkpoint_dir))


def _ray_node(node: Mapping[str, Any]) -> RayNode:
    resources: Mapping[str, float] = node.get("Resources") or {}
    return RayNode(
        node_id=str(node["NodeID"]),
        hostname=str(node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or "?"),
        alive=bool(node.get("Alive")),
        head="node:__internal_head__" in resources,
        gpus=float(resources.get("GPU", 0.0)),
        cpus=float(resources.get("CPU", 0.0)),
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
