"""The components' command lines, built from the run in one place for the operator and local mode.

The operator puts them in the trainer pod's containers (`operator/children.py`); local mode runs them as
processes (`local/run.py`). Only what differs between the two (where the key, config and checkpoints live,
the host to bind) is passed in; the run's own settings become flags here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

from asyncrl.api import AsyncTrainingRunSpec
from asyncrl.gateway.sampling import sampling_args


def pause_flags(spec: AsyncTrainingRunSpec) -> list[str]:
    """`asyncrl gateway` flags for the run's pause settings (`spec.gateway`)."""
    gateway = spec.gateway
    return [
        f"--retry-after-seconds={gateway.retry_after_seconds:.3f}",
        f"--pause-mode={gateway.pause_mode.value.lower()}",
        f"--hold-timeout-seconds={gateway.hold_timeout_seconds}",
        f"--max-held-calls={gateway.max_held_calls}",
    ]


def capture_flags(spec: AsyncTrainingRunSpec) -> list[str]:
    """`asyncrl gateway` flags for what the gateway keeps of each model call (`spec.gateway.capture`)."""
    gateway = spec.gateway
    return [
        f"--capture={gateway.capture.value.lower()}",
        f"--max-capture-bytes={gateway.max_capture_bytes}",
        f"--max-capture-bytes-per-rollout={gateway.max_capture_bytes_per_rollout}",
    ]


def gateway_args(
    spec: AsyncTrainingRunSpec, *, port: int, host: str | None = None, key_file: str | None = None
) -> list[str]:
    """`asyncrl gateway` arguments. No --upstream: the trainer registers its model servers
    (PUT /api/upstreams) once they listen, on ports they pick themselves (verl's vLLM replicas always do)."""
    return [
        *([f"--host={host}"] if host is not None else []),
        f"--port={port}",
        f"--model={spec.model.name}",
        *([f"--key-file={key_file}"] if key_file is not None else []),
        *pause_flags(spec),
        *capture_flags(spec),
        *sampling_args(spec.gateway.sampling_params, spec.trainer.rollout_sampling()),
    ]


def trainer_args(
    *,
    config: str | Path,
    gateway_url: str,
    checkpoint_dir: str | Path,
    metrics_port: int | None = None,
    wandb_dir: str | Path | None = None,
    metrics_file: str | Path | None = None,
) -> list[str]:
    """`asyncrl trainer` arguments: the run's manifest, its gateway and where checkpoints go."""
    optional = {"--metrics-port": metrics_port, "--wandb-dir": wandb_dir, "--metrics-file": metrics_file}
    return [
        f"--config={config}",
        f"--gateway-url={gateway_url}",
        f"--checkpoint-dir={checkpoint_dir}",
        *(f"{flag}={value}" for flag, value in optional.items() if value is not None),
    ]
