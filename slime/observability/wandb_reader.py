"""Read an offline wandb run directory back (history rows and logged tables) without the network.

wandb 0.31 has no Python reader for its `.wandb` transaction log; the format is LevelDB's log
format (32 KiB blocks of CRC'd chunks) after a 7-byte `:W&B` header, each record a protobuf
`Record`. Used by the tests and handy for checking what a run actually holds.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterator

_BLOCK = 32768
_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _raw_records(data: bytes) -> Iterator[bytes]:
    pos, buf = _HEADER, b""
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        if kind == _FULL:
            yield chunk
        elif kind == _FIRST:
            buf = chunk
        elif kind == _MIDDLE:
            buf += chunk
        elif kind == _LAST:
            yield buf + chunk
            buf = b""


def find_run_dirs(root: str | Path) -> list[Path]:
    """Run directories (`*run-*` holding a `.wandb` file) under `root`."""
    return sorted({p.parent for p in Path(root).rglob("run-*.wandb")})


def _records(run_dir: str | Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    for f in sorted(Path(run_dir).glob("*.wandb")):
        for raw in _raw_records(f.read_bytes()):
            rec = wandb_internal_pb2.Record()
            try:
                rec.ParseFromString(raw)
            except Exception:  # noqa: BLE001 - a torn tail record of a live run
                continue
            yield rec


def is_closed(run_dir: str | Path) -> bool:
    """True once the run's exit record is on disk (wandb-core writes the log asynchronously)."""
    return any(rec.WhichOneof("record_type") == "exit" for rec in _records(run_dir))


def wait_closed(run_dir: str | Path, timeout: float = 15.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while not is_closed(run_dir):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def read_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every `run.log` row, values decoded from JSON (a table appears as its `table-file` ref dict)."""
    rows = []
    for rec in _records(run_dir):
        if rec.WhichOneof("record_type") != "history":
            continue
        row: dict[str, Any] = {}
        for item in rec.history.item:
            try:
                value = json.loads(item.value_json)
            except ValueError:
                value = item.value_json
            path = [item.key] if item.key else list(item.nested_key)
            target = row
            for part in path[:-1]:  # media (tables) are logged as nested keys
                target = target.setdefault(part, {})
            target[path[-1]] = value
        rows.append(row)
    return rows


def read_table(run_dir: str | Path, ref: dict) -> dict[str, Any]:
    """Load a logged table (`{"columns": [...], "data": [[...]]}`) from a history row's table-file ref."""
    return json.loads((Path(run_dir) / "files" / ref["path"]).read_text())
