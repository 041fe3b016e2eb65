"""`/v1/ping` latency while one client sends a 26 MB body (issue 30): `env` with 2.4 M entries on
`POST /sessions` and 2.4 M `files` keys on `POST /run_code` (both refused), and one file of 19.5 MB (26 MB
of base64) on `POST /run_code` (run). A pinger thread calls `/v1/ping` back to back from the first byte
of the body to its answer; the figures are its latencies (median, max) and the time from the last byte of
the body to the answer.

    python -m bench.bench_sandbox_bodies [--tree DIR] [--entries 2400000]

`--tree DIR` runs another checkout's sandbox (before/after), e.g. DIR from
`mkdir DIR && git archive <commit> slime | tar -x -C DIR`.
"""

from __future__ import annotations

import argparse
import base64
import json
import socket
import statistics
import sys
import threading
import time


def _post(url: str, path: str, body: bytes) -> tuple[int, float]:
    """Send `body` in 1 MB pieces; (HTTP status, seconds from its last byte to the answer)."""
    host, port = url.split("//", 1)[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=300)
    try:
        s.sendall((f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode())
        for i in range(0, len(body), 1 << 20):
            s.sendall(body[i:i + (1 << 20)])
        t0 = time.monotonic()
        head = s.recv(65536)
        return int(head.split(b" ", 2)[1]), time.monotonic() - t0
    finally:
        s.close()


def _measure(url: str, path: str, body: bytes) -> dict:
    import requests

    lat: list[float] = []
    done = threading.Event()

    def pinger() -> None:
        with requests.Session() as http:
            while not done.is_set():
                t = time.monotonic()
                http.get(f"{url}/v1/ping", timeout=300)
                lat.append(time.monotonic() - t)

    th = threading.Thread(target=pinger)
    th.start()
    try:
        status, answer_s = _post(url, path, body)
    finally:
        done.set()
        th.join()
    return {"route": path, "body_mb": round(len(body) / 2 ** 20, 1), "status": status,
            "answer_after_body_s": round(answer_s, 3), "pings": len(lat),
            "ping_p50_ms": round(1000 * statistics.median(lat), 1), "ping_max_ms": round(1000 * max(lat), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default=None, help="root of another checkout whose sandbox to measure")
    ap.add_argument("--entries", type=int, default=2_400_000)
    a = ap.parse_args()
    if a.tree:
        sys.path.insert(0, a.tree)
    from slime.sandbox.server import start_local_sandbox

    keys = b",".join(b'"%x":""' % i for i in range(a.entries))
    one_file = base64.b64encode(b"x" * (19_500 << 10))  # (26 MB as base64: a body within the limits, run)
    bodies = [("/sessions", b'{"env": {' + keys + b"}}"),
              ("/run_code", b'{"code": "print(1)", "files": {' + keys + b"}}"),
              ("/run_code", b'{"code": "print(1)", "files": {"big.bin": "' + one_file + b'"}}')]
    url, handle = start_local_sandbox(max_concurrency=2)
    try:
        for path, body in bodies:
            print(json.dumps(_measure(url, path, body)), flush=True)
    finally:
        handle.stop()


if __name__ == "__main__":
    main()
