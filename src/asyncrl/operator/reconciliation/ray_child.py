"""The I/O of a multi-node run's RayCluster: create it (create-or-get), check its checkpoint claim, read it.

KubeRay is an optional prerequisite: a cluster without its CRD answers 404 for `rayclusters.ray.io`, which is
a fact about the cluster, not a passing error; the run is failed with what to install (or `nodes: 1`) instead
of being retried forever. The checkpoint claim must be ReadWriteMany (every node writes its checkpoint shard);
the CEL rule can only demand that a claim is named, so its access modes are checked here, once it exists.
The manifest itself is built by `workloads/ray_cluster.py` (pure).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.operator.kube import Kube
from asyncrl.operator.retry import kube_error_is_transient, one_line_reason
from asyncrl.workloads import names
from asyncrl.workloads.ray_cluster import (
    RAY_API_VERSION,
    RAY_CLUSTER_PLURAL,
    RAY_GROUP,
    ray_cluster,
    trainer_observation,
)
from asyncrl.workloads.trainer_state import TrainerObservation

logger = logging.getLogger(__name__)

JSON = dict[str, Any]
RAY_VERSION = RAY_API_VERSION.split("/")[1]
KUBERAY_MISSING = (
    "spec.trainer.nodes > 1 runs the trainer on a KubeRay RayCluster, and this cluster has no RayCluster "
    "CRD (rayclusters.ray.io/v1): install KubeRay (>= 1.4, see docs/multi-node.md), enable "
    "kuberay.enabled in the operator's chart values (its RBAC), and create the run again; or set "
    "spec.trainer.nodes: 1"
)
KUBERAY_FORBIDDEN = (
    "spec.trainer.nodes > 1 runs the trainer on a KubeRay RayCluster, and the operator's service account "
    "may not {what}: install the operator's chart with kuberay.enabled=true (or apply "
    "operator/rbac/kuberay.yaml) with KubeRay installed (docs/multi-node.md), and create the run again; or "
    "set spec.trainer.nodes: 1"
)
RWX = "ReadWriteMany"


class ClaimMissing(Exception):
    """The checkpoint claim does not exist yet: the run waits for it (the user may create it later)."""


class RayClusterRejected(Exception):
    """The RayCluster cannot be created for good (KubeRay missing, a refused spec, a wrong claim)."""


@dataclass(frozen=True)
class RayClusterCreation:
    created: bool
    refused: str | None  # the pod template fields the operator kept its own value of
    warnings: list[str]


async def create_ray_cluster(
    kube: Kube, run: Mapping[str, Any], spec: AsyncTrainingRunSpec
) -> RayClusterCreation:
    """Create the run's RayCluster unless it exists; RayClusterRejected when it never can be."""
    from kubernetes.client.exceptions import ApiException

    await _check_checkpoint_claim(kube, run, spec)
    body, merged = ray_cluster(run, spec)
    name = body["metadata"]["name"]
    try:
        await kube.create_custom(RAY_GROUP, RAY_VERSION, RAY_CLUSTER_PLURAL, body)
    except ApiException as error:
        if error.status == 409:
            return RayClusterCreation(created=False, refused=merged.refused_message(), warnings=[])
        if error.status == 404:
            raise RayClusterRejected(KUBERAY_MISSING) from error
        if error.status == 403:
            raise RayClusterRejected(KUBERAY_FORBIDDEN.format(what="create RayClusters")) from error
        if not kube_error_is_transient(error):
            raise RayClusterRejected(
                f"the API server refused the RayCluster: {one_line_reason(error)}; fix spec.trainer "
                "(podTemplate, resources, image) in a new run"
            ) from error
        raise
    logger.info("run %s: created RayCluster %s", run["metadata"]["name"], name)
    return RayClusterCreation(created=True, refused=merged.refused_message(), warnings=[])


async def _check_checkpoint_claim(kube: Kube, run: Mapping[str, Any], spec: AsyncTrainingRunSpec) -> None:
    """A claim that exists and cannot be mounted by several nodes fails the run; a missing one is waited for
    (the caller retries: the user may create it after the run)."""
    claim = spec.trainer.checkpoint.claim_name
    if claim is None:  # refused at admission; kept for a run stored before the rule
        raise RayClusterRejected("spec.trainer.nodes > 1 needs spec.trainer.checkpoint.claimName")
    from kubernetes.client.exceptions import ApiException

    namespace = run["metadata"]["namespace"]
    try:
        pvc = await kube.read_claim(namespace, claim)
    except ApiException as error:
        if error.status == 404:
            raise ClaimMissing(
                f"spec.trainer.checkpoint.claimName: waiting for the PersistentVolumeClaim {claim!r} in "
                f"namespace {namespace!r}; create it ({RWX}) and the run starts"
            ) from error
        if error.status == 403:
            raise RayClusterRejected(
                KUBERAY_FORBIDDEN.format(
                    what="read PersistentVolumeClaims (the checkpoint claim's access modes)"
                )
            ) from error
        raise
    modes = list((pvc.get("spec") or {}).get("accessModes") or [])
    if RWX not in modes:
        raise RayClusterRejected(
            f"spec.trainer.checkpoint.claimName: the claim {claim!r} has access modes {modes}, and "
            f"spec.trainer.nodes > 1 needs {RWX} (every Ray node writes its checkpoint shard to it): "
            f"create a {RWX} claim (NFS, CephFS, a cloud file store) and name it in a new run"
        )


async def read_ray_cluster(kube: Kube, namespace: str, run_name: str) -> JSON | None:
    """The run's RayCluster as stored, or None when absent (or KubeRay is not installed)."""
    return await kube.read_custom(
        RAY_GROUP, RAY_VERSION, RAY_CLUSTER_PLURAL, namespace, names.ray_cluster_name(run_name)
    )


async def read_trainer(
    kube: Kube, namespace: str, run_name: str, *, forbidden_as_absent: bool = False
) -> TrainerObservation | None:
    """The multi-node trainer as observed: its RayCluster and the driver in the head pod; None when the
    cluster does not exist. `forbidden_as_absent`: a 403 (no KubeRay RBAC) reads as no cluster, for a run
    whose trainer was never seen: its creation is then tried, and says why it cannot be (`KUBERAY_FORBIDDEN`).
    """
    from kubernetes.client.exceptions import ApiException

    try:
        cluster = await read_ray_cluster(kube, namespace, run_name)
    except ApiException as error:
        if forbidden_as_absent and error.status == 403:
            return None
        raise
    if cluster is None:
        return None
    selector = f"ray.io/cluster={names.ray_cluster_name(run_name)},ray.io/node-type=head"
    pods = await kube.list_pods(namespace, selector)
    return trainer_observation(cluster, pods[0] if pods else None)


async def patch_ray_cluster(kube: Kube, namespace: str, run_name: str, patch: JSON) -> None:
    await kube.patch_custom(
        RAY_GROUP, RAY_VERSION, RAY_CLUSTER_PLURAL, namespace, names.ray_cluster_name(run_name), patch
    )
