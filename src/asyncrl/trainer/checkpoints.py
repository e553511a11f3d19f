"""The trainer's checkpoints: the backend's weights and optimizer, plus where the step loop stands.

A checkpoint is the backend's directory `step-NNNNNN/` (written atomically by the backend) and, beside it,
`step-NNNNNN.json` with the loop's state, written last and atomically: a checkpoint counts only when both
exist, so a crash mid-save leaves the previous one as the latest. The window itself is not saved here; the
gateway, which outlives the trainer container, is its source of truth on restart.

The verl backend's files are FSDP shards, one per rank, so a checkpoint fits only the world size (nodes x
GPUs per node) it was saved with: the loop state records it, and a resume with another is refused
(`recovery.resume_decision`).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from asyncrl.trainer.backends import TrainerBackend
from asyncrl.trainer.data import DataPosition

KEEP_LAST = 2


@dataclass(frozen=True)
class LoopState:
    step: int  # the next step to run (= the version of the saved weights)
    data_epoch: int
    data_offset: int
    # Groups the saved update trained on. The loop deletes them from the gateway right after saving; a
    # trainer that dies in between finds them there on restart and must delete, not train, them again.
    consumed_group_ids: tuple[str, ...] = ()
    # The ranks the backend's files are sharded over; None: not recorded (the Reference backend, whose
    # files do not depend on it, or a checkpoint saved before asyncrl recorded it).
    world_size: int | None = None

    @property
    def data_position(self) -> DataPosition:
        return DataPosition(epoch=self.data_epoch, offset=self.data_offset)


def _name(step: int) -> str:
    return f"step-{step:06d}"


async def save_checkpoint(root: Path, backend: TrainerBackend, state: LoopState) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / _name(state.step)
    await backend.save_checkpoint(path, step=state.step)
    marker = root / f"{_name(state.step)}.json"
    temporary = marker.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(asdict(state), sort_keys=True))
    os.replace(temporary, marker)
    _prune(root)
    return path


def latest_checkpoint(root: Path) -> tuple[Path, LoopState] | None:
    """The newest complete checkpoint under `root`, or None."""
    if not root.is_dir():
        return None
    for marker in sorted(root.glob("step-*.json"), reverse=True):
        path = root / marker.stem
        if path.is_dir():
            fields = json.loads(marker.read_text())
            fields["consumed_group_ids"] = tuple(fields.get("consumed_group_ids", ()))
            return path, LoopState(**fields)
    return None


def _prune(root: Path) -> None:
    markers = sorted(root.glob("step-*.json"), reverse=True)
    for marker in markers[KEEP_LAST:]:
        shutil.rmtree(root / marker.stem, ignore_errors=True)
        marker.unlink(missing_ok=True)
