"""Checkpoints of the reference backend: weights, optimizer state and step, written atomically.

A trainer container can be killed at any moment (preemption, OOM, a node drain), so a checkpoint directory
either holds a complete checkpoint or does not exist: everything is written into a temporary sibling
directory, flushed to disk, and renamed into place. Replacing an existing checkpoint renames the old one
aside first and deletes it after the new one is in place; a crash between those two renames leaves the old
checkpoint complete under `.<name>.old-*` next to `path`.

Layout: `model.pt` and `optimizer.pt` (torch state dicts, loaded with `weights_only=True`, so loading runs
no pickled code) and `checkpoint.json` (format, step, the model config the weights belong to).
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import torch
from transformers import PreTrainedModel

from asyncrl.trainer.backends.reference.config import ModelConfig

FORMAT = "asyncrl-reference-checkpoint/1"
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
META_FILE = "checkpoint.json"


def save_checkpoint(
    path: Path,
    *,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    step: int,
    model_config: ModelConfig,
) -> None:
    """Write a complete checkpoint to the directory `path`, replacing one that is there."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        torch.save(model.state_dict(), staging / MODEL_FILE)
        torch.save(optimizer.state_dict(), staging / OPTIMIZER_FILE)
        meta = {"format": FORMAT, "step": step, "model": model_config.model_dump()}
        (staging / META_FILE).write_text(json.dumps(meta, indent=2))
        for name in (MODEL_FILE, OPTIMIZER_FILE, META_FILE):
            _fsync(staging / name)
        _fsync(staging)
        _replace_dir(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def load_checkpoint(
    path: Path, *, model: PreTrainedModel, optimizer: torch.optim.Optimizer, model_config: ModelConfig
) -> int:
    """Restore weights and optimizer state in place and return the saved step.

    Raises FileNotFoundError when `path` holds no checkpoint, ValueError when it was written for another
    model shape or by another format.
    """
    path = Path(path)
    meta_path = path / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} ({META_FILE} is missing)")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != FORMAT:
        raise ValueError(f"checkpoint {path} has format {meta.get('format')!r}, expected {FORMAT!r}")
    saved_shape = ModelConfig.model_validate(meta["model"]).model_dump(exclude={"seed"})
    shape = model_config.model_dump(exclude={"seed"})  # the seed only chose the initial weights
    if saved_shape != shape:
        raise ValueError(f"checkpoint {path} is for model {saved_shape}, this backend runs {shape}")
    model.load_state_dict(torch.load(path / MODEL_FILE, weights_only=True))
    optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True))
    return int(meta["step"])


def _replace_dir(staging: Path, path: Path) -> None:
    if not path.exists():
        os.rename(staging, path)
    else:
        aside = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(path, aside)
        os.rename(staging, path)
        shutil.rmtree(aside, ignore_errors=True)
    _fsync(path.parent)


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
