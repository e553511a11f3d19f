"""The multi-node preflight against real Ray: `asyncrl trainer --preflight` (the real CLI, as a process) joins
Ray nodes started here with `ray start`, as the driver in a KubeRay head pod does.

Real: Ray 2.60 (GCS, raylets, the task on each node, its GPU scheduling), the trainer's CLI and every check.
Not real: there is no GPU here, so each node declares one to Ray (`ray start --num-gpus=1`, as KubeRay
passes a pod's nvidia.com/gpu limit), which Ray takes on trust and hands to the task as CUDA_VISIBLE_DEVICES;
torch then finds no CUDA device, so the per-node CUDA check fails here, truthfully. Both nodes are processes
on this host, so they share its /dev/shm, model folder and checkpoint folder. The dev venv is not the trainer
image (torch, transformers and vLLM differ from the pins), so the driver's packages line fails; it is
compared with the same check run in this process.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.api.types.spec import TrainerBackend
from asyncrl.launch.processes import free_port, stop_process_group
from asyncrl.testing.waiting import wait_for
from asyncrl.trainer.preflight import MACHINE, check_packages, cuda_state
from tests.support.kube import multi_node_manifest, pod_base_env

RAY = Path(sys.executable).parent / "ray"


@dataclass
class RayNodes:
    """Ray nodes on this host, each `ray start --block` leading its own process group."""

    tmp: Path
    env: dict[str, str]
    gcs_port: int = 0
    processes: tuple[subprocess.Popen[bytes], ...] = ()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def start(self, *, head: bool, gpus: int = 1, cpus: int = 8) -> subprocess.Popen[bytes]:
        ports = ["--metrics-export-port", "--dashboard-agent-listen-port"]
        argv = [
            str(RAY),
            "start",
            "--block",
            f"--num-gpus={gpus}",
            f"--num-cpus={cpus}",
            "--disable-usage-stats",
        ]
        argv += [f"{flag}={free_port()}" for flag in ports]
        if head:
            self.gcs_port = free_port()
            argv += [
                "--head",
                f"--port={self.gcs_port}",
                "--include-dashboard=false",
                f"--ray-client-server-port={free_port()}",
            ]
        else:
            argv.append(f"--address={self.address}")
        log = (self.tmp / f"ray-{len(self.processes)}.log").open("wb")
        process = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.processes += (process,)
        return process

    def wait_for_head(self) -> None:
        def answers() -> bool | None:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.gcs_port), timeout=1),
            ):
                return True
            return None

        wait_for(answers, timeout=180, what=f"the Ray head at {self.address}", interval=0.5)

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop_process_group(process, grace_seconds=15, kill_wait_seconds=10)
            with contextlib.suppress(ProcessLookupError):  # what Ray's own stop left in the group
                os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture
def ray_nodes(tmp_path: Path) -> Iterator[RayNodes]:
    # Ray's own temp dir (short: its unix sockets live under it) and HOME, never the host's /tmp/ray or
    # ~/.ray, which other Ray clusters on this machine use.
    ray_tmp = Path(tempfile.mkdtemp(prefix="pf-", dir="/tmp"))
    env = {**pod_base_env(), "HOME": str(tmp_path), "RAY_TMPDIR": str(ray_tmp)}
    nodes = RayNodes(tmp=tmp_path, env=env)
    try:
        yield nodes
    finally:
        nodes.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)


def run_file(tmp_path: Path, **trainer: Any) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    manifest = multi_node_manifest("pre", **trainer)
    manifest["spec"]["model"]["path"] = str(model)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


@dataclass
class Preflight:
    """`asyncrl trainer --preflight` running: its report on stdout, its log in a file."""

    process: subprocess.Popen[str]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def result(self, *, timeout: float = 420) -> tuple[int, dict[str, str]]:
        """Exit code, and each check's line by its name."""
        out, _ = self.process.communicate(timeout=timeout)
        found = {}
        for line in out.splitlines():
            name = line[len("FAIL  ") :].split(": ", 1)[0]
            found[name] = line
        return self.process.returncode, found


def preflight(nodes: RayNodes, config: Path, *, wait_seconds: float) -> Preflight:
    log_path = config.parent / f"preflight-{len(list(config.parent.glob('preflight-*.log')))}.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "asyncrl.cli",
                "trainer",
                "--preflight",
                f"--config={config}",
                f"--checkpoint-dir={config.parent / 'ckpt'}",
                f"--ray-cluster-wait-seconds={wait_seconds}",
            ],
            env={**nodes.env, "RAY_ADDRESS": nodes.address},
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    return Preflight(process, log_path)


def test_a_driver_with_nothing_at_ray_address_fails_its_ray_head_check_in_its_wait(tmp_path: Path) -> None:
    env = {**pod_base_env(), "HOME": str(tmp_path)}
    nodes = RayNodes(tmp=tmp_path, env=env, gcs_port=free_port())
    code, found = preflight(nodes, run_file(tmp_path), wait_seconds=3).result(timeout=120)
    assert code == 1
    assert found["ray head"].startswith(f"FAIL  ray head: nothing answers at {nodes.address} after 3 s")
    assert "kubectl logs POD -c ray-head" in found["ray head"]
    # The driver's own checks do not ask for a GPU, Ray CPUs in its cgroup or /dev/shm per GPU.
    assert {"packages", "model", "checkpoints"} <= set(found)
    assert not {"cuda", "gpus", "ray cpus", "/dev/shm"} & set(found)


@pytest.mark.slow
def test_the_driver_waits_for_a_late_worker_then_checks_both_nodes_gpus_cpus_and_containers(
    tmp_path: Path, ray_nodes: RayNodes
) -> None:
    ray_nodes.start(head=True)
    ray_nodes.wait_for_head()
    config = run_file(tmp_path, resources={"limits": {"cpu": "8"}})

    # A worker that never joins: named after the deadline, and nothing more is asked of half a cluster.
    alone = preflight(ray_nodes, config, wait_seconds=20)
    code, found = alone.result()
    assert code == 1
    assert found["ray head"].startswith(
        f"ok    ray head: joined the run's Ray cluster at {ray_nodes.address}"
    )
    assert "FAIL  ray nodes: 1 of 2 joined after 2" in found["ray nodes"]
    assert "1 worker(s) missing; fix: see why the worker pods are not running" in found["ray nodes"]
    assert "preflight: 1 of 2 Ray nodes joined" in alone.log()
    assert "ray gpus" not in found

    # The worker joins while the driver waits for it; then every check runs, the last ones on each node.
    waiting = preflight(ray_nodes, config, wait_seconds=300)
    ray_nodes.start(head=False)
    code, found = waiting.result()
    assert found["packages"] == check_packages(TrainerBackend.VERL, MACHINE).line()  # the dev venv's own
    assert found["ray nodes"].startswith("ok    ray nodes: 2 of 2 joined")
    assert found["ray gpus"].startswith("ok    ray gpus: 2 in Ray (")  # the GPUs declared to ray start
    assert "verl needs 2 nodes x 1 (spec.trainer.gpusPerNode)" in found["ray gpus"]
    assert found["ray cpus"].startswith("ok    ray cpus: 8 needed on every node")
    for name in ("/dev/shm", "model", "checkpoints"):
        assert found[f"{name} on every node"].startswith("ok"), found
    node_cuda = sorted(line for name, line in found.items() if name.startswith("cuda on "))
    if not cuda_state()[0]:  # no GPU here: the task on each node finds none, and says so
        assert len(node_cuda) == 2, found
        assert all(line.startswith("FAIL") and "sees no CUDA device" in line for line in node_cuda)
        assert any("(head " in line for line in node_cuda)
        assert any("(worker " in line for line in node_cuda)
    assert code == 1

    # More GPUs per node than the nodes declared: refused as configuration, before any task on a node.
    manifest = yaml.safe_load(config.read_text())
    manifest["spec"]["trainer"]["gpusPerNode"] = 2
    manifest["spec"].update(trainBatchSize=2, **{"async": {"enabled": True, "windowSize": 4}})
    config.write_text(yaml.safe_dump(manifest))
    code, found = preflight(ray_nodes, config, wait_seconds=60).result()
    assert code == 1
    assert found["ray gpus"].startswith("FAIL  ray gpus: 2 in Ray (")
    assert "verl needs 2 nodes x 2" in found["ray gpus"]
    assert "at least 11" in found["ray cpus"]  # 1 + 4 storage units + 3 x 2
    assert not [name for name in found if name.startswith("cuda on ")]


@pytest.mark.slow
def test_a_head_killed_while_the_driver_waits_ends_the_driver_with_rays_message(
    tmp_path: Path, ray_nodes: RayNodes
) -> None:
    """kill -9 of the whole head (GCS and raylet) while the driver waits for a worker: Ray ends the driver
    60 s later with exit 1 and its own message; the trainer container is then restarted and waits again."""
    head = ray_nodes.start(head=True)
    ray_nodes.wait_for_head()
    waiting = preflight(ray_nodes, run_file(tmp_path), wait_seconds=400)
    try:
        wait_for(
            lambda: "Ray nodes joined" in waiting.log() or None,
            timeout=180,
            what="the driver joined and waiting for the worker",
            interval=0.5,
        )
        os.killpg(head.pid, signal.SIGKILL)
        code, found = waiting.result(timeout=240)
        assert code == 1
        assert "Failed to connect to GCS within 60 seconds" in waiting.log()
        assert found == {}  # no report: Ray ended the process
    finally:
        if waiting.process.poll() is None:
            waiting.process.kill()
