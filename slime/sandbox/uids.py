"""Each sandbox server's own range of run uids, so two servers on a host never share one.

Why: the kernel keeps some limits per uid (processes, pipe pages, signals, message queues); two
servers whose runs used the same uids would throttle each other. A server claims one lock file per
uid (``flock``, held for its life: the kernel drops it when the server dies, even SIGKILLed) and
skips uids some process already runs as. Without ``--uid-base`` the first free range from 61000 on
is taken; with it, exactly that range or a clear error.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile

FIRST_UID = 61000
LAST_UID = 65000  # (below nobody/nogroup, 65534)


class UidRangeBusy(RuntimeError):
    """The asked uid range is taken by another server or used by running processes."""


def lock_dir() -> str:
    """A root-only directory for the lock files (``/run`` when it is writable, else the temp dir)."""
    base = "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()
    d = os.path.join(base, "slime-sandbox-uids")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


def uids_in_use() -> set[int]:
    """Real and effective uids of the host's processes now (a range with one of them is skipped)."""
    used: set[int] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        used.update(int(x) for x in line.split()[1:3])
                        break
    return used


class UidRange:
    """``count`` consecutive uids from ``base``, held until `release()` (or the process ends)."""

    def __init__(self, base: int, count: int, fds: list[int]) -> None:
        self.base, self.count, self._fds = base, count, fds

    @property
    def last(self) -> int:
        return self.base + self.count - 1

    @classmethod
    def claim(cls, count: int, base: int | None = None, directory: str | None = None) -> "UidRange":
        """Claim `count` uids from `base`, or (None) the first free range of them from 61000 on."""
        directory = directory or lock_dir()
        used = uids_in_use()
        if base is not None:
            got = cls._try(base, count, directory, used)
            if isinstance(got, str):
                raise UidRangeBusy(f"--uid-base {base}: uids {base}-{base + count - 1} are not free ({got})")
            return got
        for start in range(FIRST_UID, LAST_UID - count + 1, count):
            got = cls._try(start, count, directory, used)
            if not isinstance(got, str):
                return got
        raise UidRangeBusy(f"no free range of {count} uids between {FIRST_UID} and {LAST_UID}")

    @classmethod
    def _try(cls, base: int, count: int, directory: str, used: set[int]) -> "UidRange | str":
        """The range, or why not."""
        busy = sorted(used.intersection(range(base, base + count)))
        if busy:
            return f"uid {busy[0]} runs processes"
        fds: list[int] = []
        for uid in range(base, base + count):
            fd = os.open(os.path.join(directory, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                for held in fds:
                    os.close(held)
                return f"uid {uid} is held by sandbox server pid {holder}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            fds.append(fd)
        return cls(base, count, fds)

    def release(self) -> None:
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
