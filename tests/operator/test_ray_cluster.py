"""A multi-node run's RayCluster as a manifest: the head pod is the one-node trainer pod plus the Ray head,
the worker group holds nodes - 1 GPU pods with the user's template, and the run owns it all."""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.api import InvalidRunError, load_run
from asyncrl.workloads import children, names
from asyncrl.workloads.names import ANNOTATION_SUSPENDED_BY_RUN
from asyncrl.workloads.ray_cluster import (
    COMPONENT_RAY_WORKER,
    DRIVER_RAY_ADDRESS,
    RAY_HEAD_CONTAINER,
    RAY_TMP_DIR,
    ray_cluster,
    ray_cluster_state,
    trainer_observation,
)
from tests.support.kube import run_manifest

MULTI_NODE: dict[str, Any] = {
    "backend": "Verl",
    "nodes": 3,
    "gpusPerNode": 8,
    "checkpoint": {"claimName": "shared-ckpt"},
    "resources": {"limits": {"cpu": "32", "memory": "256Gi"}},
}


def _run(**trainer: Any) -> tuple[dict[str, Any], Any]:
    # 12 groups x 2 rows divide over verl's 24 (or 12) data-parallel ranks, as loading the run requires.
    manifest = run_manifest(
        "demo",
        trainer={**MULTI_NODE, **trainer},
        trainBatchSize=12,
        **{"async": {"enabled": True, "windowSize": 24}},
    )
    manifest["metadata"].update(namespace="team", uid="uid-1")
    return manifest, load_run(manifest).spec


def _containers(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in pod["spec"]["containers"]}


def test_the_head_pod_is_the_one_node_pod_with_the_ray_head_first_and_a_gpu_less_driver() -> None:
    run, spec = _run()
    cluster, _ = ray_cluster(run, spec)
    head = cluster["spec"]["headGroupSpec"]["template"]
    assert [c["name"] for c in head["spec"]["containers"]] == [RAY_HEAD_CONTAINER, children.TRAINER_CONTAINER]
    (gateway,) = head["spec"]["initContainers"]
    assert gateway["name"] == "gateway"
    assert gateway["restartPolicy"] == "Always"
    containers = _containers(head)
    ray_head, driver = containers[RAY_HEAD_CONTAINER], containers[children.TRAINER_CONTAINER]
    assert ray_head["resources"]["limits"] == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}
    assert ray_head["resources"]["requests"] == {"nvidia.com/gpu": "8"}
    assert "command" not in ray_head  # KubeRay generates `ray start --head --block`
    assert driver["resources"] == {}  # a GPU limit here would take 8 more GPUs from the node
    assert driver["command"] == ["asyncrl", "trainer"]
    assert {"name": "RAY_ADDRESS", "value": DRIVER_RAY_ADDRESS} in driver["env"]
    for container in (ray_head, driver):  # the driver reaches the raylet's sockets and the object store
        assert {"name": "ray-tmp", "mountPath": RAY_TMP_DIR} in container["volumeMounts"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert {"name": "checkpoints", "mountPath": children.CHECKPOINT_DIR} in container["volumeMounts"]
    assert not [e for e in ray_head["env"] if e["name"] == "ASYNCRL_GATEWAY_KEY"]
    # The gateway Service selects the trainer component: the head pod.
    selector = children.gateway_service(run, spec)["spec"]["selector"]
    assert selector.items() <= head["metadata"]["labels"].items()


def test_the_worker_group_has_nodes_minus_one_gpu_pods_that_the_gateway_service_does_not_select() -> None:
    run, spec = _run()
    cluster, _ = ray_cluster(run, spec)
    (group,) = cluster["spec"]["workerGroupSpecs"]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == 2
    worker = group["template"]
    (container,) = worker["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert "initContainers" not in worker["spec"]
    volumes = {v["name"]: v for v in worker["spec"]["volumes"]}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "shared-ckpt"}
    assert "gateway-key" not in volumes
    assert worker["metadata"]["labels"][names.LABEL_COMPONENT] == COMPONENT_RAY_WORKER
    selector = children.gateway_service(run, spec)["spec"]["selector"]
    assert not selector.items() <= worker["metadata"]["labels"].items()
    assert "prometheus.io/scrape" not in (worker["metadata"].get("annotations") or {})


def test_the_users_pod_template_reaches_head_and_workers_kueue_labels_included() -> None:
    template = {
        "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpu-queue"}},
        "nodeSelector": {"gpu": "h200"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "volumes": [{"name": "model", "persistentVolumeClaim": {"claimName": "weights"}}],
        "trainerContainer": {
            "env": [{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}],
            "volumeMounts": [{"name": "model", "mountPath": "/models"}],
        },
    }
    run, spec = _run(podTemplate=template)
    cluster, merged = ray_cluster(run, spec)
    assert merged.refused == []
    head = cluster["spec"]["headGroupSpec"]["template"]
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]
    for pod, ray_container in ((head, RAY_HEAD_CONTAINER), (worker, "ray-worker")):
        assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
        assert pod["spec"]["nodeSelector"] == {"gpu": "h200"}
        assert pod["spec"]["tolerations"] == template["tolerations"]
        assert any(v["name"] == "model" for v in pod["spec"]["volumes"])
        container = _containers(pod)[ray_container]  # verl's workers, NCCL's users, run in the raylet's
        assert {"name": "NCCL_SOCKET_IFNAME", "value": "eth0"} in container["env"]
        assert {"name": "model", "mountPath": "/models"} in container["volumeMounts"]


def test_the_run_owns_the_cluster_and_suspend_carries_over() -> None:
    run, spec = _run()
    cluster, _ = ray_cluster(run, spec)
    (owner,) = cluster["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("AsyncTrainingRun", "uid-1", True)
    assert cluster["metadata"]["name"] == names.ray_cluster_name("demo") == "demo-ray"
    assert cluster["spec"]["suspend"] is False
    suspended = load_run({**run, "spec": {**run["spec"], "suspend": True}}).spec
    created_suspended = ray_cluster(run, suspended)[0]
    assert created_suspended["spec"]["suspend"] is True
    # Resumed with its run: the cluster was suspended by the run, not by Kueue.
    assert _suspend(created_suspended, run_suspended=False, finished=False) is False


def test_gpus_per_node_unset_takes_trainer_gpus() -> None:
    run, spec = _run(gpusPerNode=None, gpus=4)
    cluster, _ = ray_cluster(run, spec)
    worker = cluster["spec"]["workerGroupSpecs"][0]["template"]
    assert worker["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "4"


@pytest.mark.parametrize(
    ("trainer", "named"),
    [
        ({"checkpoint": {}}, "spec.trainer.checkpoint.claimName"),
        ({"backend": "Reference"}, "spec.trainer.nodes"),
        ({"nodes": 0}, "spec.trainer.nodes"),
    ],
)
def test_a_multi_node_run_without_what_it_needs_is_refused_naming_the_field(
    trainer: dict[str, Any], named: str
) -> None:
    with pytest.raises(InvalidRunError) as raised:
        _run(**trainer)
    assert f"{named}:" in str(raised.value)


def test_the_missing_claim_message_says_read_write_many_and_the_fix() -> None:
    with pytest.raises(InvalidRunError) as raised:
        _run(checkpoint={})
    assert "ReadWriteMany" in str(raised.value)
    assert "trainer.nodes: 1" in str(raised.value)


def test_ray_cluster_state_reads_kuberays_status() -> None:
    assert ray_cluster_state(None) is None
    assert ray_cluster_state({}) == "pending"
    status = {"state": "ready", "desiredWorkerReplicas": 2, "readyWorkerReplicas": 1}
    assert ray_cluster_state({"status": status}) == "ready (1/2 workers ready)"


def _head_pod(driver: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"containerStatuses": [{"name": "ray-head", "state": {"running": {}}}, driver]}}


def _phase(cluster: dict[str, Any], head: dict[str, Any] | None) -> Any:
    from datetime import UTC, datetime

    from asyncrl.api import AsyncTrainingRunStatus
    from asyncrl.operator.reconciliation.status import RunObservation, next_status

    observation = RunObservation(
        generation=1,
        suspended=False,
        trainer=trainer_observation(cluster, head),
        gateway_reachable=True,
        summary=None,
        rollout_counts=None,
        jobs_active=0,
        jobs_created=0,
        jobs_failed=0,
        template_error=None,
    )
    return next_status(AsyncTrainingRunStatus(), observation, now=datetime.now(UTC))


CLUSTER = {"metadata": {"name": "demo-ray", "labels": {names.LABEL_COMPONENT: "trainer"}}, "status": {}}


def test_a_running_driver_is_a_running_run_and_the_status_shows_the_cluster_state() -> None:
    cluster = {**CLUSTER, "status": {"state": "ready", "desiredWorkerReplicas": 1, "readyWorkerReplicas": 1}}
    status = _phase(cluster, _head_pod({"name": "trainer", "state": {"running": {}}, "restartCount": 1}))
    assert (status.phase, status.ray_cluster) == ("Running", "ready (1/1 workers ready)")


def test_a_driver_that_exited_zero_is_a_succeeded_run() -> None:
    driver = {"name": "trainer", "state": {"terminated": {"exitCode": 0}}, "restartCount": 0}
    assert _phase(CLUSTER, _head_pod(driver)).phase == "Succeeded"


def test_a_driver_that_keeps_failing_fails_the_run_like_the_jobs_backoff_limit() -> None:
    last = {"terminated": {"exitCode": 3, "reason": "Error"}}
    retrying = {"name": "trainer", "state": {"waiting": {}}, "lastState": last, "restartCount": 3}
    assert _phase(CLUSTER, _head_pod(retrying)).phase == "Running"  # the Job would still retry too
    status = _phase(CLUSTER, _head_pod({**retrying, "restartCount": 4}))
    assert status.phase == "Failed"
    assert "exit code 3" in (status.message or "")


def test_a_cluster_kuberay_reports_failed_fails_the_run() -> None:
    status = _phase({**CLUSTER, "status": {"state": "failed", "reason": "head pod evicted"}}, None)
    assert status.phase == "Failed"
    assert "head pod evicted" in (status.message or "")


def test_the_pod_templates_labels_reach_the_ray_cluster_where_kueue_reads_its_queue() -> None:
    run, spec = _run(podTemplate={"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "gpu-queue"}}})
    cluster, _ = ray_cluster(run, spec)
    assert cluster["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    assert cluster["metadata"]["labels"][names.LABEL_COMPONENT] == "trainer"


def _suspend(cluster: dict[str, Any], *, run_suspended: bool, finished: bool) -> bool | None:
    """What the reconcile does with the cluster's suspension (None: leaves it)."""
    from datetime import UTC, datetime

    from asyncrl.api import AsyncTrainingRunStatus
    from asyncrl.operator.reconciliation.reconcile import Observed, reconcile
    from asyncrl.operator.reconciliation.status import RunObservation

    driver = {"name": "trainer", "state": {"terminated": {"exitCode": 0}}} if finished else None
    observation = RunObservation(
        generation=1,
        suspended=run_suspended,
        trainer=trainer_observation(cluster, _head_pod(driver) if driver else None),
        gateway_reachable=True,
        summary=None,
        rollout_counts=None,
        jobs_active=0,
        jobs_created=0,
        jobs_failed=0,
        template_error=None,
    )
    observed = Observed(
        status=AsyncTrainingRunStatus(), run=observation, missing=frozenset(), agents_stopped=False
    )
    return reconcile(observed, now=datetime.now(UTC)).trainer_suspend


def test_the_cluster_is_suspended_when_the_run_is_and_resumed_only_if_the_run_suspended_it() -> None:
    running = {"metadata": {}, "spec": {"suspend": False}}
    assert _suspend(running, run_suspended=False, finished=False) is None
    assert _suspend(running, run_suspended=True, finished=False) is True
    assert _suspend(running, run_suspended=False, finished=True) is True  # a finished driver frees the GPUs
    ours = {"metadata": {"annotations": {ANNOTATION_SUSPENDED_BY_RUN: "true"}}, "spec": {"suspend": True}}
    assert _suspend(ours, run_suspended=False, finished=False) is False
    # Kueue suspends a queued cluster until it admits all of its pods: not ours to resume.
    held_by_kueue = {"metadata": {}, "spec": {"suspend": True}}
    assert _suspend(held_by_kueue, run_suspended=False, finished=False) is None


def test_a_longest_run_name_gives_kuberay_names_within_the_limits() -> None:
    longest = "r" * 63
    cluster = names.ray_cluster_name(longest)
    assert len(cluster) <= 40
    assert len(f"{cluster}-head-svc") <= 63  # KubeRay's head Service, a DNS-1035 label
    assert names.ray_cluster_name(longest) != names.ray_cluster_name("r" * 62)
