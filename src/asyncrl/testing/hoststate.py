"""What a test node leaves on this machine outside its network namespace, and how to take it away.

The kubelet and containerd share the machine's mount namespace (they must: containerd mounts what the
kubelet prepared), so the node's tmpfs, projected-volume, overlay and namespace mounts are the machine's
mounts, under the node's own directories. Its pods' processes live in a cgroup subtree of their own (the
kubelet's `cgroupRoot`), one per node, so they can be found and killed by cgroup even when the kubelet and
containerd that started them are gone. Both are cleaned by path, never by process name.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
from pathlib import Path

logger = logging.getLogger(__name__)

MNT_DETACH = 2


def _unescape(field: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def mount_points() -> list[tuple[str, str]]:
    """(mount point, filesystem type) of every mount this process sees, in mount order."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        found.append((_unescape(fields[4]), fields[separator + 1]))
    return found


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below `root`, deepest first (the order to unmount them)."""
    prefix = str(root.resolve()).rstrip("/")
    found = {point for point, _ in mount_points() if point == prefix or point.startswith(prefix + "/")}
    return sorted(found, key=lambda point: (point.count("/"), point), reverse=True)


def unmount_all_under(root: Path, *, attempts: int = 5) -> list[str]:
    """Lazily unmount everything at or below `root`; return the mount points still there afterwards."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(attempts):
        points = mounts_under(root)
        if not points:
            return []
        for point in points:
            if libc.umount2(point.encode(), MNT_DETACH) != 0:
                error = ctypes.get_errno()
                logger.debug("umount2 %s: %s", point, os.strerror(error))
    return mounts_under(root)


# --- cgroups ---------------------------------------------------------------------------------------------


def cgroup_hierarchies() -> list[Path]:
    """The mount points of this machine's cgroup hierarchies (one per v1 controller set, or the v2 one)."""
    return [Path(point) for point, kind in mount_points() if kind in ("cgroup", "cgroup2")]


def create_cgroup_root(name: str) -> None:
    """`/<name>` in every hierarchy, so that the kubelet's `cgroupRoot: /<name>` exists for each controller.

    A v1 cpuset child starts with no CPUs and no memory nodes; it gets its parent's."""
    for hierarchy in cgroup_hierarchies():
        directory = hierarchy / name
        directory.mkdir(exist_ok=True)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            parent, child = hierarchy / knob, directory / knob
            if parent.exists() and child.exists() and not child.read_text().strip():
                child.write_text(parent.read_text())


def cgroup_pids(name: str) -> set[int]:
    """Every process in `/<name>` or below, in any hierarchy."""
    pids: set[int] = set()
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / name
        if not root.is_dir():
            continue
        for directory, _, files in os.walk(root):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError):
                    pids.update(int(pid) for pid in (Path(directory) / "cgroup.procs").read_text().split())
    return pids


def kill_cgroup(name: str, *, timeout: float = 20.0) -> set[int]:
    """SIGKILL every process in `/<name>` until none is left or `timeout` passes; return those left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = cgroup_pids(name)
        if not pids or time.monotonic() >= deadline:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_cgroup_root(name: str, *, timeout: float = 20.0) -> list[Path]:
    """Kill what runs in `/<name>`, then remove it and its children in every hierarchy (deepest first);
    return the directories that could not be removed."""
    kill_cgroup(name, timeout=timeout)
    left: list[Path] = []
    for hierarchy in cgroup_hierarchies():
        root = hierarchy / name
        if not root.is_dir():
            continue
        directories = [Path(directory) for directory, _, _ in os.walk(root)]
        for directory in sorted(directories, key=lambda path: len(path.parts), reverse=True):
            deadline = time.monotonic() + 5.0
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() >= deadline:
                        left.append(directory)
                        break
                    time.sleep(0.1)
    return left
