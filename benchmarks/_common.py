"""Shared parts of the benchmark scripts: real server processes on loopback, percentiles, tables.

The benchmarks start the same processes the gateway tests start (`tests/gateway/conftest.py`): the fake
OpenAI-compatible upstream and `python -m asyncrl.cli gateway`, each on a free port of 127.0.0.1, and stop
them for sure at the end. Nothing here asserts a timing; the scripts print what they measured.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from asyncrl.gateway_api.tokens import agent_token
from asyncrl.testing.controlplane import free_port
from asyncrl.testing.processes import ServerProcess, start_server

T = TypeVar("T")

KEY = "benchmark-gateway-key-0123456789"
MODEL = "served-model"
TINY_CHAT: dict[str, object] = {
    "model": "agent-model",
    "messages": [{"role": "user", "content": "hello there"}],
}


@dataclass
class Servers:
    upstream_url: str
    gateway_url: str
    upstream: ServerProcess
    gateway: ServerProcess
    log_dir: Path


def proxy_path(rollout_id: str, endpoint: str = "chat/completions", mode: str = "train") -> str:
    return f"/proxy/rollout/{rollout_id}/attempt/a1/mode/{mode}/openai/v1/{endpoint}"


def management_headers() -> dict[str, str]:
    return {"authorization": f"Bearer {KEY}"}


def agent_headers(rollout_id: str) -> dict[str, str]:
    return {"authorization": f"Bearer {agent_token(KEY, rollout_id)}"}


def start_upstream(log_dir: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(
        [sys.executable, "-m", "asyncrl.fake_upstream", "--port", str(port)],
        ready_url=f"{url}/stats",
        log_path=log_dir / "upstream.log",
    )
    return server, url


def start_gateway(
    upstream_url: str,
    log_dir: Path,
    *extra: str,
    instrument: tuple[str, Path] | None = None,
    name: str = "gateway",
    pythonpath: str | None = None,
) -> tuple[ServerProcess, str]:
    """The real gateway process (`python -m asyncrl.cli gateway`).

    `instrument` ("profile" or "gc", output file) runs it under `_instrumented_gateway.py` instead; stop
    that one with `stop_instrumented` so the output is written. `pythonpath` goes first on the gateway's
    PYTHONPATH, so a patched copy of `asyncrl` can be measured.
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    if instrument is None:
        prefix = [sys.executable, "-m", "asyncrl.cli"]
    else:
        launcher = Path(__file__).with_name("_instrumented_gateway.py")
        prefix = [sys.executable, str(launcher), instrument[0], str(instrument[1])]
    argv = [*prefix, "gateway", "--port", str(port), "--model", MODEL]
    argv += ["--upstream", upstream_url, "--log-level", "warning", *extra]
    env = {**os.environ, "ASYNCRL_GATEWAY_KEY": KEY}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    server = start_server(argv, ready_url=f"{url}/readyz", log_path=log_dir / f"{name}.log", env=env)
    return server, url


def stop_instrumented(server: ServerProcess, timeout_seconds: float = 20.0) -> None:
    """SIGINT only the instrumented gateway (uvicorn shuts down cleanly and the launcher writes its file)."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGINT)
        try:
            server.process.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            server.stop()


@contextmanager
def running_servers(*gateway_args: str, pythonpath: str | None = None) -> Iterator[Servers]:
    with tempfile.TemporaryDirectory(prefix="asyncrl-bench-") as tmp:
        log_dir = Path(tmp)
        upstream, upstream_url = start_upstream(log_dir)
        try:
            gateway, gateway_url = start_gateway(upstream_url, log_dir, *gateway_args, pythonpath=pythonpath)
            try:
                yield Servers(upstream_url, gateway_url, upstream, gateway, log_dir)
            except BaseException:
                for name, server in (("gateway", gateway), ("upstream", upstream)):  # their logs say why
                    print(f"{name} (exit code {server.process.poll()}) log:\n{server.log()[-4000:]}")
                raise
            finally:
                gateway.stop()
        finally:
            upstream.stop()


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt("SIGTERM")


def run_client(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """asyncio.run(main()) on uvloop; SIGTERM (from `timeout`, say) unwinds like Ctrl-C: servers stop."""
    signal.signal(signal.SIGTERM, _interrupt)
    use_uvloop()
    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        print("interrupted; the servers were stopped", file=sys.stderr)
        raise SystemExit(130) from None


def use_uvloop() -> None:
    """Run the client side on uvloop (as uvicorn runs the gateway), so the load generator stays cheap."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency of uvicorn[standard]
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) used so far by process `pid` (Linux /proc), or by this process when None."""
    if pid is None:
        return time.process_time()
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime and stime, fields 14 and 15 of stat(5)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear interpolation between order statistics (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds * 1000:.2f}"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain fixed-width table: first column left-aligned, the others right-aligned."""
    cells = [[str(cell) for cell in row] for row in rows]
    widths = [max(len(str(headers[i])), *(len(row[i]) for row in cells)) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        rest = [cell.rjust(width) for cell, width in zip(row[1:], widths[1:], strict=True)]
        return "  ".join([row[0].ljust(widths[0]), *rest])

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([line([str(h) for h in headers]), rule, *(line(row) for row in cells)])


def verdict(name: str, met: bool, measured: str) -> str:
    return f"target {name}: {'MET' if met else 'NOT MET'} (measured {measured})"
