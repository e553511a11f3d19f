"""Runs with the verl backend, and verl's config for them (composed from verl's own Hydra files, on CPU)."""

from __future__ import annotations

from typing import Any

from asyncrl.api import AsyncTrainingRun, load_run
from asyncrl.trainer.backends.verl.config import compose_verl_config, verl_settings
from tests.support.kube import run_manifest


def verl_manifest(
    name: str = "verl-run", *, trainer: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    manifest = run_manifest(name, **spec)
    manifest["spec"]["trainer"] = {"backend": "Verl", "gpus": 1, **(trainer or {})}
    return manifest


def verl_run(**kwargs: Any) -> AsyncTrainingRun:
    return load_run(verl_manifest(**kwargs))


def verl_config(**kwargs: Any) -> Any:
    """verl's DictConfig for a run built from `verl_manifest(**kwargs)`."""
    return compose_verl_config(verl_settings(verl_run(**kwargs), checkpoint_dir=None))
