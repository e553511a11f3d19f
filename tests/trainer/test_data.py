"""Prompt rows: loading, clear errors, reproducible shuffles, resuming from a position."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

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


def _verl_table() -> Any:
    """Two rows shaped like verl's preprocessed GSM8K parquet (examples/data_preprocess/gsm8k.py)."""
    import pyarrow

    return pyarrow.table(
        {
            "data_source": ["openai/gsm8k", "openai/gsm8k"],
            "prompt": [[{"role": "user", "content": "1+1?"}], [{"role": "user", "content": "2+2?"}]],
            "ability": ["math", "math"],
            "reward_model": [{"style": "rule", "ground_truth": "2"}, {"style": "rule", "ground_truth": "4"}],
            "extra_info": [{"index": 0, "split": "train"}, {"index": 1, "split": "train"}],
        }
    )


def test_a_verl_parquet_file_gives_one_json_object_per_row_with_nested_columns(tmp_path: Path) -> None:
    import pyarrow.parquet

    path = tmp_path / "train.parquet"
    pyarrow.parquet.write_table(_verl_table(), path)
    rows = load_rows_file(path)
    assert rows[1] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "2+2?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {"index": 1, "split": "train"},
    }
    assert json.loads(json.dumps(rows)) == rows  # what crosses HTTP as a rollout's input


def test_parquet_is_told_by_its_content_so_a_mounted_configmap_key_named_rows_loads(tmp_path: Path) -> None:
    import pyarrow.parquet

    path = tmp_path / "rows"  # how the operator mounts spec.data.configMapRef's key
    pyarrow.parquet.write_table(_verl_table(), path)
    assert [row["reward_model"]["ground_truth"] for row in load_rows_file(path)] == ["2", "4"]


def test_a_folder_of_parquet_files_loads_every_file_in_name_order(tmp_path: Path) -> None:
    import pyarrow
    import pyarrow.parquet

    folder = tmp_path / "data"
    folder.mkdir()
    pyarrow.parquet.write_table(pyarrow.table({"q": [3, 4]}), folder / "train-00001-of-00002.parquet")
    pyarrow.parquet.write_table(pyarrow.table({"q": [1, 2]}), folder / "train-00000-of-00002.parquet")
    (folder / "README.md").write_text("not data")
    assert load_rows_file(folder) == [{"q": 1}, {"q": 2}, {"q": 3}, {"q": 4}]
    with pytest.raises(DataError, match=r"holds no \*\.parquet files"):
        load_rows_file(tmp_path)  # holds only the folder


def test_parquet_values_without_a_json_form_are_refused_naming_row_and_column(tmp_path: Path) -> None:
    import pyarrow
    import pyarrow.parquet

    path = tmp_path / "t.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"q": ["a", "b"], "blob": [None, b"\x00"]}), path)
    with pytest.raises(DataError, match=r"t.parquet row 1, column 'blob': a bytes value has no JSON form"):
        load_rows_file(path)


def test_nan_in_parquet_is_a_missing_value_and_infinity_is_refused(tmp_path: Path) -> None:
    import pyarrow
    import pyarrow.parquet

    path = tmp_path / "t.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"score": [1.5, math.nan]}), path)
    assert load_rows_file(path) == [{"score": 1.5}, {"score": None}]
    pyarrow.parquet.write_table(pyarrow.table({"score": [math.inf]}), path)
    with pytest.raises(DataError, match=r"row 0, column 'score': inf is not a JSON number"):
        load_rows_file(path)


def test_a_broken_or_empty_parquet_file_and_a_binary_file_get_one_clear_error(tmp_path: Path) -> None:
    import pyarrow
    import pyarrow.parquet

    whole = tmp_path / "whole.parquet"
    pyarrow.parquet.write_table(_verl_table(), whole)
    cut = tmp_path / "cut.parquet"
    cut.write_bytes(whole.read_bytes()[:100])
    with pytest.raises(DataError, match=r"cut.parquet: not a readable parquet file"):
        load_rows_file(cut)
    empty = tmp_path / "empty.parquet"
    pyarrow.parquet.write_table(_verl_table().slice(0, 0), empty)
    with pytest.raises(DataError, match=r"empty.parquet: no rows"):
        load_rows_file(empty)
    binary = tmp_path / "rows.bin"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DataError, match=r"rows.bin is neither text .* nor parquet"):
        load_rows_file(binary)
