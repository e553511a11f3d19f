"""KubeRay's generated pods made runnable on one host: shell, service names and ports (pure parts)."""

from __future__ import annotations

import itertools
from typing import Any

from asyncrl.testing.kuberay_pods import (
    HeadPorts,
    KubeRayLocalPods,
    NodePorts,
    is_kuberay_shell,
    ray_start_ports,
)

HEAD_START = (
    "ulimit -n 65536; ray start --head --block --dashboard-agent-listen-port=52365 --dashboard-host=0.0.0.0 "
    "--metrics-export-port=8080 --num-cpus=1 --num-gpus=1"
)
WORKER_START = (
    "ulimit -n 65536; ray start --address=demo-ray-head-svc.team.svc.cluster.local:6379 --block "
    "--dashboard-agent-listen-port=52365 --metrics-export-port=8080 --num-cpus=1"
)


def _pod(node_type: str, uid: str) -> dict[str, Any]:
    labels = {"ray.io/cluster": "demo-ray", "ray.io/node-type": node_type}
    return {"metadata": {"namespace": "team", "uid": uid, "labels": labels}}


def test_kuberays_shells_are_recognised_with_or_without_a_login_shell() -> None:
    assert is_kuberay_shell(["/bin/bash", "-c", "--"])
    assert is_kuberay_shell(["/bin/bash", "-lc", "--"])
    assert not is_kuberay_shell(["asyncrl", "trainer"])


def test_head_and_worker_get_distinct_ports_and_the_worker_finds_the_heads_gcs() -> None:
    ports = itertools.count(40000)
    rewrite = KubeRayLocalPods(lambda: next(ports))
    command = ["/bin/bash", "-lc", "--"]
    head_argv, head_env = rewrite(
        _pod("head", "h"), {"command": command, "args": [HEAD_START]}, ["ignored"], {"RAY_PORT": "6379"}
    )
    worker_argv, worker_env = rewrite(
        _pod("worker", "w"),
        {"command": command, "args": [WORKER_START]},
        ["ignored"],
        {"RAY_ADDRESS": "demo-ray-head-svc.team.svc.cluster.local:6379"},
    )
    gcs = rewrite.head_ports("team", "demo-ray").gcs
    assert head_argv[:2] == worker_argv[:2] == ["/bin/bash", "-c"]  # no login shell: PATH is kept
    assert f"--port={gcs}" in head_argv[2]
    assert head_env["RAY_PORT"] == str(gcs)
    assert f"--address=127.0.0.1:{gcs}" in worker_argv[2]
    assert worker_env["RAY_ADDRESS"] == f"127.0.0.1:{gcs}"
    assert "52365" not in head_argv[2] + worker_argv[2]
    assert "8080" not in head_argv[2] + worker_argv[2]


def test_a_flag_already_given_is_replaced_not_repeated() -> None:
    script = ray_start_ports(
        "ray start --head --port=6379 --metrics-export-port 8080",
        head=HeadPorts(gcs=1, dashboard=2, client=3),
        node=NodePorts(metrics=4, agent=5),
    )
    assert script.count("--port=") == 1
    assert "--port=1" in script
    assert "--metrics-export-port=4" in script
    assert "--dashboard-port=2" in script


def test_pods_not_of_kuberay_are_left_alone() -> None:
    rewrite = KubeRayLocalPods(lambda: 1)
    pod = {"metadata": {"namespace": "n", "uid": "u", "labels": {}}}
    assert rewrite(pod, {"command": ["x"]}, ["x", "a:6379"], {"A": "b"}) == (["x", "a:6379"], {"A": "b"})
