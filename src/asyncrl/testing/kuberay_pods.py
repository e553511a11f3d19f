"""KubeRay's pods as local processes: what the pod runner must add so the real KubeRay operator's head and
worker pods run on one host (test-only; there is no kubelet, container runtime or cluster DNS here).

What KubeRay generates and how it is adapted:
- the Ray container's command, `/bin/bash -c -- "ulimit -n 65536; ray start ..."`, and the workers'
  `wait-gcs-ready` init container (`ray health-check` in a loop) run as `/bin/bash -c` whatever the image
  table says of their image (the trainer image, whose table entry is the driver's stand-in); a login shell
  (`-lc`, KubeRay's ENABLE_LOGIN_SHELL) would reset PATH and lose the virtual environment's `ray`;
- the head Service's DNS name (`<cluster>-head-svc.<ns>.svc.cluster.local`) becomes 127.0.0.1;
- the fixed ports every Ray pod takes (GCS 6379, dashboard 8265, client server 10001, metrics 8080, dashboard
  agent 52365) cannot be held by two pods on one host: each cluster's head gets free ports, each worker its
  own metrics and agent ports, and `:6379` in commands and variables (RAY_ADDRESS, the workers' --address)
  points at the head's GCS port.
Everything else is KubeRay's own output, run as it is.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]
GCS_PORT = 6379
_SERVICE_HOST = re.compile(r"[A-Za-z0-9.-]+\.svc\.cluster\.local")


@dataclass(frozen=True)
class HeadPorts:
    gcs: int
    dashboard: int
    client: int


@dataclass(frozen=True)
class NodePorts:
    metrics: int
    agent: int


class KubeRayLocalPods:
    """A `ContainerRewrite` for the pod runner; `free_port` picks a free local port."""

    def __init__(self, free_port: Callable[[], int]) -> None:
        self._free_port = free_port
        self._heads: dict[tuple[str, str], HeadPorts] = {}
        self._nodes: dict[str, NodePorts] = {}
        self._lock = threading.Lock()

    def head_ports(self, namespace: str, cluster: str) -> HeadPorts:
        with self._lock:
            key = (namespace, cluster)
            if key not in self._heads:
                self._heads[key] = HeadPorts(self._free_port(), self._free_port(), self._free_port())
            return self._heads[key]

    def _node_ports(self, pod_uid: str) -> NodePorts:
        with self._lock:
            if pod_uid not in self._nodes:
                self._nodes[pod_uid] = NodePorts(self._free_port(), self._free_port())
            return self._nodes[pod_uid]

    def __call__(
        self, pod: JSON, spec: JSON, argv: list[str], env: dict[str, str]
    ) -> tuple[list[str], dict[str, str]]:
        metadata = pod["metadata"]
        labels = metadata.get("labels") or {}
        cluster = labels.get("ray.io/cluster")
        if not cluster:
            return argv, env
        head = self.head_ports(metadata["namespace"], cluster)
        node = self._node_ports(metadata["uid"])
        is_head = labels.get("ray.io/node-type") == "head"

        def local(text: str) -> str:
            text = _SERVICE_HOST.sub("127.0.0.1", text)
            return re.sub(rf"(127\.0\.0\.1|localhost):{GCS_PORT}\b", rf"\g<1>:{head.gcs}", text)

        env = {key: local(value) for key, value in env.items()}
        if "RAY_PORT" in env:
            env["RAY_PORT"] = str(head.gcs)
        if is_kuberay_shell(spec.get("command") or []) and spec.get("args"):
            script = local(str(spec["args"][0]))
            if "ray start" in script:
                script = ray_start_ports(script, head=head if is_head else None, node=node)
            return ["/bin/bash", "-c", script], env
        return [local(part) for part in argv], env


def is_kuberay_shell(command: list[str]) -> bool:
    """KubeRay's generated `/bin/bash -c --` (`-lc --` with ENABLE_LOGIN_SHELL=true)."""
    return len(command) == 3 and command[0] == "/bin/bash" and "c" in command[1] and command[2] == "--"


def _set_flag(script: str, flag: str, value: int) -> str:
    pattern = rf"--{flag}(=|\s+)\S+"
    if re.search(pattern, script):
        return re.sub(pattern, f"--{flag}={value}", script)
    return re.sub(r"ray start", f"ray start --{flag}={value}", script, count=1)


def ray_start_ports(script: str, *, head: HeadPorts | None, node: NodePorts) -> str:
    """The `ray start` of a KubeRay container with this host's ports (pure)."""
    script = _set_flag(script, "metrics-export-port", node.metrics)
    script = _set_flag(script, "dashboard-agent-listen-port", node.agent)
    if head is not None:
        script = _set_flag(script, "port", head.gcs)
        script = _set_flag(script, "dashboard-port", head.dashboard)
        script = _set_flag(script, "ray-client-server-port", head.client)
    return script
