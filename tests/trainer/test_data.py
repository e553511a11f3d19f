"""Prompt rows: loading, clear errors, reproducible shuffles, resuming from a position."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.trainer.data import DataError, DataPosition, PromptSource, load_rows_file, parse_rows


def test_json_lines_and_json_arrays_both_load() -> None:
    assert parse_rows('{"q": 1}\n\n{"q": 2}\n', source="x") == [{"q": 1}, {"q": 2}]
    assert parse_rows('[{"q": 1}, {"q": 2}]', source="x") == [{"q": 1}, {"q": 2}]


def test_a_bad_line_is_named_by_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"q": 1}\n{"q": oops}\n')
    with pytest.raises(DataError, match=r"rows.jsonl line 2: not valid JSON"):
        load_rows_file(path)
    with pytest.raises(DataError, match="cannot read data file"):
        load_rows_file(tmp_path / "missing.jsonl")


def test_each_epoch_draws_every_row_once_in_a_reproducible_order() -> None:
    rows = list(range(7))
    source = PromptSource(rows, shuffle=True, seed=3)
    first = [source.draw()[1] for _ in range(7)]
    second = [source.draw()[1] for _ in range(7)]
    assert sorted(first) == sorted(second) == rows
    assert first != rows or second != rows  # shuffled
    again = PromptSource(rows, shuffle=True, seed=3)
    assert [again.draw()[1] for _ in range(14)] == first + second


def test_resuming_from_a_position_continues_the_same_sequence() -> None:
    rows = list(range(5))
    source = PromptSource(rows, shuffle=True, seed=1)
    drawn = [source.draw()[1] for _ in range(8)]
    resumed = PromptSource(rows, shuffle=True, seed=1, position=DataPosition(epoch=1, offset=0))
    assert [resumed.draw()[1] for _ in range(3)] == drawn[5:8]
    assert resumed.position == DataPosition(epoch=1, offset=3)
