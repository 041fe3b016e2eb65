"""`write_atomic`: a file replaced whole, through a temporary sibling and a rename, so a reader (or a crash)
sees the old file or the new one, never part of either. One helper for checkpoints' manifests, the data
source's state and the caches."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str, *, durable: bool = False) -> None:
    """`durable`: the bytes are on disk (fsync) before the rename, as a checkpoint's files must be; a cache
    or a state rewritten each rollout does without. A failed write leaves no temporary file behind."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
