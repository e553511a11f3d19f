"""Checkpoints of the reference backend: weights, optimizer state and step, written atomically.

The directory is written through `staged_directory`: it holds a complete checkpoint or does not exist.

Layout: `model.pt` and `optimizer.pt` (torch state dicts, loaded with `weights_only=True`, so loading runs
no pickled code) and `checkpoint.json` (format, step, the model config the weights belong to).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel

from asyncrl.trainer.backends.reference.config import ModelConfig
from asyncrl.trainer.backends.staging import read_checkpoint_meta, staged_directory, write_checkpoint_meta

FORMAT = "asyncrl-reference-checkpoint/1"
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"


def save_checkpoint(
    path: Path,
    *,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    step: int,
    model_config: ModelConfig,
) -> None:
    """Write a complete checkpoint to the directory `path`, replacing one that is there."""
    with staged_directory(path) as staging:
        torch.save(model.state_dict(), staging / MODEL_FILE)
        torch.save(optimizer.state_dict(), staging / OPTIMIZER_FILE)
        write_checkpoint_meta(staging, format=FORMAT, step=step, model=model_config.model_dump())


def load_checkpoint(
    path: Path, *, model: PreTrainedModel, optimizer: torch.optim.Optimizer, model_config: ModelConfig
) -> int:
    """Restore weights and optimizer state in place and return the saved step.

    Raises FileNotFoundError when `path` holds no checkpoint, ValueError when it was written for another
    model shape or by another format.
    """
    path = Path(path)
    meta = read_checkpoint_meta(path, format=FORMAT)
    saved_shape = ModelConfig.model_validate(meta["model"]).model_dump(exclude={"seed"})
    shape = model_config.model_dump(exclude={"seed"})  # the seed only chose the initial weights
    if saved_shape != shape:
        raise ValueError(f"checkpoint {path} is for model {saved_shape}, this backend runs {shape}")
    model.load_state_dict(torch.load(path / MODEL_FILE, weights_only=True))
    optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE, weights_only=True))
    return int(meta["step"])
