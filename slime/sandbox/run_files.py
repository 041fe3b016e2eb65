"""A run's files: the request's written into its work dir, and the requested ones opened to be sent
back (stdlib only: loaded by the fork server with `run_init.py`).

Why so careful: the slot's init, which does this, is root, and the work dir is the run's own (it
may have made links there, and ``--ro-bind``s show host files in it). So every file the request
names is reached with the run's identity (`RunIdentity`: the init's filesystem uid and gid become
the run's, so root's overrides of file modes are off) and one component at a time from the work
dir, never through a symbolic link (`open_beneath`): nothing the run could not read comes out,
nothing it could not write goes in, and a path through a link is refused, naming it."""

import ctypes
import errno
import os
import stat

_libc = ctypes.CDLL(None, use_errno=True)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RunIdentity:
    """``with RunIdentity(uid):`` file accesses of this thread are checked as `uid`'s (setfsuid,
    setfsgid: per thread, and dropping root's file capabilities while they are not 0). Without
    root (no isolation) the init already is the run's user: nothing to change."""

    def __init__(self, uid):
        self.uid = uid
        self.switch = os.geteuid() == 0 and uid != 0

    def __enter__(self):
        if self.switch:
            _libc.setfsgid(self.uid)
            _libc.setfsuid(self.uid)
            if _libc.setfsuid(-1) != self.uid:  # (-1: a query, as the call answers the previous value)
                raise OSError(errno.EPERM, "could not take the run's file identity (uid %d)" % self.uid)
        return self

    def __exit__(self, *exc):
        if self.switch:
            _libc.setfsuid(0)
            _libc.setfsgid(0)


def split_path(path):
    """The components of a path relative to the work dir; OSError (EINVAL) naming it when it has a
    NUL byte, is absolute, empty or has a ``..``."""
    if "\x00" in path:
        raise OSError(errno.EINVAL, "a NUL byte in the path: %r" % path)
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if path.startswith("/") or not parts or ".." in parts:
        raise OSError(errno.EINVAL, "path escapes the work dir: %r" % path)
    return parts


def open_beneath(root, path, flags, mode=0o644, make_dirs=False):
    """An fd of `path` below the directory `root`, each component opened with ``O_NOFOLLOW`` from
    the one before (as ``openat2`` with ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` would): a link
    anywhere on the way is refused (ELOOP, naming it). `make_dirs`: missing directories are made."""
    parts = split_path(path)
    dfd = os.open(root, _DIR)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                if last:
                    return os.open(part, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
                try:
                    nfd = os.open(part, _DIR, dir_fd=dfd)
                except FileNotFoundError:
                    if not make_dirs:
                        raise
                    os.mkdir(part, 0o755, dir_fd=dfd)
                    nfd = os.open(part, _DIR, dir_fd=dfd)
            except OSError as e:
                where = "/".join(parts[: i + 1])
                if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and _is_link(dfd, part):
                    raise OSError(
                        errno.ELOOP, "%r goes through a symbolic link (%r): refused" % (path, where)
                    ) from None
                raise OSError(
                    e.errno, "%r: %s" % (path, e.strerror if where == path else "%s (at %r)" % (e.strerror, where))
                ) from None
            os.close(dfd)
            dfd = nfd
    finally:
        os.close(dfd)


def _is_link(dfd, name):
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def write_file(work, path, data, uid):
    """`data` as `path` below `work`, written as the run's uid (which then owns it); only into a regular
    file (``O_NONBLOCK``: a FIFO in a bind, which a read-only mount does not stop, fails at once)."""
    with RunIdentity(uid):
        fd = open_beneath(work, path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o644, make_dirs=True)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "%r: not a regular file" % path)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def fetch_files(work, hdr, isolate):
    """Requested files as (fd, size) to stream, each file once, within the size caps, opened as the
    run's uid; and [name, reason] for each one not returned (missing, unreadable by the run, through
    a link, not a file, too large, the same file as another)."""
    seen, files, fds, skipped, total = {}, [], [], [], 0
    with RunIdentity(hdr["uid"]):
        for name, rel in hdr["fetch"]:
            base, rel = ("/mnt", rel[len("/mnt/") :]) if rel.startswith("/mnt/") and isolate else (work, rel)
            try:
                fd = open_beneath(base, rel, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as e:
                skipped.append([name, "not found" if e.errno == errno.ENOENT else e.strerror or str(e)])
                continue
            st = os.fstat(fd)
            why = None
            if not stat.S_ISREG(st.st_mode):
                why = "not a regular file"
            elif (st.st_dev, st.st_ino) in seen:
                why = "same file as %r (sent once)" % seen[st.st_dev, st.st_ino]
            elif st.st_size > hdr["fetch_max_file"]:
                why = "larger than the %d MB limit of one fetched file" % (hdr["fetch_max_file"] >> 20)
            elif total + st.st_size > hdr["fetch_max_total"]:
                why = "over the %d MB limit of all fetched files" % (hdr["fetch_max_total"] >> 20)
            if why:
                os.close(fd)
                skipped.append([name, why])
                continue
            seen[st.st_dev, st.st_ino] = name
            total += st.st_size
            files.append([name, st.st_size])
            fds.append((fd, st.st_size))
    return files, fds, skipped
