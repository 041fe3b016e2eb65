"""Frames of a slot's request stream, ``<u32 length><JSON header><blobs>`` both ways (stdlib only: loaded
by the fork server with `run_init.py`)."""

import json
import os
import struct

# the server to the init while a program runs: stop it (the answer comes as usual). Never a frame's first
# byte (a header is far shorter than 4 GB); one that comes after the program's end is dropped.
STOP = b"\xff"


def send_frame(sock, header, blobs=(), files=()):
    """``<u32 n><header><blobs><files>``; `files` are (fd, size) sent from the file itself in bounded
    chunks (``sendfile``: never read into this process, whose memory must stay small and fixed)."""
    data = json.dumps(header).encode()
    sock.sendall(b"".join([struct.pack("!I", len(data)), data, *blobs]))  # (one send: the reader wakes once)
    for fd, size in files:
        sent = 0
        while sent < size:
            n = os.sendfile(sock.fileno(), fd, sent, min(1 << 20, size - sent))
            if n == 0:
                raise EOFError("a fetched file shrank while it was sent")
            sent += n


def recv_exact(sock, n):
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise EOFError("peer closed")
        got += k
    return bytes(buf)


class Request:
    """A run's request as it arrives: the server sends it whole, so one ``recv`` usually holds all
    of it (no read per field); larger ones are read to the size each field needs."""

    def __init__(self, sock, first):
        self.sock = sock
        self.buf = first  # (what the first read brought)
        self.pos = 0

    def take(self, n):
        have = len(self.buf) - self.pos
        if have >= n:
            out = self.buf[self.pos : self.pos + n]
            self.pos += n
            return out
        out = self.buf[self.pos :] + recv_exact(self.sock, n - have)
        self.buf, self.pos = b"", 0
        return out
