"""The prompts a run draws from: load the rows, hand them out in a shuffled order, resume where it stopped.

Each row becomes one prompt group (its value is every sibling rollout's `input`). A pass over the data is an
epoch; each epoch is shuffled with `seed + epoch`, so the order is reproducible and a restart from a
checkpoint's `DataPosition` draws exactly the rows that would have come next.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """The rows cannot be loaded; the message names the file (or field) and the problem."""


@dataclass(frozen=True)
class DataPosition:
    epoch: int = 0
    offset: int = 0  # rows of this epoch already drawn


def parse_rows(text: str, *, source: str) -> list[Any]:
    """Rows from a JSON array or from JSON lines (blank lines ignored)."""
    stripped = text.strip()
    if not stripped:
        raise DataError(f"{source}: no rows")
    if stripped.startswith("["):
        try:
            rows = json.loads(stripped)
        except ValueError as error:
            raise DataError(f"{source}: not a valid JSON array: {error}") from error
        if not isinstance(rows, list) or not rows:
            raise DataError(f"{source}: expected a non-empty JSON array of rows")
        return rows
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise DataError(
                f"{source} line {number}: not valid JSON ({error.msg}); expected one row per line"
            ) from error
    return rows


def load_rows_file(path: Path) -> list[Any]:
    try:
        text = path.read_text()
    except OSError as error:
        raise DataError(f"cannot read data file {path}: {error.strerror}") from error
    return parse_rows(text, source=str(path))


class PromptSource:
    """Draws rows one at a time, epoch after epoch, from a fixed list."""

    def __init__(
        self, rows: list[Any], *, shuffle: bool, seed: int, position: DataPosition | None = None
    ) -> None:
        if not rows:
            raise DataError("the run has no rows to draw prompts from")
        self._rows = rows
        self._shuffle = shuffle
        self._seed = seed
        self._position = position or DataPosition()
        self._order = self._epoch_order(self._position.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self._rows)))
        if self._shuffle:
            random.Random(self._seed + epoch).shuffle(order)
        return order

    def at(self, position: DataPosition) -> PromptSource:
        """The same rows and shuffle, continuing from `position` (a checkpoint's)."""
        return PromptSource(self._rows, shuffle=self._shuffle, seed=self._seed, position=position)

    @property
    def position(self) -> DataPosition:
        return self._position

    @property
    def n_rows(self) -> int:
        return len(self._rows)

    def draw(self) -> tuple[int, Any]:
        """(row index, row) of the next prompt; a new shuffled epoch starts when one is used up."""
        epoch, offset = self._position.epoch, self._position.offset
        if offset >= len(self._order):
            epoch, offset = epoch + 1, 0
            self._order = self._epoch_order(epoch)
        index = self._order[offset]
        self._position = DataPosition(epoch=epoch, offset=offset + 1)
        return index, self._rows[index]
