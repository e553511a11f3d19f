"""The record a test node leaves under /run/asyncrl-node, and removing the node it describes.

A node started by a test run that is killed (a timeout, Ctrl-C twice, SIGKILL) never runs its `stop()`. Its
record says what it put on this machine: the network namespace and veth, its directories (where its mounts
are), and the process that owned it. The next node (or `python -m asyncrl.testing.node clean`) finds records
whose owner is gone and removes what they describe, by namespace, cgroup and path, never by process name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from asyncrl.testing import hoststate, netns

logger = logging.getLogger(__name__)

RUN_DIR = Path("/run/asyncrl-node")  # per node: sockets (short paths), containerd's state, the owner record
OWNER_RECORD = "owner.json"


def process_start_time(pid: int) -> str | None:
    """When `pid` started (clock ticks since boot), which tells a live owner from a reused PID."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, starttime in clock ticks since boot


@dataclass(frozen=True)
class NodeRecord:
    """What a node put on this machine, written when it starts so that a later run can remove it."""

    name: str
    host_interface: str
    work_dir: str
    owner_pid: int
    owner_start_time: str

    @property
    def run_dir(self) -> Path:
        return RUN_DIR / self.name

    def owner_alive(self) -> bool:
        return process_start_time(self.owner_pid) == self.owner_start_time

    def write(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / OWNER_RECORD).write_text(json.dumps(self.__dict__, indent=1) + "\n")

    @classmethod
    def read(cls, run_dir: Path) -> NodeRecord | None:
        try:
            data = json.loads((run_dir / OWNER_RECORD).read_text())
            return cls(**data)
        except (FileNotFoundError, ValueError, TypeError):
            return None


def remove_host_state(record: NodeRecord, *, remove_work_dir: bool) -> list[str]:
    """Take away everything the node `record` describes: processes in its namespace, its pods' cgroup
    subtree, mounts under its directories, the namespace and veth, its log symlinks. Returns what is left
    (empty when all is gone). Safe to call again, and for a node whose processes are already stopped."""
    left: list[str] = []
    netns_path = netns.NETNS_DIR / record.name
    for pid in netns.pids_in_namespace(netns_path):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    left += [f"cgroup {path}" for path in hoststate.remove_cgroup_root(record.name)]
    deadline = time.monotonic() + 10
    while netns.pids_in_namespace(netns_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    left += [f"process {pid} in {record.name}" for pid in netns.pids_in_namespace(netns_path)]
    directories = [record.run_dir, Path(record.work_dir)]
    for directory in directories:
        # Unmounting and deleting walk these trees: never a system directory by mistake.
        if not directory.is_absolute() or len(directory.resolve().parts) < 3:
            raise ValueError(f"refusing to clean {directory}: not a node's own directory")
    for directory in directories:
        left += [f"mount {point}" for point in hoststate.unmount_all_under(directory)]
    netns.delete_link(
        netns.NodeLink(
            name=record.name, host_interface=record.host_interface, host_address="", node_address=""
        )
    )
    if netns_path.exists():
        left.append(f"network namespace {record.name}")
    _remove_log_symlinks(Path(record.work_dir))
    for directory in directories:
        if directory == Path(record.work_dir) and not remove_work_dir:
            continue
        # Never delete through a mount that would not go (a hostPath volume is the machine's own files).
        if directory.exists() and not hoststate.mounts_under(directory):
            shutil.rmtree(directory, ignore_errors=True)
    return left


def _remove_log_symlinks(work_dir: Path) -> None:
    """The kubelet links each container's log into /var/log/containers; remove the links into `work_dir`."""
    links = Path("/var/log/containers")
    if not links.is_dir():
        return
    prefix = str(work_dir.resolve())
    for entry in links.iterdir():
        with contextlib.suppress(OSError):
            if entry.is_symlink() and os.readlink(entry).startswith(prefix):
                entry.unlink()


def sweep_stale_nodes(*, older_than_seconds: float) -> list[str]:
    """Remove every node whose owner process is gone, and every `asyncrl-*` namespace without a record older
    than `older_than_seconds`; return the names removed."""
    removed = []
    if RUN_DIR.is_dir():
        for run_dir in sorted(RUN_DIR.iterdir()):
            record = NodeRecord.read(run_dir)
            if record is None or record.owner_alive():
                continue
            logger.warning("removing node %s left by process %d (gone)", record.name, record.owner_pid)
            left = remove_host_state(record, remove_work_dir=False)
            if left:
                logger.warning("node %s: could not remove %s", record.name, ", ".join(left))
            removed.append(record.name)
    for name, age in netns.namespaces().items():
        if name in removed or (RUN_DIR / name / OWNER_RECORD).exists() or age < older_than_seconds:
            continue
        logger.warning("removing network namespace %s (no owner record, %.0f s old)", name, age)
        record = NodeRecord(
            name=name,
            host_interface=f"arl{name[-6:]}",
            work_dir=str(RUN_DIR / name / "work"),
            owner_pid=0,
            owner_start_time="",
        )
        remove_host_state(record, remove_work_dir=False)
        removed.append(name)
    return removed
