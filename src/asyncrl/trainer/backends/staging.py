"""Write a directory atomically: into a temporary sibling, flushed to disk, then renamed into place.

A trainer container can be killed at any moment (preemption, OOM, a node drain), so a checkpoint directory
either holds a complete checkpoint or does not exist. Replacing an existing directory renames the old one
aside first and deletes it after the new one is in place; a crash between those two renames leaves the old
one complete under `.<name>.old-*` next to `path`. Every backend's checkpoints are written through this,
and each carries `checkpoint.json` (its format and step, and what the backend adds), read back by
`read_checkpoint_meta`.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

META_FILE = "checkpoint.json"


@contextmanager
def staged_directory(path: Path) -> Iterator[Path]:
    """Yield an empty staging directory; when the block ends without error it becomes `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        for folder, _, files in os.walk(staging):
            for name in files:
                _fsync(Path(folder) / name)
            _fsync(Path(folder))
        _replace_dir(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_checkpoint_meta(directory: Path, *, format: str, step: int, **extra: Any) -> None:
    """`checkpoint.json` in `directory` (a staging directory): the format, the step and `extra`."""
    meta = {"format": format, "step": step, **extra}
    (directory / META_FILE).write_text(json.dumps(meta, indent=2))


def read_checkpoint_meta(path: Path, *, format: str) -> dict[str, Any]:
    """The checkpoint.json of the checkpoint at `path`.

    Raises FileNotFoundError when `path` holds no checkpoint, ValueError when another format wrote it.
    """
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path} ({META_FILE} is missing)")
    meta: dict[str, Any] = json.loads(meta_path.read_text())
    if meta.get("format") != format:
        raise ValueError(f"checkpoint {path} has format {meta.get('format')!r}, expected {format!r}")
    return meta


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
