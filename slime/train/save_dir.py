"""The `--save` directory before anything starts: writable, with room for a checkpoint, and one writer.

Why before Ray: a read-only or full directory used to be found at the first save, after a rollout
had trained, with safetensors' `No space left on device` naming neither the flag nor the path; and
two runs given one directory overwrote each other's checkpoints. The lock is a `flock` on the
directory itself (no file to leave behind; the kernel drops it when the holder dies).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import struct
from pathlib import Path

MB = 1 << 20
ROOM_MARGIN = 1.1  # free space asked for beyond one checkpoint's estimate (config, tokenizer, manifest)


class SaveDirError(ValueError):
    """--save cannot be used; the message names the flag and the directory."""


def parameter_count(hf_checkpoint: str | Path) -> int:
    """Parameters of a HF model, from its safetensors headers (no tensor is read)."""
    total = 0
    for path in Path(hf_checkpoint).glob("*.safetensors"):
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name != "__metadata__":
                count = 1
                for dim in t["shape"]:
                    count *= dim
                total += count
    return total


def checkpoint_bytes(hf_checkpoint: str | Path | None, with_optimizer: bool) -> int:
    """Bytes one trainer checkpoint takes: float32 weights, plus AdamW's two float32 moments."""
    if not hf_checkpoint or not Path(hf_checkpoint).is_dir():
        return 0
    return parameter_count(hf_checkpoint) * 4 * (3 if with_optimizer else 1)


def check_save_dir(directory: str | Path, need_bytes: int = 0) -> None:
    """Create `directory`, prove a file can be written and renamed there, and that `need_bytes` fit."""
    d = Path(directory)
    try:
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".slime-write-probe-{os.getpid()}"
        probe.write_bytes(b"0")
        probe.replace(probe.with_name(probe.name + ".renamed"))
        probe.with_name(probe.name + ".renamed").unlink()
    except OSError as e:
        raise SaveDirError(f"--save {d}: not writable ({e.strerror or e})") from None
    free = shutil.disk_usage(d).free
    if need_bytes and free < need_bytes * ROOM_MARGIN:
        raise SaveDirError(
            f"--save {d}: {free / MB:.0f} MB free, a checkpoint needs about "
            f"{need_bytes * ROOM_MARGIN / MB:.0f} MB (float32 weights and AdamW moments of "
            f"--hf-checkpoint, plus {ROOM_MARGIN - 1:.0%}); free space or use --no-save-optim"
        )


class SaveDirLock:
    """Held by the run that writes `--save DIR` for as long as it runs; a second run is refused."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._fd: int | None = None

    def __enter__(self) -> "SaveDirLock":
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise SaveDirError(
                    f"--save {self.directory}: another run is writing checkpoints there (the "
                    "directory is locked); give each run its own --save directory"
                ) from None
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None
