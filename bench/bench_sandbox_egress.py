"""Sandbox sessions and their egress: what a session and its one way out cost, side by side in one run.

- session open + close (a fresh slot afterwards: the next one restarts its fork server);
- a command in a session (`true` by bash) vs the same command as a `/run_code` run;
- HTTP through the egress (the server splices each connection to the target) vs the same client
  on the host talking to the target directly: small requests per second on one keep-alive connection,
  new connections per second, and bulk download MB/s. Client and target are the same in both: only
  the path differs (the splice, the slot's loopback, the host's loopback).

    python -m bench.bench_sandbox_egress [--requests 300] [--bulk-mb 64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import requests

CLIENT = """
import http.client, sys, time
host, port, n, bulk = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
c = http.client.HTTPConnection(host, port, timeout=30)
t = time.perf_counter()
for _ in range(n):
    c.request("GET", "/small"); c.getresponse().read()
keep = n / (time.perf_counter() - t)
t = time.perf_counter()
for _ in range(n):
    d = http.client.HTTPConnection(host, port, timeout=30)
    d.request("GET", "/small"); d.getresponse().read(); d.close()
fresh = n / (time.perf_counter() - t)
t = time.perf_counter()
c.request("GET", "/bulk/%d" % bulk); r = c.getresponse(); got = 0
while True:
    b = r.read(1 << 20)
    if not b: break
    got += len(b)
assert got == bulk << 20
print(keep, fresh, bulk / (time.perf_counter() - t))
"""


def _median_ms(call, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def main() -> None:
    from slime.sandbox.server import start_local_sandbox
    from slime.testing.ok_server import start_ok_server

    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--bulk-mb", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    target = start_ok_server()
    port = target.server_address[1]
    url, handle = start_local_sandbox(max_concurrency=2, extra_args=["--egress", f"t=127.0.0.1:{port}"])
    http_ = requests.Session()
    try:

        def open_close():
            sid = http_.post(f"{url}/sessions", json={}).json()["session_id"]
            http_.delete(f"{url}/sessions/{sid}")

        print(f"session open+close: {_median_ms(open_close, 10):.1f} ms (median of 10)")
        s = http_.post(f"{url}/sessions", json={"egress": "t", "memory_mb": 1024}).json()
        sid = s["session_id"]
        run = {"code": "true", "language": "bash"}
        in_session = _median_ms(lambda: http_.post(f"{url}/sessions/{sid}/exec", json={"command": "true"}), 50)
        as_run = _median_ms(lambda: http_.post(f"{url}/run_code", json=run), 50)
        print(f"`true`: {in_session:.1f} ms in a session, {as_run:.1f} ms as a /run_code run (median of 50)")
        argv = [str(args.requests), str(args.bulk_mb)]
        for r in range(args.rounds):
            out = http_.post(
                f"{url}/sessions/{sid}/exec",
                json={"command": "python3 - 127.0.0.1 80 " + " ".join(argv), "stdin": CLIENT, "timeout": 600},
            ).json()
            assert out["returncode"] == 0, out
            egress = [float(x) for x in out["stdout"].split()]
            direct = [
                float(x)
                for x in subprocess.run(
                    ["/usr/bin/python3", "-", "127.0.0.1", str(port), *argv],
                    input=CLIENT,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
            ]
            print(
                f"round {r + 1}: keep-alive req/s {egress[0]:.0f} via egress vs {direct[0]:.0f} direct; "
                f"new connections/s {egress[1]:.0f} vs {direct[1]:.0f}; bulk MB/s {egress[2]:.0f} vs {direct[2]:.0f}"
            )
        http_.delete(f"{url}/sessions/{sid}")
    finally:
        handle.stop()
        target.shutdown()
        target.server_close()


if __name__ == "__main__":
    main()
