"""Read the history of an offline W&B run (`run-*.wandb`) back, to check what the trainer logged.

The file is W&B's LevelDB-style log (a 7-byte file header, then 32 KiB blocks of records with a 7-byte
header each: crc32, length, type FULL/FIRST/MIDDLE/LAST) of `wandb_internal_pb2.Record` protobufs. wandb
0.2x+ no longer ships a Python reader, so this small one lives with the tests.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32 * 1024
FILE_HEADER = 7
RECORD_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _records(data: bytes) -> list[bytes]:
    records: list[bytes] = []
    position = FILE_HEADER
    pending = b""
    while position + RECORD_HEADER <= len(data):
        left_in_block = BLOCK - (position % BLOCK)
        if left_in_block < RECORD_HEADER:
            position += left_in_block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position : position + RECORD_HEADER])
        position += RECORD_HEADER
        chunk = data[position : position + length]
        position += length
        if kind == FULL:
            records.append(chunk)
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            records.append(pending + chunk)
            pending = b""
        elif kind == 0 and length == 0:
            position += left_in_block - RECORD_HEADER  # zero padding to the block's end
    return records


def history(run_dir: Path) -> list[dict[str, object]]:
    """Every `wandb.log` call of the offline run in `run_dir`, as {key: value}."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    rows: list[dict[str, object]] = []
    for raw in _records(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows
