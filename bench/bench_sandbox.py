"""Sandbox throughput: `print(1)` runs through `slime-sandbox` vs a warm fork of the same interpreter
running the same `print(1)` without isolation (the fair baseline, the headline) and vs bare
`python3 -c 'print(1)'` spawns, side by side in one run (interleaved rounds, same concurrency).

The warm fork is what the sandbox does minus the sandbox: an interpreter with the same modules
loaded forks, the child compiles and runs the script with its stdout on a pipe, the parent reads it
and reaps the child. So sandbox/warm-fork is the price of isolation, limits and HTTP; sandbox/bare
spawns mostly measures the interpreter start-up the sandbox skips (and grows with load).

    python -m bench.bench_sandbox [--concurrency 8] [--seconds 4] [--rounds 3] [--compare-tree DIR]
                                  [--cpu-priority]

`--compare-tree DIR` runs another checkout's sandbox in the same rounds (before/after side by side),
e.g. DIR from `mkdir DIR && git archive <commit> slime | tar -x -C DIR`.

`--cpu-priority` (root, cgroup v1 cpu controller) runs the whole bench (itself, the spawners and
the servers) in a cpu cgroup of its own with the largest weight: on a shared, loaded machine it
then gets the CPU as if the machine were lightly loaded (the "light load" condition of RESULTS.md).

The sandbox path is the whole thing: HTTP request, validation, admission, a fresh isolated run
(PID/mount/IPC namespaces, tmpfs, cgroup limits, uid, seccomp), the program, the response.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time


async def _closed_loop_rate(open_client, conc: int, seconds: float) -> float:
    """Runs/s of `conc` clients, each calling its `run_once()` back to back for `seconds` (a closed loop,
    like wrk). `open_client()` is an async context manager yielding one client's `run_once`."""
    done = 0
    stop = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        async with open_client() as run_once:
            while time.monotonic() < stop:
                await run_once()
                done += 1

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return done / (time.monotonic() - t0)


async def _sandbox_rate(url: str, conc: int, seconds: float) -> float:
    """`conc` keep-alive HTTP/1.1 connections, each posting `print(1)` back to back (a lean load
    generator, like wrk: the client's own cost should not be what is measured)."""
    host, port = url.split("//", 1)[1].split(":")
    body = json.dumps({"code": "print(1)", "language": "python"}).encode()
    req = (
        f"POST /run_code HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    @contextlib.asynccontextmanager
    async def connection():
        reader, writer = await asyncio.open_connection(host, int(port))

        async def post_once() -> None:
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(h.split(b":")[1] for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")))
            res = json.loads(await reader.readexactly(length))
            if not head.startswith(b"HTTP/1.1 200") or res["run_result"]["stdout"] != "1\n":
                raise SystemExit(f"sandbox run failed: {head[:40]!r} {str(res)[:300]}")

        try:
            yield post_once
        finally:
            writer.close()

    return await _closed_loop_rate(connection, conc, seconds)


# One timing loop for both child-process baselines: argv[1] = seconds, argv[2] = what start_child needs;
# each round starts a child whose stdout is the pipe's write end, reads `1\n` from it and reaps it.
_CHILD_LOOP = """
import os, sys, time
seconds, arg = float(sys.argv[1]), sys.argv[2]
START_CHILD
n, stop = 0, time.monotonic() + seconds
t0 = time.monotonic()
while time.monotonic() < stop:
    r, w = os.pipe()
    pid = start_child(r, w)
    os.close(w)
    out = b""
    while True:
        chunk = os.read(r, 64)
        if not chunk:
            break
        out += chunk
    os.close(r)
    _, st = os.waitpid(pid, 0)
    assert out == b"1\\n" and st == 0
    n += 1
sys.stdout.flush()
os.write(1, b"%d %f\\n" % (n, time.monotonic() - t0))
"""

_SPAWNER = _CHILD_LOOP.replace(
    "START_CHILD",
    """
def start_child(r, w):
    return os.posix_spawn(arg, [arg, "-c", "print(1)"], os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
""",
)

_WARM_FORKER = _CHILD_LOOP.replace(
    "START_CHILD",
    """
for m in arg.split(","):
    __import__(m)

def start_child(r, w):
    pid = os.fork()
    if pid == 0:
        os.dup2(w, 1)
        os.close(r)
        os.close(w)
        exec(compile("print(1)", "main.py", "exec"), {"__name__": "__main__"})
        sys.stdout.flush()
        os._exit(0)
    return pid
""",
)


def _warm_fork_rate(python: str, conc: int, seconds: float) -> float:
    """The fair baseline at the same concurrency: `conc` warm interpreters (the sandbox's preloaded
    modules), each forking a child that runs `print(1)` into a pipe, in a loop; no isolation, no
    limits, no HTTP."""
    from slime.sandbox.runner import PRELOAD

    return _rate_of([python, "-c", _WARM_FORKER, str(seconds), ",".join(PRELOAD)], conc)


def _spawn_rate(python: str, conc: int, seconds: float) -> float:
    """Bare spawns at the same concurrency: `conc` independent small processes, each spawning
    `python -c 'print(1)'` and reading its output in a loop (no shared event loop in the way)."""
    return _rate_of([sys.executable, "-c", _SPAWNER, str(seconds), python], conc)


def _rate_of(argv: list[str], conc: int) -> float:
    import subprocess

    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(conc)]
    total, longest = 0, 0.0
    for p in procs:
        n, el = p.communicate()[0].split()
        total += int(n)
        longest = max(longest, float(el))
    return total / longest


async def _spawn_rate_one_process(python: str, conc: int, seconds: float) -> float:
    """The same spawns from one asyncio process (how a Python service would spawn them)."""

    @contextlib.asynccontextmanager
    async def spawner():
        async def spawn_once() -> None:
            p = await asyncio.create_subprocess_exec(python, "-c", "print(1)", stdout=asyncio.subprocess.PIPE)
            out, _ = await p.communicate()
            assert out == b"1\n"

        yield spawn_once

    return await _closed_loop_rate(spawner, conc, seconds)


def _start_server(tree: str | None, slots: int, queue: int, isolated: bool, uid_base: int):
    """This tree's sandbox server, or the one of another checkout (`tree`: its root, e.g. an
    unpacked `git archive` of an earlier commit) for a before/after comparison in one run."""
    if tree is None:
        from slime.sandbox.server import start_local_sandbox
    else:
        import importlib.util

        path = os.path.join(tree, "slime", "sandbox", "server.py")
        spec = importlib.util.spec_from_file_location("_compared_sandbox_server", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        start_local_sandbox = mod.start_local_sandbox  # (it starts `python -m slime.sandbox.server` from `tree`)
    here = os.getcwd()
    os.chdir(tree or here)  # (`python -m` puts the working directory first on sys.path: `tree`'s slime)
    try:
        return start_local_sandbox(
            max_concurrency=slots,
            max_queue=queue,
            allow_no_isolation=not isolated,
            extra_args=["--uid-base", str(uid_base)] if uid_base else [],
        )
    finally:
        os.chdir(here)


class _CpuPriority:
    """This process (and what it starts afterwards) in a cpu cgroup with the largest weight; left and
    removed at the end. Best effort: without root or a v1 cpu hierarchy it says so and does nothing."""

    def __init__(self) -> None:
        self.dir = self.parent = None
        try:
            with open("/proc/self/cgroup") as f:
                path = next(
                    line.rstrip("\n").split(":", 2)[2] for line in f if "cpu" in line.split(":", 2)[1].split(",")
                )
            self.parent = os.path.join("/sys/fs/cgroup/cpu", path.lstrip("/"))
            d = os.path.join(self.parent, f"slime-bench-{os.getpid()}")
            os.mkdir(d)
            self.dir = d
            with open(os.path.join(d, "cpu.shares"), "w") as f:
                f.write("262144")
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        except (OSError, StopIteration) as e:
            print(f"--cpu-priority unavailable ({e}): running without it", file=sys.stderr)
            self.close()

    def close(self) -> None:
        if self.dir is None:
            return
        try:
            with open(os.path.join(self.parent, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            for root, dirs, _ in os.walk(self.dir, topdown=False):  # (a server's leftovers, if any)
                for d in dirs:
                    os.rmdir(os.path.join(root, d))
            os.rmdir(self.dir)
        except OSError as e:
            print(f"could not remove {self.dir}: {e}", file=sys.stderr)
        self.dir = None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, default=None, help="server --max-concurrency (default: --concurrency)")
    ap.add_argument(
        "--compare-tree",
        default=None,
        help="root of another checkout: its sandbox runs in the same rounds (before/after)",
    )
    ap.add_argument(
        "--cpu-priority",
        action="store_true",
        help="run the bench in a cpu cgroup with the largest weight (root, cgroup v1)",
    )
    a = ap.parse_args()
    prio = _CpuPriority() if a.cpu_priority else None
    try:
        _bench(a)
    finally:
        if prio is not None:
            prio.close()


def _bench(a) -> None:
    from slime.sandbox.runner import _find_python

    python = _find_python() or "python3"
    isolated = os.geteuid() == 0
    slots = a.slots or a.concurrency
    url, handle = _start_server(None, slots, 4 * a.concurrency, isolated, None)  # (its own uid range)
    other = _start_server(a.compare_tree, slots, 4 * a.concurrency, isolated, 64000) if a.compare_tree else None
    try:
        import requests

        health = requests.get(f"{url}/health", timeout=10).json()
        asyncio.run(_sandbox_rate(url, a.concurrency, 0.5))  # warm-up
        if other:
            asyncio.run(_sandbox_rate(other[0], a.concurrency, 0.5))
        sb, bare, bare1, sb_other, warm = [], [], [], [], []
        for _ in range(a.rounds):
            warm.append(_warm_fork_rate(python, a.concurrency, a.seconds))
            bare.append(_spawn_rate(python, a.concurrency, a.seconds))
            sb.append(asyncio.run(_sandbox_rate(url, a.concurrency, a.seconds)))
            if other:
                sb_other.append(asyncio.run(_sandbox_rate(other[0], a.concurrency, a.seconds)))
            bare1.append(asyncio.run(_spawn_rate_one_process(python, a.concurrency, a.seconds)))
    finally:
        handle.stop()
        if other:
            other[1].stop()
    ms, mb, mb1, mw = statistics.median(sb), statistics.median(bare), statistics.median(bare1), statistics.median(warm)
    load = os.getloadavg()[0]
    print(
        f"concurrency={a.concurrency} seconds/round={a.seconds:g} rounds={a.rounds} cores={os.cpu_count()} "
        f"interpreter={python} isolation={health['isolation']} cgroups={health['cgroups']} "
        f"seccomp={health['seccomp']} per-process-only={','.join(health['per_process_only']) or '-'} "
        f"load-avg-1min-at-end={load:.1f} cpu-priority={bool(a.cpu_priority)}"
    )
    print("| path | runs/s (median) | rounds |")
    print("|---|---:|---|")
    print(
        f"| warm fork of `{os.path.basename(python)}` running `print(1)`, no isolation, {a.concurrency} forkers | "
        f"{mw:.0f} | {', '.join(f'{x:.0f}' for x in warm)} |"
    )
    print(
        f"| bare `{os.path.basename(python)} -c 'print(1)'` spawns, {a.concurrency} spawner processes | {mb:.0f} | "
        f"{', '.join(f'{x:.0f}' for x in bare)} |"
    )
    print(f"| same spawns from one asyncio process | {mb1:.0f} | {', '.join(f'{x:.0f}' for x in bare1)} |")
    print(f"| slime-sandbox `print(1)` (HTTP, isolated, limited) | {ms:.0f} | {', '.join(f'{x:.0f}' for x in sb)} |")
    if other:
        mo = statistics.median(sb_other)
        rounds = ", ".join(f"{x:.0f}" for x in sb_other)
        print(f"| slime-sandbox `print(1)` of {a.compare_tree} | {mo:.0f} | {rounds} |")
        print(f"ratio {a.compare_tree}/bare spawns: {mo / mb:.2f}x")
    print(f"ratio sandbox/warm fork (fair baseline: the price of isolation, limits and HTTP): {ms / mw:.2f}x")
    print(f"ratio sandbox/bare spawns: {ms / mb:.2f}x (target >= 3x); vs spawns from one process: {ms / mb1:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
