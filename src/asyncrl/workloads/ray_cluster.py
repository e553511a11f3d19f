"""The trainer of a multi-node run (`spec.trainer.nodes > 1`) as a KubeRay RayCluster (pure).

Why a RayCluster and not a RayJob: a RayJob submits its entrypoint through the Ray dashboard's job API (from a
submitter Job or sidecar), so the driver would be a child of Ray's job supervisor, not a container of ours;
the gateway sidecar, the trainer's restart-in-place (the gateway and its rollout store outlive a trainer
restart) and the pod template would all work differently from a one-node run. With a RayCluster the head
pod is today's trainer pod plus one container: the trainer container is the Ray driver, exactly as in the
one-node Job, and the run (its owner) decides when the cluster goes away.

The head pod:
- `ray-head` (KubeRay's Ray container, index 0): KubeRay generates its `ray start --head --block`; it holds
  the node's GPUs (`gpusPerNode`), `trainer.resources`, the memory-backed /dev/shm and the user's trainer
  container additions (env such as NCCL_SOCKET_IFNAME, mounts of the model volume), because verl's workers
  are processes of this container's raylet;
- `trainer`: the driver, without GPUs; it reaches the raylet through the shared /tmp/ray (its sockets) and
  /dev/shm (the object store), `RAY_ADDRESS=127.0.0.1:6379`;
- the gateway native sidecar, as in the one-node pod; the gateway Service selects this pod only.
The worker group: `nodes - 1` pods with the same Ray container (GPUs, /dev/shm, checkpoints claim) and the
user's pod template (scheduling, labels such as Kueue's, volumes), labelled so the gateway Service does not
select them. The RayCluster carries the run's ownerReference; KubeRay owns the pods, so deleting the run
deletes everything.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.workloads import children, names
from asyncrl.workloads.pod_template import MergedPodTemplate
from asyncrl.workloads.trainer_state import TrainerEnd, TrainerObservation

JSON = dict[str, Any]
RAY_API_VERSION = "ray.io/v1"
RAY_CLUSTER_KIND = "RayCluster"
RAY_CLUSTER_PLURAL = "rayclusters"
RAY_GROUP = "ray.io"
RAY_HEAD_CONTAINER = "ray-head"
RAY_WORKER_CONTAINER = "ray-worker"
WORKER_GROUP = "gpu-workers"
COMPONENT_RAY_WORKER = "ray-worker"
RAY_TMP_DIR = "/tmp/ray"  # Ray's sockets, session and logs: shared by the driver and the head's raylet
RAY_GCS_PORT = 6379  # KubeRay's default head port
DRIVER_RAY_ADDRESS = f"127.0.0.1:{RAY_GCS_PORT}"
# Volumes only the head pod needs (the gateway's key); the worker pods do without them.
_HEAD_ONLY_VOLUMES = frozenset({"gateway-key"})
# Variables only the driver needs; the Ray containers do not get them.
_DRIVER_ONLY_ENV = frozenset({"ASYNCRL_GATEWAY_KEY"})
ANNOTATION_SUSPENDED_BY_RUN = names.ANNOTATION_SUSPENDED_BY_RUN


def ray_cluster(run: Mapping[str, Any], spec: AsyncTrainingRunSpec) -> tuple[JSON, MergedPodTemplate]:
    """The RayCluster of a run with `spec.trainer.nodes > 1`, and the pod template merge (what it refused)."""
    job, merged = children.trainer_job_with_template(run, spec)
    one_node_pod: JSON = job["spec"]["template"]
    head = _head_pod(one_node_pod, spec)
    worker = _worker_pod(one_node_pod, spec, run_name=run["metadata"]["name"])
    replicas = spec.trainer.nodes - 1
    cluster: JSON = {
        "apiVersion": RAY_API_VERSION,
        "kind": RAY_CLUSTER_KIND,
        "metadata": {
            "name": names.ray_cluster_name(run["metadata"]["name"]),
            "namespace": run["metadata"]["namespace"],
            # The pod template's labels too: Kueue admits a RayCluster as one gang by its own queue label.
            "labels": {
                **(head["metadata"].get("labels") or {}),
                **names.common_labels(run["metadata"]["name"], names.COMPONENT_TRAINER),
            },
            "ownerReferences": [children.owner_reference(run)],
        },
        "spec": {
            # Created suspended with its run (marked as the run's, to be resumed), or for Kueue to resume when
            # a queue is named, as for the one-node trainer Job.
            "suspend": spec.suspend or names.queue_of(head["metadata"].get("labels")) is not None,
            "enableInTreeAutoscaling": False,  # a fixed gang: verl places its workers once, at the start
            "headGroupSpec": {"rayStartParams": {}, "template": head},
            "workerGroupSpecs": [
                {
                    "groupName": WORKER_GROUP,
                    "replicas": replicas,
                    "minReplicas": replicas,
                    "maxReplicas": replicas,
                    "rayStartParams": {},
                    "template": worker,
                }
            ],
        },
    }
    if spec.suspend:
        cluster["metadata"]["annotations"] = {ANNOTATION_SUSPENDED_BY_RUN: "true"}
    return cluster, merged


def _ray_container(trainer: JSON, spec: AsyncTrainingRunSpec, *, name: str) -> JSON:
    """A Ray node's container: the trainer image, the node's GPUs and resources, the user's additions."""
    resources = children.container_resources(spec.trainer.resources)
    if spec.trainer.node_gpus:
        for section in ("limits", "requests"):
            resources.setdefault(section, {})[children.GPU_RESOURCE] = str(spec.trainer.node_gpus)
    container: JSON = {
        "name": name,
        "image": trainer["image"],
        "resources": resources,
        "env": [e for e in trainer.get("env") or [] if e["name"] not in _DRIVER_ONLY_ENV],
        "volumeMounts": [
            m for m in copy.deepcopy(trainer.get("volumeMounts") or []) if m["name"] not in _HEAD_ONLY_VOLUMES
        ],
    }
    for key in ("envFrom", "securityContext"):
        if key in trainer:
            container[key] = copy.deepcopy(trainer[key])
    _mount(container, "dshm", "/dev/shm")
    return container


def _mount(container: JSON, volume: str, path: str) -> None:
    mounts: list[JSON] = container.setdefault("volumeMounts", [])
    if not any(m["mountPath"] == path for m in mounts):
        mounts.append({"name": volume, "mountPath": path})


def _ensure_volume(pod: JSON, volume: JSON) -> None:
    volumes: list[JSON] = pod.setdefault("volumes", [])
    if not any(v["name"] == volume["name"] for v in volumes):
        volumes.append(volume)


def _head_pod(one_node_pod: JSON, spec: AsyncTrainingRunSpec) -> JSON:
    head = copy.deepcopy(one_node_pod)
    pod: JSON = head["spec"]
    trainer = next(c for c in pod["containers"] if c["name"] == children.TRAINER_CONTAINER)
    ray_head = _ray_container(trainer, spec, name=RAY_HEAD_CONTAINER)
    # The driver holds no GPUs (they belong to the raylet's workers); the user's other resources stay with the
    # Ray containers, where verl's work runs.
    trainer["resources"] = {}
    trainer["env"] = [
        *(e for e in trainer.get("env") or [] if e["name"] != "RAY_ADDRESS"),
        {"name": "RAY_ADDRESS", "value": DRIVER_RAY_ADDRESS},
    ]
    _ensure_volume(pod, {"name": "dshm", "emptyDir": {"medium": "Memory"}})
    _ensure_volume(pod, {"name": "ray-tmp", "emptyDir": {}})
    for container in (ray_head, trainer):
        _mount(container, "dshm", "/dev/shm")
        _mount(container, "ray-tmp", RAY_TMP_DIR)
    pod["containers"] = [ray_head, *pod["containers"]]  # KubeRay's Ray container is index 0
    return head


def _worker_pod(one_node_pod: JSON, spec: AsyncTrainingRunSpec, *, run_name: str) -> JSON:
    worker = copy.deepcopy(one_node_pod)
    pod: JSON = worker["spec"]
    trainer = next(c for c in pod["containers"] if c["name"] == children.TRAINER_CONTAINER)
    pod["containers"] = [_ray_container(trainer, spec, name=RAY_WORKER_CONTAINER)]
    pod.pop("initContainers", None)  # the gateway runs on the head only
    pod.pop("restartPolicy", None)  # Always: a worker whose raylet stops rejoins the cluster
    pod["volumes"] = [v for v in pod.get("volumes") or [] if v["name"] not in _HEAD_ONLY_VOLUMES]
    _ensure_volume(pod, {"name": "dshm", "emptyDir": {"medium": "Memory"}})
    metadata: JSON = worker.setdefault("metadata", {})
    # The user's labels (e.g. Kueue's queue name) stay; the component differs from the head's, so the gateway
    # Service, which selects the trainer component, never sends agents' calls to a worker.
    metadata["labels"] = {
        **(metadata.get("labels") or {}),
        **names.common_labels(run_name, COMPONENT_RAY_WORKER),
    }
    _drop_metrics_annotations(metadata)
    return worker


def _drop_metrics_annotations(metadata: JSON) -> None:
    """The trainer's Prometheus port is the driver's, on the head pod only."""
    annotations: JSON = metadata.get("annotations") or {}
    for key in children.metrics_annotations(0):
        annotations.pop(key, None)
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)


def ray_cluster_state(cluster: Mapping[str, Any] | None) -> str | None:
    """KubeRay's summary of the cluster (`status.state`: ready, suspended, ...), with its ready workers."""
    if cluster is None:
        return None
    status: Mapping[str, Any] = cluster.get("status") or {}
    state = str(status.get("state") or "pending")
    desired = status.get("desiredWorkerReplicas")
    ready = status.get("readyWorkerReplicas", 0)
    return f"{state} ({ready}/{desired} workers ready)" if desired is not None else state


# A one-node trainer Job gives up after backoffLimit 3 restarts; the driver in the head pod does the same.
DRIVER_RESTART_LIMIT = 3


def trainer_observation(cluster: Mapping[str, Any], head_pod: Mapping[str, Any] | None) -> TrainerObservation:
    """The driver's outcome as a trainer observation, read exactly as the one-node trainer Job's.

    Succeeded: the trainer container of the head pod exited 0. Failed: it failed more than
    DRIVER_RESTART_LIMIT times, or KubeRay reports the cluster failed.
    """
    suspended = bool((cluster.get("spec") or {}).get("suspend"))
    ours = ((cluster.get("metadata") or {}).get("annotations") or {}).get(
        ANNOTATION_SUSPENDED_BY_RUN
    ) == "true"
    condition = _driver_condition(cluster, head_pod) or {}
    ended = {"Complete": TrainerEnd.SUCCEEDED, "Failed": TrainerEnd.FAILED}.get(str(condition.get("type")))
    return TrainerObservation(
        ended=ended,
        reason=str(condition.get("reason") or ("Complete" if ended is TrainerEnd.SUCCEEDED else "")),
        message=str(condition.get("message") or ""),
        suspended=suspended,
        suspended_by_run=ours or not suspended,
        cluster_state=ray_cluster_state(cluster),
        queue=names.queue_of((cluster.get("metadata") or {}).get("labels")),
    )


def _driver_condition(cluster: Mapping[str, Any], head_pod: Mapping[str, Any] | None) -> JSON | None:
    status: Mapping[str, Any] = cluster.get("status") or {}
    if status.get("state") == "failed":
        reason = status.get("reason") or "KubeRay reports the RayCluster failed"
        return {"type": "Failed", "status": "True", "reason": "RayClusterFailed", "message": str(reason)}
    if head_pod is None:
        return None
    statuses = (head_pod.get("status") or {}).get("containerStatuses") or []
    driver = next((s for s in statuses if s.get("name") == "trainer"), None)
    if driver is None:
        return None
    terminated = (driver.get("state") or {}).get("terminated")
    if terminated is not None and terminated.get("exitCode") == 0:
        return {"type": "Complete", "status": "True"}
    if int(driver.get("restartCount") or 0) > DRIVER_RESTART_LIMIT:
        last = (driver.get("lastState") or {}).get("terminated") or terminated or {}
        return {
            "type": "Failed",
            "status": "True",
            "reason": "BackoffLimitExceeded",
            "message": f"the trainer (Ray driver) failed {driver.get('restartCount')} times; last exit code "
            f"{last.get('exitCode')} ({last.get('reason') or 'Error'})",
        }
    return None
