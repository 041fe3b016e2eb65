"""`slime-sandbox`'s flags as one frozen, typed config (`SandboxFlags`): its fields generate the server's parser
(`slime.sandbox.server._parser`), and `main` reads the parsed namespace once (`SandboxFlags.from_args`) and hands
the config down; nothing below reads `args`. The limits' defaults are written once, in `SandboxConfig` and
`SessionSettings` (`config.py`, which tests and callers build directly); the fields here name them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from slime.sandbox.config import SandboxConfig, SessionSettings
from slime.utils.flag_config import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, FlagConfig, Range, flag

_RUN = SandboxConfig()
_SESSION = SessionSettings()
TCP_PORT = Range(1, 65535, text="a TCP port (1-65535)")


@dataclass(frozen=True)
class SandboxFlags(FlagConfig):
    host: str = flag("127.0.0.1")
    port: int = flag(8080, type=int, range=Range(0, 65535, text="a TCP port, or 0 for any free one"))
    fd: int | None = flag(None, type=int, help="serve on this already-bound listening socket")
    lifeline_fd: int | None = flag(None, type=int, help="read end of a pipe held by the parent: exit when it closes")
    max_concurrency: int = flag(min(8, os.cpu_count() or 2), type=int, range=AT_LEAST_ONE)
    max_queue: int | None = flag(
        None, type=int, help="waiting runs before 429 (default 16x concurrency)", range=NON_NEGATIVE
    )
    allow_no_isolation: bool = flag(
        False,
        action="store_true",
        help="run even when namespaces/uid switching are unavailable (rlimits only): UNSAFE",
    )
    python: str | None = flag(None, help="interpreter for `python` runs (default /usr/bin/python3)")
    uid_base: int | None = flag(
        _RUN.uid_base,
        type=int,
        help="run i uses uid uid_base+slot (default: the first range no other server holds)",
        range=Range(1, text=">= 1 (uid 0 is root)"),
    )
    default_memory_mb: int = flag(_RUN.default_memory_mb, type=int, range=AT_LEAST_ONE)
    max_memory_mb: int = flag(_RUN.max_memory_mb, type=int, range=AT_LEAST_ONE)
    max_run_timeout: float = flag(_RUN.max_run_timeout, type=float, range=POSITIVE)
    max_output_bytes: int = flag(_RUN.max_output_bytes, type=int, range=AT_LEAST_ONE)
    max_processes: int = flag(_RUN.max_processes, type=int, range=AT_LEAST_ONE)
    max_file_mb: int = flag(_RUN.max_file_mb, type=int, range=AT_LEAST_ONE)
    disk_mb: int = flag(_RUN.disk_mb, type=int, help="size of a run's tmpfs (/tmp and /dev/shm)", range=AT_LEAST_ONE)
    cpus_per_run: float = flag(_RUN.cpus_per_run, type=float, help="cgroup CPU bandwidth of one run", range=POSITIVE)
    max_body_mb: int = flag(_RUN.max_body_mb, type=int, help="larger request bodies get 413", range=AT_LEAST_ONE)
    max_fetch_mb: int = flag(_RUN.max_fetch_mb, type=int, help="total of fetch_files per request", range=AT_LEAST_ONE)
    body_timeout: float = flag(
        30.0, type=float, help="seconds to receive a request body; a slower one gets 408", range=POSITIVE
    )
    max_bodies: int | None = flag(
        None,
        type=int,
        help="request bodies in memory at once (default: --max-concurrency, at least 4)",
        range=AT_LEAST_ONE,
    )
    max_connections: int = flag(1024, type=int, help="open connections before 503", range=AT_LEAST_ONE)
    ro_path: list[str] = flag(
        [],
        action="append",
        metavar="PATH",
        help="show a host path read-only at its own path in every slot: --ro-bind PATH, the same checks",
    )
    ro_bind: list[str] = flag(
        [],
        action="append",
        metavar="HOST[:INSIDE]",
        help="bind a host directory read-only into every slot (at INSIDE, default the same path), "
        "e.g. agent CLIs; refused at start if missing",
    )
    egress: list[str] = flag(
        [],
        action="append",
        metavar="NAME=HOST:PORT",
        help="a target sessions may ask for by NAME as their one way out (default: none)",
    )
    egress_port: int = flag(
        _SESSION.egress_port,
        type=int,
        help="where a session's egress listens inside its sandbox (127.0.0.1:PORT)",
        range=TCP_PORT,
    )
    max_sessions: int | None = flag(
        None, type=int, help="open sessions at most (default --max-concurrency)", range=AT_LEAST_ONE
    )
    max_session_exec_timeout: float = flag(_SESSION.max_exec_timeout, type=float, range=POSITIVE)
    session_idle_timeout: float = flag(
        _SESSION.idle_timeout,
        type=float,
        help="default seconds a session may stay idle before it is closed",
        range=POSITIVE,
    )
    max_session_lifetime: float = flag(_SESSION.max_lifetime, type=float, range=POSITIVE)
    max_session_disk_mb: int = flag(_SESSION.max_disk_mb, type=int, range=AT_LEAST_ONE)
    max_egress_connections: int = flag(
        _SESSION.max_egress_connections, type=int, help="open egress connections per session", range=AT_LEAST_ONE
    )
    log_level: str = flag("warning")

    @property
    def queue(self) -> int:
        """Runs that may wait for a place (--max-queue, default 16x --max-concurrency)."""
        return self.max_queue if self.max_queue is not None else 16 * self.max_concurrency

    @property
    def bodies(self) -> int:
        """Request bodies in memory at once (--max-bodies, default --max-concurrency, at least 4)."""
        return self.max_bodies or max(4, self.max_concurrency)

    def run_config(self, ro_binds: list[list[str]]) -> SandboxConfig:
        """The runs' limits (`ro_binds`: --ro-bind's and --ro-path's, checked by `ro_binds.parse_ro_binds`)."""
        return SandboxConfig(
            max_concurrency=self.max_concurrency,
            python=self.python,
            uid_base=self.uid_base,
            default_memory_mb=self.default_memory_mb,
            max_memory_mb=self.max_memory_mb,
            max_run_timeout=self.max_run_timeout,
            max_output_bytes=self.max_output_bytes,
            max_processes=self.max_processes,
            max_file_mb=self.max_file_mb,
            disk_mb=self.disk_mb,
            cpus_per_run=self.cpus_per_run,
            max_body_mb=self.max_body_mb,
            max_fetch_mb=self.max_fetch_mb,
            ro_binds=ro_binds,
        )

    def session_settings(self, egress_budget: int | None = None) -> SessionSettings:
        """The sessions' settings (the values' ranges are the fields', checked by `serve` first); ValueError
        names a bad --egress."""
        from slime.sandbox.egress import parse_egress_targets

        return SessionSettings(
            egress_targets=parse_egress_targets(self.egress),
            egress_port=self.egress_port,
            max_sessions=self.max_sessions or self.max_concurrency,
            max_exec_timeout=self.max_session_exec_timeout,
            idle_timeout=self.session_idle_timeout,
            max_lifetime=self.max_session_lifetime,
            max_disk_mb=self.max_session_disk_mb,
            max_egress_connections=self.max_egress_connections,
            egress_budget=egress_budget,
        )
