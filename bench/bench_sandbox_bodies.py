"""`/v1/ping` latency while one client sends a 26 MB body (issue 30): `env` with 2.4 M entries on
`POST /sessions` and 2.4 M `files` keys on `POST /run_code` (both refused), and one file of 19.5 MB (26 MB
of base64) on `POST /run_code` (run). A pinger thread calls `/v1/ping` back to back from the first byte
of the body to its answer, and a session's command connects through its egress (to an echo server) back to
back for `--egress-seconds` from the body's start; the figures are their latencies (median, max) and the time
from the last byte of the body to the answer.

    python -m bench.bench_sandbox_bodies [--tree DIR] [--entries 2400000] [--egress-seconds 5]

`--tree DIR` runs another checkout's sandbox (before/after), e.g. DIR from
`mkdir DIR && git archive <commit> slime | tar -x -C DIR`.
"""

from __future__ import annotations

import argparse
import base64
import json
import shlex
import socket
import socketserver
import statistics
import sys
import threading
import time


def _post(url: str, path: str, body: bytes) -> tuple[int, float]:
    """Send `body` in 1 MB pieces; (HTTP status, seconds from its last byte to the answer)."""
    host, port = url.split("//", 1)[1].split(":")
    s = socket.create_connection((host, int(port)), timeout=300)
    try:
        s.sendall(
            (
                f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
        )
        for i in range(0, len(body), 1 << 20):
            s.sendall(body[i : i + (1 << 20)])
        t0 = time.monotonic()
        head = s.recv(65536)
        return int(head.split(b" ", 2)[1]), time.monotonic() - t0
    finally:
        s.close()


EGRESS_PROBE = """
import json, socket, time
lat, end = [], time.monotonic() + {seconds}
while time.monotonic() < end:
    t = time.monotonic()
    s = socket.create_connection(("127.0.0.1", 80))
    s.sendall(b"x")
    s.recv(1)
    s.close()
    lat.append(time.monotonic() - t)
lat.sort()
print(json.dumps({{"egress_round_trips": len(lat), "egress_p50_ms": round(1000 * lat[len(lat) // 2], 1),
                  "egress_max_ms": round(1000 * lat[-1], 1)}}))
"""


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


def _measure(url: str, path: str, body: bytes, sid: str | None, seconds: float) -> dict:
    """`sid`: a session with the echo egress, whose command connects through it back to back for
    `seconds` (started with the body, so covering it) and reports its round trips."""
    import requests

    lat: list[float] = []
    done = threading.Event()
    probe: dict = {}

    def egress() -> None:
        out = requests.post(
            f"{url}/sessions/{sid}/exec",
            timeout=300,
            json={"command": "python3 -c " + shlex.quote(EGRESS_PROBE.format(seconds=seconds)), "timeout": 120},
        ).json()
        probe.update(json.loads(out["stdout"]) if out["returncode"] == 0 else {"egress_error": out})

    def pinger() -> None:
        with requests.Session() as http:
            while not done.is_set():
                t = time.monotonic()
                http.get(f"{url}/v1/ping", timeout=300)
                lat.append(time.monotonic() - t)

    threads = [threading.Thread(target=pinger)] + ([threading.Thread(target=egress)] if sid else [])
    for th in threads:
        th.start()
    try:
        status, answer_s = _post(url, path, body)
    finally:
        done.set()
        for th in threads:
            th.join()
    return {
        "route": path,
        "body_mb": round(len(body) / 2**20, 1),
        "status": status,
        "answer_after_body_s": round(answer_s, 3),
        "pings": len(lat),
        "ping_p50_ms": round(1000 * statistics.median(lat), 1),
        "ping_max_ms": round(1000 * max(lat), 1),
        **probe,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tree", default=None, help="root of another checkout whose sandbox to measure")
    ap.add_argument("--entries", type=int, default=2_400_000)
    ap.add_argument("--egress-seconds", type=float, default=5.0, help="how long the session probes its egress")
    a = ap.parse_args()
    if a.tree:
        sys.path.insert(0, a.tree)
    from slime.sandbox.server import start_local_sandbox

    keys = b",".join(b'"%x":""' % i for i in range(a.entries))
    one_file = base64.b64encode(b"x" * (19_500 << 10))  # (26 MB as base64: a body within the limits, run)
    bodies = [
        ("/sessions", b'{"env": {' + keys + b"}}"),
        ("/run_code", b'{"code": "print(1)", "files": {' + keys + b"}}"),
        ("/run_code", b'{"code": "print(1)", "files": {"big.bin": "' + one_file + b'"}}'),
    ]
    echo = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    threading.Thread(target=echo.serve_forever, daemon=True).start()
    url, handle = start_local_sandbox(
        max_concurrency=3, extra_args=["--egress", f"echo=127.0.0.1:{echo.server_address[1]}"]
    )
    try:
        import requests

        sid = requests.post(f"{url}/sessions", json={"egress": "echo"}, timeout=60).json()["session_id"]
        for path, body in bodies:
            print(json.dumps(_measure(url, path, body, sid, a.egress_seconds)), flush=True)
    finally:
        handle.stop()
        echo.shutdown()


if __name__ == "__main__":
    main()
