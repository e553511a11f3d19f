"""A node leaves nothing on the machine: not after `stop()`, and not after its owner was killed (the next
node removes what it finds). What is checked is what a node adds: its network namespace and veth, mounts
under its directories, its processes and its pods' cgroup subtree, its log links."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.testing import hoststate, netns
from asyncrl.testing.noderecord import RUN_DIR, NodeRecord, sweep_stale_nodes
from tests.node.conftest import (
    apply,
    pod,
    skip_or_fail_without_node,
    started_node_cluster,
    wait_for_pod_phase,
)

pytestmark = [pytest.mark.node, pytest.mark.slow]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _ip_netns_names() -> list[str]:
    listing = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def test_stopping_a_node_leaves_no_namespace_mount_process_or_cgroup(tmp_path: Path) -> None:
    cluster = started_node_cluster(tmp_path / "node")
    try:
        assert cluster.tools is not None
        namespace = "default"
        volume_pod = pod(
            "with-volumes",
            cluster.tools.busybox_image,
            ["sleep", "3600"],
            restartPolicy="Always",
            volumes=[{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
        )
        volume_pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "scratch", "mountPath": "/scratch"}]
        apply(cluster.kubectl(), namespace, volume_pod)
        wait_for_pod_phase(cluster, namespace, "with-volumes", "Running")
        name, work_dir, host_interface = (
            cluster.node_name,
            cluster.work_dir,
            cluster.link and cluster.link.host_interface,
        )
        assert work_dir is not None
        processes = set(netns.pids_in_namespace(netns.NETNS_DIR / name)) | hoststate.cgroup_pids(name)
        # The kubelet's root (pod volumes) is under the run directory, whose socket paths stay short.
        assert hoststate.mounts_under(cluster.kubelet_root), "a running pod has tmpfs and projected mounts"
        assert hoststate.cgroup_pids(name), "the pod's processes are in the node's cgroup subtree"
    finally:
        cluster.stop()
    assert name not in _ip_netns_names()
    assert not Path(f"/sys/class/net/{host_interface}").exists()
    assert hoststate.mounts_under(work_dir) == []
    assert hoststate.mounts_under(RUN_DIR / name) == []
    assert [pid for pid in processes if _alive(pid)] == []
    assert not any((hierarchy / name).exists() for hierarchy in hoststate.cgroup_hierarchies())
    assert not (RUN_DIR / name).exists()
    links = Path("/var/log/containers")
    if links.is_dir():
        assert [
            p for p in links.iterdir() if p.is_symlink() and os.readlink(p).startswith(str(work_dir))
        ] == []


def test_a_node_whose_owner_died_is_removed_by_the_next_sweep(tmp_path: Path) -> None:
    skip_or_fail_without_node()
    link = netns.create_link()
    # A process in the namespace and a cgroup of the node's name, as a crashed node would leave them.
    hoststate.create_cgroup_root(link.name)
    sleeper = subprocess.Popen([*link.nsenter(), "sleep", "600"], start_new_session=True)
    dead_owner = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    record = NodeRecord(
        name=link.name,
        host_interface=link.host_interface,
        work_dir=str(tmp_path / "work"),
        owner_pid=int(dead_owner.stdout),
        owner_start_time="0",
    )
    record.write()
    try:
        assert not record.owner_alive()
        assert link.name in sweep_stale_nodes(older_than_seconds=3600)
        sleeper.wait(timeout=30)
        assert link.name not in _ip_netns_names()
        assert not Path(f"/sys/class/net/{link.host_interface}").exists()
        assert not record.run_dir.exists()
        assert not any((hierarchy / link.name).exists() for hierarchy in hoststate.cgroup_hierarchies())
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        netns.delete_link(link)
        hoststate.remove_cgroup_root(link.name)
