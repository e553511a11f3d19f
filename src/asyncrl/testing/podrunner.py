"""A test-only stand-in for scheduler + kubelet: binds Pending pods to a fake Node and runs them locally.

The control plane here has no kubelet or container runtime. This runner registers one Node, watches pods,
binds unscheduled ones to that Node, and hands each bound pod to a `PodExecution` thread that runs its
containers as local processes and writes their status back. When a pod is deleted it kills the processes and
completes the deletion, as a kubelet does. Everything else (Jobs, garbage collection, TTL) is the real
controller-manager's work.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from asyncrl.launch.podspec import ImageTable
from asyncrl.testing.podexec import JSON, ContainerRewrite, PodExecution

logger = logging.getLogger(__name__)

DEFAULT_NODE_NAME = "asyncrl-local-node"


class PodRunner:
    """Start with `start()`, stop with `stop()` (kills every process it started); also a context manager."""

    def __init__(
        self,
        *,
        api_client: Any,
        images: ImageTable,
        work_dir: Path,
        node_name: str = DEFAULT_NODE_NAME,
        base_env: Mapping[str, str] | None = None,
        rewrite: ContainerRewrite | None = None,
    ) -> None:
        from kubernetes import client

        # Any: bodies are passed as plain dicts, which the client accepts but its annotations do not.
        self.core: Any = client.CoreV1Api(api_client)
        self.images = images
        self.work_dir = work_dir
        self.node_name = node_name
        self.base_env = dict(base_env or {})
        self.rewrite = rewrite
        self._executions: dict[str, PodExecution] = {}
        self._deleting: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch_forever, name="pod-runner-watch", daemon=True)
        self._watch: Any = None

    def __enter__(self) -> PodRunner:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        self._register_node()
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._watch is not None:
            self._watch.stop()
        with self._lock:
            executions = list(self._executions.values())
        for execution in executions:
            execution.request_stop(grace_seconds=2)
        for execution in executions:
            execution.join(timeout=15)
        self._thread.join(timeout=5)

    def pod_dir(self, namespace: str, name: str) -> Path:
        return self.work_dir / "pods" / f"{namespace}_{name}"

    def log_path(self, namespace: str, name: str, container: str) -> Path:
        """The combined stdout/stderr of one container of one pod (restarts append)."""
        return self.pod_dir(namespace, name) / f"{container}.log"

    # -- node ---------------------------------------------------------------------------------------------

    def _register_node(self) -> None:
        from kubernetes.client.exceptions import ApiException

        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.node_name, "labels": {"kubernetes.io/hostname": self.node_name}},
        }
        try:
            self.core.create_node(node)
        except ApiException as error:
            if error.status != 409:
                raise
        capacity = {"cpu": "16", "memory": "64Gi", "pods": "250", "nvidia.com/gpu": "8"}
        status = {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": "localhost"},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "AsyncrlPodRunner",
                    "message": "local pod runner",
                }
            ],
        }
        self.core.patch_node_status(self.node_name, {"status": status})

    # -- watch --------------------------------------------------------------------------------------------

    def _watch_forever(self) -> None:
        from kubernetes import watch

        resource_version = ""
        while not self._stopping.is_set():
            try:
                if not resource_version:
                    listing = self.core.list_pod_for_all_namespaces(_preload_content=False)
                    body = json.loads(listing.data)
                    resource_version = body["metadata"]["resourceVersion"]
                    for pod in body["items"]:
                        self._handle(pod)
                self._watch = watch.Watch()  # type: ignore[no-untyped-call]
                for event in self._watch.stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=resource_version,
                    timeout_seconds=60,
                    allow_watch_bookmarks=True,
                ):
                    if self._stopping.is_set():
                        return
                    raw: JSON = event["raw_object"]
                    if event["type"] == "ERROR":
                        resource_version = ""  # expired: relist
                        break
                    resource_version = raw["metadata"]["resourceVersion"]
                    if event["type"] == "BOOKMARK":
                        continue
                    if event["type"] == "DELETED":
                        self._forget(raw, delete=False)
                    else:
                        self._handle(raw)
            except Exception as error:
                if self._stopping.is_set():
                    return
                logger.warning("pod runner watch error, relisting: %s", error)
                resource_version = ""
                self._stopping.wait(0.5)

    def _handle(self, pod: JSON) -> None:
        spec = pod["spec"]
        metadata = pod["metadata"]
        phase = (pod.get("status") or {}).get("phase")
        if not spec.get("nodeName"):
            if phase == "Pending" and not metadata.get("deletionTimestamp"):
                self._bind(pod)
            return
        if spec["nodeName"] != self.node_name:
            return
        if metadata.get("deletionTimestamp"):
            self._forget(pod, delete=True)
            return
        uid = metadata["uid"]
        with self._lock:
            if uid in self._executions or phase in ("Succeeded", "Failed"):
                return
            execution = PodExecution(
                pod=pod,
                core=self.core,
                images=self.images,
                pod_dir=self.pod_dir(metadata["namespace"], metadata["name"]),
                base_env=self.base_env,
                rewrite=self.rewrite,
            )
            self._executions[uid] = execution
        execution.start()

    def _bind(self, pod: JSON) -> None:
        from kubernetes.client.exceptions import ApiException

        metadata = pod["metadata"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": metadata["name"], "namespace": metadata["namespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.node_name},
        }
        try:
            self.core.create_namespaced_binding(metadata["namespace"], binding, _preload_content=False)
        except ApiException as error:
            if error.status not in (404, 409):
                logger.warning(
                    "binding %s/%s failed: %s", metadata["namespace"], metadata["name"], error.reason
                )

    def _forget(self, pod: JSON, *, delete: bool) -> None:
        """A deleted pod: kill its processes (honouring the grace period), then complete the deletion."""
        metadata = pod["metadata"]
        with self._lock:
            if delete and metadata["uid"] in self._deleting:
                return
            if delete:
                self._deleting.add(metadata["uid"])
            execution = self._executions.get(metadata["uid"])
        if execution is not None:
            grace = metadata.get("deletionGracePeriodSeconds")
            execution.request_stop(grace_seconds=float(grace) if grace is not None else None)
        if delete:
            threading.Thread(
                target=self._finish_delete, args=(pod, execution), name="pod-runner-delete", daemon=True
            ).start()

    def _finish_delete(self, pod: JSON, execution: PodExecution | None) -> None:
        from kubernetes.client.exceptions import ApiException

        metadata = pod["metadata"]
        logger.info("pod %s/%s deleted: stopping its processes", metadata["namespace"], metadata["name"])
        if execution is not None:
            execution.join(timeout=30)
        logger.info("pod %s/%s: completing deletion", metadata["namespace"], metadata["name"])
        try:
            self.core.delete_namespaced_pod(
                metadata["name"],
                metadata["namespace"],
                # In the body: the API server reads DeleteOptions from the body when there is one.
                body={"gracePeriodSeconds": 0, "preconditions": {"uid": metadata["uid"]}},
            )
        except ApiException as error:
            if error.status != 404:
                logger.warning(
                    "final delete of %s/%s failed: %s", metadata["namespace"], metadata["name"], error
                )
        with self._lock:
            self._executions.pop(metadata["uid"], None)
