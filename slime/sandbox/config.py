"""The sandbox server's limits and defaults (`SandboxConfig`: runs; `SessionSettings`: sessions), set once at
start from the server's flags (`slime.sandbox.flags.SandboxFlags`, whose defaults are these)."""

from __future__ import annotations

from dataclasses import dataclass, field

# Modules a run's Python finds already imported. Each one costs every run a little (the fork server's
# memory is copied and torn down per run); these are the common, cheap ones of generated solutions.
# Heavier, rarer ones (dataclasses, statistics, decimal, datetime, threading, numpy) load on use, and
# `random` too (preloaded, it would reseed itself after every fork).
PRELOAD = [
    "re",
    "math",
    "json",
    "collections",
    "itertools",
    "functools",
    "heapq",
    "bisect",
    "string",
    "typing",
    "copy",
    "operator",
    "array",
    "struct",
    "time",
    "resource",
    "types",
    "builtins",
    "atexit",
]


@dataclass
class SandboxConfig:
    max_concurrency: int = 4
    isolate: bool = True  # False only with --allow-no-isolation
    uid_base: int | None = None  # first run uid; None: the first free range (`uids.py`)
    python: str | None = None  # interpreter for `python` (runs the fork servers too)
    root_dir: str | None = None
    default_memory_mb: int = 512
    min_memory_mb: int = 32
    max_memory_mb: int = 4096
    max_run_timeout: float = 120.0
    max_compile_timeout: float = 60.0
    max_output_bytes: int = 1 << 20  # per stream
    max_processes: int = 128  # processes and threads of a run (ThreadPoolExecutor(64) must start)
    max_file_mb: int = 64
    disk_mb: int = 256  # the run's tmpfs (/tmp and /dev/shm together)
    max_open_files: int = 256
    cpus_per_run: float = 1.0  # cgroup CPU bandwidth: CPU time of a run <= wall time x this
    max_body_mb: int = 32
    max_inodes: int = 65536  # of a run's tmpfs
    max_files: int = 60000  # request files (with their directories, within max_inodes)
    max_env_vars: int = 4096  # a session's or an exec's environment variables
    max_env_bytes: int = 1 << 19  # their names and values (a session's and an exec's together fit the kernel's ARG_MAX)
    max_fetch_mb: int = 64  # total of fetched files per request
    compile_memory_mb: int = 1024
    # [host, inside] read-only binds (`ro_binds.py`): --ro-bind's and --ro-path's, one mechanism
    ro_binds: list[list[str]] = field(default_factory=list)
    preload: list[str] = field(default_factory=lambda: list(PRELOAD))


@dataclass(frozen=True)
class SessionSettings:
    """The server's side of sessions: egress targets by name, where they appear inside, and the caps."""

    egress_targets: dict[str, tuple[str, int]] = field(default_factory=dict)
    egress_port: int = 80  # inside the slot; any port: bound before any command of the session (slot_session.py)
    max_sessions: int = 4
    max_exec_timeout: float = 3600.0
    max_egress_connections: int = 64
    egress_budget: int | None = None  # egress connections of all sessions together (`open_files.py`); None: no bound
    max_disk_mb: int = 4096  # a session's tmpfs, at most (its memory limit counts the files too)
    idle_timeout: float = 600.0  # default; a request may ask less or more, up to max_lifetime
    max_lifetime: float = 24 * 3600.0
