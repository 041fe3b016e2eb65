"""A run's files: the request's written into its work dir as the run's uid, and the requested ones
opened to be sent back (stdlib only: loaded by the fork server with `run_init.py`)."""

import errno
import os
import stat


def write_file(work, path, data, uid):
    rel = os.path.normpath(path)
    if rel.startswith("/") or rel == ".." or rel.startswith("../"):
        raise OSError(errno.EINVAL, "path escapes the work dir: %r" % path)
    full = os.path.join(work, rel)
    d = os.path.dirname(full)
    todo = []
    while d != work and not os.path.isdir(d):
        todo.append(d)
        d = os.path.dirname(d)
    for d in reversed(todo):
        os.mkdir(d, 0o755)
        os.chown(d, uid, uid)
    fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchown(fd, uid, uid)
    finally:
        os.close(fd)


def fetch_files(work, hdr, isolate):
    """Requested files as (fd, size) to stream, each resolved file once, within the size caps;
    and [name, reason] for each one not returned (missing, not a file, too large, an alias)."""
    seen, files, fds, skipped, total = {}, [], [], [], 0
    for name, rel in hdr["fetch"]:
        base = "/mnt" if rel.startswith("/mnt/") and isolate else work
        real = os.path.realpath(os.path.join(base, rel[len("/mnt/"):] if base == "/mnt" else rel))
        if not real.startswith(base + "/"):
            skipped.append([name, "outside the work dir"])
            continue
        if real in seen:
            skipped.append([name, "same file as %r (sent once)" % seen[real]])
            continue
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            skipped.append([name, "not found" if e.errno == errno.ENOENT else e.strerror or str(e)])
            continue
        st = os.fstat(fd)
        why = None
        if not stat.S_ISREG(st.st_mode):
            why = "not a regular file"
        elif st.st_size > hdr["fetch_max_file"]:
            why = "larger than the %d MB limit of one fetched file" % (hdr["fetch_max_file"] >> 20)
        elif total + st.st_size > hdr["fetch_max_total"]:
            why = "over the %d MB limit of all fetched files" % (hdr["fetch_max_total"] >> 20)
        if why:
            os.close(fd)
            skipped.append([name, why])
            continue
        seen[real] = name
        total += st.st_size
        files.append([name, st.st_size])
        fds.append((fd, st.st_size))
    return files, fds, skipped
