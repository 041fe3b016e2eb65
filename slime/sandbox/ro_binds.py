"""``--ro-bind HOST[:INSIDE]``: host directories (agent CLIs, node) bound read-only into every slot.

Checked once at start, each error naming the flag: the host path must exist; INSIDE (default: the
host path) must be absolute and must not hide or sit inside a path the sandbox builds itself
(``/usr``, ``/etc``, ``/tmp``, ``/mnt``, ``/home``, ``/dev``, ``/proc``, ...). The bind is read-only, nosuid
and nodev, submounts included (`isolation._bind_ro`): no writable host path ever enters a slot.
"""

from __future__ import annotations

import os

RESERVED = ("/usr", "/etc", "/tmp", "/mnt", "/home", "/dev", "/proc", "/sys", "/bin", "/sbin", "/lib", "/lib32",
            "/lib64", "/libx32", "/.old")


def parse_ro_binds(specs: list[str]) -> list[list[str]]:
    """``["/h/clis:/opt/clis", "/opt/node"]`` -> ``[["/h/clis", "/opt/clis"], ["/opt/node", "/opt/node"]]``."""
    out: list[list[str]] = []
    seen: dict[str, str] = {}
    for spec in specs:
        host, _, inside = spec.partition(":")
        host = os.path.expanduser(host)
        if not host or not os.path.exists(host):
            raise ValueError(f"--ro-bind {spec!r}: the host path {host!r} does not exist")
        inside = os.path.normpath(inside or os.path.abspath(host))
        if not os.path.isabs(inside) or inside == "/":
            raise ValueError(f"--ro-bind {spec!r}: the path inside ({inside!r}) must be absolute and not /")
        hit = next((r for r in RESERVED if inside == r or inside.startswith(r + "/") or r.startswith(inside + "/")),
                   None)
        if hit:
            raise ValueError(f"--ro-bind {spec!r}: {inside!r} clashes with {hit}, which the sandbox makes itself; "
                             "pick another place inside (e.g. /opt/...)")
        if inside in seen:
            raise ValueError(f"--ro-bind {spec!r}: {inside!r} is already bound from {seen[inside]!r}")
        seen[inside] = host
        out.append([os.path.realpath(host), inside])
    return out
