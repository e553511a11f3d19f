"""Start a local server process for a test or benchmark, wait until it answers, stop it for sure."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from asyncrl.launch.processes import stop_process_group


@dataclass
class ServerProcess:
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, grace_seconds: float = 10.0) -> int:
        return stop_process_group(self.process, grace_seconds=grace_seconds)


def start_server(
    argv: Sequence[str],
    *,
    ready_url: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    timeout_seconds: float = 30.0,
) -> ServerProcess:
    """Start `argv` in its own process group; return once GET `ready_url` answers below 500."""
    log = log_path.open("wb")
    try:
        process = subprocess.Popen(
            list(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    finally:
        log.close()
    server = ServerProcess(argv=list(argv), log_path=log_path, process=process)
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{argv[0]} exited with {process.returncode} before it was ready:\n{server.log()}"
            )
        try:
            with urllib.request.urlopen(ready_url, timeout=1) as response:
                if response.status < 500:
                    return server
        except urllib.error.HTTPError as error:
            if error.code < 500:
                return server
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"{argv[0]} not ready at {ready_url} after {timeout_seconds:.0f}s:\n{server.log()}")
