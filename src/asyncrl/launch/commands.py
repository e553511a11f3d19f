"""The components' command lines, built in one place for the operator and local mode.

The operator puts them in the trainer pod's containers (`workloads/children.py`); local mode runs them as
processes (`local/run.py`). Both components read the run's own settings from its manifest (`--config`, the
same `run.yaml`), so none of them is a flag here; only what differs between the two modes is passed in (where
the run file, key and checkpoints live, the host and port to bind).
"""

from __future__ import annotations

from pathlib import Path


def gateway_args(
    *, config: str | Path, port: int, host: str | None = None, key_file: str | None = None
) -> list[str]:
    """`asyncrl gateway` arguments: the run's manifest, where to listen and the key. No --upstream: the
    trainer registers its model servers (PUT /api/upstreams) once they listen, on ports they pick themselves
    (verl's vLLM replicas always do)."""
    return [
        f"--config={config}",
        *([f"--host={host}"] if host is not None else []),
        f"--port={port}",
        *([f"--key-file={key_file}"] if key_file is not None else []),
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
