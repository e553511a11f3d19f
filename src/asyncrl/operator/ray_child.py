"""The I/O of a multi-node run's RayCluster: create it (create-or-get), check its checkpoint claim, read it.

KubeRay is an optional prerequisite: a cluster without its CRD answers 404 for `rayclusters.ray.io`, which is
a fact about the cluster, not a passing error; the run is failed with what to install (or `nodes: 1`) instead
of being retried forever. The checkpoint claim must be ReadWriteMany (every node writes its checkpoint shard);
the CEL rule can only demand that a claim is named, so its access modes are checked here, once it exists.
The manifest itself is built by `ray_cluster.py` (pure).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.operator import names
from asyncrl.operator.controller import RunController
from asyncrl.operator.kube import Kube
from asyncrl.operator.ray_cluster import (
    RAY_API_VERSION,
    RAY_CLUSTER_PLURAL,
    RAY_GROUP,
    ray_cluster,
    ray_cluster_state,
    suspend_patch,
    trainer_view,
)
from asyncrl.operator.retry import kube_error_is_transient, one_line_reason

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
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        await asyncio.to_thread(
            kube.custom.create_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            RAY_CLUSTER_PLURAL,
            body,
        )
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
        pvc = await asyncio.to_thread(kube.core.read_namespaced_persistent_volume_claim, claim, namespace)
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
    modes = list((pvc.spec.access_modes if pvc.spec is not None else None) or [])
    if RWX not in modes:
        raise RayClusterRejected(
            f"spec.trainer.checkpoint.claimName: the claim {claim!r} has access modes {modes}, and "
            f"spec.trainer.nodes > 1 needs {RWX} (every Ray node writes its checkpoint shard to it): "
            f"create a {RWX} claim (NFS, CephFS, a cloud file store) and name it in a new run"
        )


async def read_ray_cluster(kube: Kube, namespace: str, run_name: str) -> JSON | None:
    """The run's RayCluster as stored, or None when absent (or KubeRay is not installed)."""
    from kubernetes.client.exceptions import ApiException

    try:
        cluster: JSON = await asyncio.to_thread(
            kube.custom.get_namespaced_custom_object,
            RAY_GROUP,
            RAY_VERSION,
            namespace,
            RAY_CLUSTER_PLURAL,
            names.ray_cluster_name(run_name),
        )
    except ApiException as error:
        if error.status == 404:
            return None
        raise
    return cluster


async def ray_cluster_summary(kube: Kube, namespace: str, run_name: str) -> str | None:
    """KubeRay's state of the run's cluster in one line, for the run's status; None when there is none."""
    return ray_cluster_state(await read_ray_cluster(kube, namespace, run_name))


FOLLOW_SECONDS = 5.0


async def follow_ray_cluster(kube: Kube, controller: RunController, *, namespace: str, run_name: str) -> None:
    """Until cancelled: KubeRay's state into the run's status, the driver's outcome into the controller as a
    trainer-Job view (ray_cluster.trainer_view), and the cluster suspended while the run is suspended or once
    the driver has finished (a RayCluster, unlike a finished Job's pod, would keep its GPUs)."""
    cluster_name = names.ray_cluster_name(run_name)
    selector = f"ray.io/cluster={cluster_name},ray.io/node-type=head"
    while True:
        try:
            cluster = await read_ray_cluster(kube, namespace, run_name)
            if cluster is not None:
                pods = await asyncio.to_thread(
                    kube.core.list_namespaced_pod, namespace, label_selector=selector, _preload_content=False
                )
                items = json.loads(pods.data).get("items") or []
                head = items[0] if items else None
                view = trainer_view(cluster, head)
                controller.ray_cluster = ray_cluster_state(cluster)
                controller.on_job_event("SYNC", view)
                # The driver ended, or the run failed for a reason of its own (a template, the spec, a
                # permanent failure the trainer reported before exiting: its restarts would hold every GPU).
                finished = bool(view["status"].get("conditions")) or controller.stopped_for_failure
                patch = suspend_patch(
                    cluster, run_suspended=bool(controller.context.spec.suspend), finished=finished
                )
                if patch is not None:
                    await asyncio.to_thread(
                        kube.custom.patch_namespaced_custom_object,
                        RAY_GROUP,
                        RAY_VERSION,
                        namespace,
                        RAY_CLUSTER_PLURAL,
                        cluster_name,
                        patch,
                    )
                    logger.info("run %s: RayCluster %s: %s", run_name, cluster_name, patch)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # the API server may be briefly unreachable; the next round retries
            logger.warning("run %s: reading its RayCluster failed: %s", run_name, one_line_reason(error))
        await asyncio.sleep(FOLLOW_SECONDS)
