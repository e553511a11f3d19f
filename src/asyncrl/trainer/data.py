"""The prompts a run draws from: load the rows, hand them out in a shuffled order, resume where it stopped.

Each row becomes one prompt group (its value is every sibling rollout's `input`). A pass over the data is an
epoch; each epoch is shuffled with `seed + epoch`, so the order is reproducible and a restart from a
checkpoint's `DataPosition` draws exactly the rows that would have come next.

A rows file is JSON lines, a JSON array, or parquet (as verl's data preprocessing writes it): parquet is told
by its magic bytes, not by the file's name, since a ConfigMap key is mounted as a file named `rows`. A folder
means every `*.parquet` file in it, in name order (a Hugging Face dataset's `train-00000-of-00002.parquet`).
A parquet row becomes a JSON object of its columns; nested columns (verl's `prompt`, a list of chat messages,
or `reward_model`, a struct) become JSON arrays and objects, so the agent template reads them as it reads a
JSON-lines row.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PARQUET_MAGIC = b"PAR1"  # the first (and last) four bytes of every parquet file


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
    """The rows of a JSON-lines, JSON-array or parquet file, or of a folder of parquet files."""
    if path.is_dir():
        files = sorted(path.glob("*.parquet"))
        if not files:
            raise DataError(
                f"data folder {path} holds no *.parquet files; give a file, or a folder of parquet"
            )
        return [row for file in files for row in parquet_rows(file)]
    try:
        with path.open("rb") as file:
            is_parquet = file.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
        if is_parquet:
            return parquet_rows(path)
        text = path.read_text()
    except OSError as error:
        raise DataError(f"cannot read data file {path}: {error.strerror}") from error
    except UnicodeDecodeError as error:
        raise DataError(
            f"{path} is neither text (JSON lines, a JSON array) nor parquet: {error.reason} at byte "
            f"{error.start}"
        ) from error
    return parse_rows(text, source=str(path))


def parquet_rows(path: Path) -> list[dict[str, Any]]:
    """Each row of a parquet file as a JSON object of its columns."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as error:
        raise DataError(
            f"{path} is a parquet file; reading it needs pyarrow (pip install pyarrow; the trainer image and "
            "'asyncrl[trainer]' have it)"
        ) from error
    try:
        table = pyarrow.parquet.read_table(path)
    except (pyarrow.ArrowException, OSError) as error:
        raise DataError(f"{path}: not a readable parquet file: {error}") from error
    if table.num_rows == 0:
        raise DataError(f"{path}: no rows")
    rows: list[dict[str, Any]] = table.to_pylist()
    return [
        {
            str(column): json_value(value, where=f"{path} row {index}, column {column!r}")
            for column, value in row.items()
        }
        for index, row in enumerate(rows)
    ]


def json_value(value: Any, *, where: str) -> Any:
    """A parquet value as JSON: NaN is a missing value (null, as pandas writes it), dates become ISO text.

    A rollout's input crosses HTTP as JSON, so bytes and infinities are refused here, naming the cell."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            raise DataError(f"{where}: {value} is not a JSON number")
        return value
    if isinstance(value, Mapping):
        return {str(key): json_value(item, where=where) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(item, where=where) for item in value]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    raise DataError(
        f"{where}: a {type(value).__name__} value has no JSON form; convert the column (e.g. bytes to text)"
    )


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
