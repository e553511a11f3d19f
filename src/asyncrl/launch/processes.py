"""Local processes: a free loopback port, and stopping a process group for sure (SIGTERM, grace, SIGKILL).

Every long-lived process that local mode or the test harness starts leads its own process group (it starts a
new session), so signalling the group stops the process and everything it started. One copy of that rule
serves the control plane's components, the test servers and local mode's gateway, trainer and agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

KILL_WAIT_SECONDS = 5.0  # after SIGKILL, how long to wait for the group to be gone


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def stop_process_group(
    process: subprocess.Popen[bytes], *, grace_seconds: float, kill_wait_seconds: float | None = None
) -> int:
    """SIGTERM the group `process` leads, SIGKILL it after `grace_seconds`; return the exit status.

    `kill_wait_seconds` bounds the wait after SIGKILL (None: wait until the process is reaped).
    """
    if process.poll() is None:
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait(timeout=kill_wait_seconds)
    return process.returncode


async def stop_process_groups(pids: list[int], *, grace_seconds: float) -> list[int]:
    """SIGTERM these process groups together, SIGKILL what is left after the grace; return those still alive.

    Each process of the run leads its own group (it started a new session), so a group holds the process and
    everything it started. All groups get the signal at once: stopping takes one grace, not one per process.
    """
    for pid in pids:
        _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    while time.monotonic() < deadline and any(_group_alive(pid) for pid in pids):
        await asyncio.sleep(0.05)
    for pid in pids:
        if _group_alive(pid):
            _signal_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + KILL_WAIT_SECONDS
    while time.monotonic() < deadline and any(_group_alive(pid) for pid in pids):
        await asyncio.sleep(0.05)
    return [pid for pid in pids if _group_alive(pid)]


def _signal_group(pid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _group_alive(pid: int) -> bool:
    """Whether any process of the group is still running (an unreaped leader counts until reaped)."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid) or _group_has_other_members(pid)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _group_has_other_members(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(stat.parent.name) != pgid and int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False
