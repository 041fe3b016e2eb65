"""What a session changes in its slot, done by the slot's init when the session opens (stdlib only).

A session keeps one run's namespaces and tmpfs for its whole life (`run_init.RunInit.keep`), so
its workspace persists from one exec to the next and dies with the slot when the session ends.
At the open, in the run's mount and network namespaces: the tmpfs gets the session's own size and
inode budget, ``/home/<user>`` and ``/workspace`` (links to ``/mnt/home`` and ``/mnt/workspace``) are
made for its uid, and, if it asked for an egress, a listening TCP socket on ``127.0.0.1:<port>`` is
made *inside the slot's network namespace* and its fd handed to the server over the control
socket (``SCM_RIGHTS``): the server accepts on it and splices each connection to the one configured
target (`egress.py`). Nothing runs inside the sandbox for that. The port need not be privileged: it
is bound before any command of the session runs and held by the server until the session ends
(with the slot and its namespace), so a run can never take it; ``[::1]:<port>`` is bound too and held
unlistened by the init, so a client trying ``localhost`` over IPv6 first is refused, never answered by a run.
"""

import errno
import os
import socket

from .isolation import LINKED, MS_BIND, MS_NODEV, MS_NOSUID, MS_RDONLY, check, libc

MS_REMOUNT = 32
HOME_USERS = ("agent", "root")  # both names map to the session's one uid (it is never root)
# writable places a session adds to the read-only root: each a link to its directory on the session's tmpfs
# (`/workspace`: slime's coding example writes its patch and scripts there)
SESSION_DIRS = LINKED


def open_session(init, spec):
    """`spec`: ``{"disk_mb", "max_inodes", "egress_port" (0: none)}``; `init` is the slot's `RunInit`."""
    if init.isolate:
        _resize_tmpfs(spec["disk_mb"], spec["max_inodes"])
        _make_session_dirs(init.slot.uid)
    port = spec.get("egress_port") or 0
    if port:
        init.egress_hold = _hold_ipv6_loopback(port)
        _hand_over_listener(init.ctl, port)


def _resize_tmpfs(disk_mb, max_inodes):
    """The run's tmpfs (``/tmp``, ``/mnt``, ``/dev/shm`` are binds of it) gets the session's budget."""
    data = ("size=%dk,nr_inodes=%d" % (disk_mb << 10, max_inodes)).encode()
    check(libc.mount(None, b"/tmp", None, MS_REMOUNT | MS_NOSUID | MS_NODEV, data), "resize the session's tmpfs")


def _make_session_dirs(uid):
    """``/home`` and ``/workspace``, links to their directories on the session's tmpfs (so bounded by
    its budget). The links go into the slot's read-only root, made writable for it in this mount
    namespace only; the root dies with the slot, which ends with the session, so runs never see them."""
    made = list(SESSION_DIRS.values()) + ["/mnt/home/" + u for u in HOME_USERS]
    for path in made:
        os.makedirs(path, 0o755, exist_ok=True)  # (a --ro-bind below /home made some of them: `isolation.py`)
        os.chown(path, uid, uid)
    missing = [link for link in SESSION_DIRS if not os.path.islink(link)]
    if not missing:
        return
    check(libc.mount(None, b"/", None, MS_BIND | MS_REMOUNT | MS_NOSUID, None), "make the root writable")
    try:
        for link in missing:
            os.symlink(SESSION_DIRS[link], link)
    finally:
        check(
            libc.mount(None, b"/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID, None),
            "make the root read-only again",
        )


def _hand_over_listener(ctl, port):
    """Listen on 127.0.0.1:`port` in this network namespace; the server gets the socket, we keep none."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen(64)
        socket.send_fds(ctl, [b'{"egress_port": %d}' % port], [sock.fileno()])
    finally:
        sock.close()


def _hold_ipv6_loopback(port):
    """``[::1]:port`` bound and never listened on (connections are refused); None without IPv6."""
    try:
        sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    except OSError as e:
        if e.errno == errno.EAFNOSUPPORT:
            return None
        raise
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(("::1", port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRNOTAVAIL:  # (no ::1 in this namespace)
            return None
        raise
    return sock
