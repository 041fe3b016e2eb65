"""`metrics.jsonl`: the same numbers as the wandb dashboards, for people without a wandb account.

One JSON object per logging call: `{"time", "kind", "rollout_id", "step_key", "step", "metrics"}`.
Lines are appended with a single `write` on an O_APPEND file so the manager and controller
processes can share one file; readers skip a torn last line.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterator

from slime.observability.flags import ObservabilityConfig

FILENAME = "metrics.jsonl"


def metrics_dir(config: ObservabilityConfig, wandb_run: Any = None) -> Path | None:
    """--metrics-dir, else --rollout-data-dir, else the wandb run's directory, else None (off)."""
    value = config.metrics_dir or config.rollout_data_dir
    if value:
        return Path(value)
    return Path(wandb_run.dir) if wandb_run is not None else None


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    try:
        return float(v)
    except (TypeError, ValueError):
        return str(v)


def append_metrics(
    path: str | Path, metrics: dict, *, kind: str, rollout_id: int | None, step_key: str | None, step: int | None
) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(
        {
            "time": time.time(),
            "kind": kind,
            "rollout_id": rollout_id,
            "step_key": step_key,
            "step": step,
            "metrics": {k: _clean(v) for k, v in metrics.items()},
        }
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_metrics(path: str | Path) -> Iterator[dict]:
    """Records of a metrics.jsonl (or of `DIR/metrics.jsonl`); malformed lines are skipped."""
    path = Path(path)
    if path.is_dir():
        path = path / FILENAME
    if not path.exists():
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("metrics"), dict):
                yield rec
