"""``--ro-bind HOST[:INSIDE]``: host files and directories (agent CLIs, a checkout, a venv) bound read-only
into every slot, at INSIDE (default: the host path, so a venv's ``pyvenv.cfg`` and shebangs work unchanged);
``--ro-path PATH`` is ``--ro-bind PATH`` (PATH taken whole), and ``--python``'s prefix is bound so too.
As bubblewrap does, the sandbox builds its own ``/tmp``, ``/mnt``, ``/home``, ``/workspace`` (fresh, per run)
and ``/etc``, shows the host's ``/usr`` read-only, and then nests each bind below them (`isolation.py`).
Checked once at start, each error naming the flag: the host path must exist; INSIDE must be absolute, not under
``/dev``, ``/proc``, ``/sys`` or the links into ``/usr``, must not hide what the sandbox makes (``/tmp`` or a
parent, ``/home/agent``, ``/etc/passwd``, ...), nor lie inside another bind, nor be given twice; under ``/usr``
its mount point must already exist. Read-only, nosuid and nodev, submounts included: no writable host path
ever enters a slot.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from slime.sandbox.isolation import LINKED, RUN_DIRS

NEVER = ("/dev", "/proc", "/sys", "/.old")  # (/.old: where the host's root is left while the slot's is built)
USR_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # links to (or binds of) the host's /usr/...
# what the sandbox makes itself: a bind there, or at a parent of one, would hide it
MADE = (
    "/tmp",
    "/mnt",
    "/home",
    "/workspace",
    "/usr",
    "/etc",
    "/home/agent",
    "/home/root",
    "/etc/passwd",
    "/etc/group",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/nsswitch.conf",
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/alternatives",
)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


def slot_path(inside: str) -> str:
    """Where a path is in a slot: /home and /workspace are links into /mnt."""
    link = next((k for k in LINKED if _under(inside, k)), None)
    return inside if link is None else LINKED[link] + inside[len(link) :]


def already_visible(host: str, inside: str) -> bool:
    """The host's own path under ``/usr``, at that same path: the slot shows it already (no mount)."""
    return host == inside and _under(inside, "/usr")


def parse_ro_binds(specs: list[str], ro_paths: Sequence[str] = ()) -> list[list[str]]:
    """``["/h/clis:/opt/clis", "/tmp/co"]`` -> ``[["/h/clis", "/opt/clis"], ["/tmp/co", "/tmp/co"]]`` (host
    paths resolved), the ``--ro-path``s first, each ``[path, path]``; a bind that another one already shows
    (same host subtree) is dropped. Each error names its flag and value."""
    named = [(f"--ro-path {p!r}", p, "") for p in ro_paths]
    named += [(f"--ro-bind {s!r}", *s.partition(":")[::2]) for s in specs]
    out: list[list[str]] = []
    for flag, host, inside in named:
        host, inside = _parse_one(flag, host, inside)
        for other_host, other_inside in out:
            if slot_path(inside) == slot_path(other_inside):
                raise ValueError(f"{flag}: {inside!r} is already bound from {other_host!r}")
        out.append([host, inside])
    return _without_nested(out, [flag for flag, _, _ in named])


def _parse_one(flag: str, host: str, inside: str) -> tuple[str, str]:
    host = os.path.expanduser(host)
    if not host or not os.path.exists(host):
        raise ValueError(f"{flag}: the host path {host!r} does not exist")
    inside = os.path.normpath(inside or os.path.abspath(host))
    if not os.path.isabs(inside) or inside == "/":
        raise ValueError(f"{flag}: the path inside ({inside!r}) must be absolute and not /")
    host = os.path.realpath(host)
    if already_visible(host, inside):
        return host, inside
    hit = next((r for r in NEVER + USR_LINKS if _under(inside, r)), None)
    if hit:
        where = "a link into /usr: bind below /usr/... instead" if hit in USR_LINKS else "never bindable"
        raise ValueError(f"{flag}: {inside!r} is under {hit}, {where}")
    hidden = next((m for m in MADE if _under(slot_path(m), slot_path(inside))), None)
    if hidden:
        raise ValueError(
            f"{flag}: {inside!r} would hide {hidden}, which the sandbox makes itself; "
            "bind below it (e.g. /tmp/..., /opt/...)"
        )
    if _under(inside, "/usr"):
        _check_usr_mount_point(flag, host, inside)
    return host, inside


def _check_usr_mount_point(flag: str, host: str, inside: str) -> None:
    """The slot's /usr is the host's, read-only: a bind there needs the mount point to exist on the host
    already (the sandbox never creates anything on the host), of the same kind, and reached without links."""
    if not os.path.lexists(inside):
        raise ValueError(
            f"{flag}: {inside!r} does not exist on the host, and the slot's /usr is the "
            "host's, read-only; create it on the host or bind elsewhere (e.g. /opt/...)"
        )
    if os.path.realpath(inside) != inside:
        raise ValueError(
            f"{flag}: {inside!r} goes through a link on the host "
            f"(to {os.path.realpath(inside)!r}); bind at the real path"
        )
    if os.path.isdir(host) != os.path.isdir(inside):
        kind = "directory" if os.path.isdir(inside) else "file"
        raise ValueError(f"{flag}: {inside!r} is a {kind} on the host; {host!r} is not")


def _without_nested(binds: list[list[str]], flags: list[str]) -> list[list[str]]:
    """A bind inside another: dropped when the outer one shows the same host files there already; else
    refused (its mount point would have to be made inside a read-only host directory)."""
    kept = []
    for i, (host, inside) in enumerate(binds):
        outer = next(
            (
                (h, p)
                for h, p in binds
                if slot_path(inside).startswith(slot_path(p) + "/") and not already_visible(h, p)
            ),
            None,
        )
        if outer is None:
            kept.append([host, inside])
        elif os.path.realpath(outer[0] + slot_path(inside)[len(slot_path(outer[1])) :]) != host:
            raise ValueError(
                f"{flags[i]}: {inside!r} lies inside {outer[1]!r}, bound read-only from "
                f"{outer[0]!r}; bind it at a place of its own"
            )
    return kept


def with_interpreter(binds: list[list[str]], python: str | None) -> list[list[str]]:
    """The binds a slot gets: these, and the prefix of the fork servers' interpreter (``--python``) at its own
    path when it lies outside /usr and no bind shows it there already. The fork server imports from it in the
    slot itself, before any run: never below a place each run makes its own (/tmp, /mnt, /home, /workspace)."""
    py = os.path.realpath(python or "/usr/bin/python3")
    prefix = os.path.dirname(os.path.dirname(py))
    if _under(prefix, "/usr"):
        return binds
    flag = f"--python {python!r}"
    per_run = next((d for d in RUN_DIRS if _under(prefix, d)), None)  # (/mnt/home/..: under /mnt)
    if per_run:
        raise ValueError(
            f"{flag}: its prefix {prefix!r} is under {per_run}, which each run makes its own, and the "
            "fork servers import from it before any run; use an interpreter installed elsewhere"
        )
    if any(_shows(h, p, prefix) for h, p in binds):
        return binds
    host, inside = _parse_one(flag, prefix, "")
    for other_host, other_inside in binds:
        if slot_path(inside) == slot_path(other_inside):
            raise ValueError(f"{flag}: its prefix {inside!r} is already bound from {other_host!r}")
    labels = [f"{flag} (its prefix {prefix!r}) with the bind at {p!r}" for _, p in binds]
    return _without_nested(binds + [[host, inside]], labels + [flag])


def _shows(host: str, inside: str, path: str) -> bool:
    """Does the bind of `host` at `inside` show the host's `path` at its own path?"""
    if not _under(slot_path(path), slot_path(inside)):
        return False
    return os.path.realpath(host + slot_path(path)[len(slot_path(inside)) :]) == path
