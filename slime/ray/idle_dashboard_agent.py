"""What a lean head's raylet (slime.ray.lean_head) runs in place of Ray's dashboard agent when that agent would
serve nothing: no dashboard asked for, and Ray's dashboard dependencies not installed, so Ray starts its agent
`--minimal`. That agent loads no module (its log says `Loaded 0 modules`), serves nothing, and only writes its
three ports as -1 ("not in use"), yet the raylet registers its node, and `ray.init` returns, only once those files
exist: ~1 CPU second of imports and module scanning on the start's critical path, beside the engines' preload.

This stand-in writes the same files, as Ray's `persist_port` does (`<session dir>/<port name>_<node id>`, the
port as text), then lives as long as the raylet: the raylet hands its agents a pipe on stdin (Ray's
`_check_parent_via_pipe`), whose end means the raylet is gone; the raylet in turn ends if its agent ends. The
standard library only, run with `python -S`: it imports neither Ray nor slime.

If the command line is not the one it knows (no session dir or node id: another Ray version), it becomes
Ray's own agent (`exec` of the rest of its command line), so a start never depends on the stand-in's guess.
"""

from __future__ import annotations

import os
import stat
import sys

PORT_NAMES_FLAG = "--slime-idle-ports="  # the driver's list of Ray's port names, from `ray._raylet`


def _options(argv: list[str]) -> dict[str, str]:
    return dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)


def write_ports(session_dir: str, node_id: str, names: list[str]) -> None:
    """Each port as -1, each file whole when it appears (the raylet may read it at any moment)."""
    for name in names:
        path = os.path.join(session_dir, f"{name}_{node_id}")
        tmp = f"{path}.slime-tmp"
        with open(tmp, "w", encoding="ascii") as f:
            f.write("-1")
        os.replace(tmp, path)


def _stdin_is_a_pipe() -> bool:
    """The raylet's pipe; anything else (a Ray that watches its agents another way) would end the stand-in at once."""
    try:
        return stat.S_ISFIFO(os.fstat(0).st_mode)
    except OSError:
        return False


def _become_rays_agent(argv: list[str]) -> None:
    rest = [a for a in argv if not a.startswith(PORT_NAMES_FLAG)]
    os.execv(sys.executable, [sys.executable, "-u", *rest])


def main(argv: list[str]) -> None:
    opts = _options(argv)
    names = [n for n in opts.get(PORT_NAMES_FLAG[2:-1], "").split(",") if n]
    if not (opts.get("session-dir") and opts.get("node-id") and names and _stdin_is_a_pipe()):
        _become_rays_agent(argv)
    write_ports(opts["session-dir"], opts["node-id"], names)
    while sys.stdin.buffer.read(1 << 16):  # blocks; b"" once the raylet is gone
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
