"""The scale curve: the default rollout against 1, 16, 64 and 256 engines behind the real router.

Engines are zero-latency scripted engines (`slime.testing.scripted_engine`'s app: SGLang's HTTP protocol,
8 tokens per answer), as many per process as `--engines-per-process` (one event loop serving every
port of its share), so 256 of them fit a small box. Each fleet size has its own real sglang-router
(with the health-check interval under test) and its own manager process running the default rollout
(`generate_rollout` -> training batch, through the engine client, as the controller calls it). Every
fleet stays up for the whole run and the rounds interleave the sizes (1, 16, 64, 256, 1, 16, ...), so
load drift and the idle fleets' background work (their health checks) fall on every size alike. Last,
one window with every fleet idle gives each router's and engine set's background CPU per second: the
cost of the router's health checks alone (one GET per engine per interval).

Measured per round from outside (psutil, user + system CPU of each process and its children): the
manager's, the router's and the engines' CPU per sample, and the manager's resident memory; reported
as medians and as ratios to the 1-engine fleet. Every fleet gets the same in-flight bound (`--concurrency`:
`--sglang-server-concurrency` = concurrency / engines), so only the fleet size changes.

Then memory per in-flight sample: one more manager runs a rollout of `--in-flight` samples with that
many allowed in flight against a holding engine that keeps every request open until all have arrived.
(RSS while all are held - RSS at rest after a warm-up) / samples. The manager talks to the holding
engine directly: through the router every request would hold two sockets there, over this box's open-file
limit at 10,000.

    python -m bench.bench_scale [--sizes 1 16 64 256] [--rounds 3] [--samples 2048] [--concurrency 256]
                                [--intervals S ...] [--engines-per-process 64] [--in-flight 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

PROMPT = list(range(1000, 1032))
N_PER_PROMPT = 8
TOKENS = 8


# ---- engine host: one process, one event loop, many engine ports ----
def engine_host(a: argparse.Namespace) -> None:
    """Serve the scripted engine on `--ports` fresh ports; print them. `--hold`: /generate waits while
    armed (POST /bench/hold), /bench/wait?at_least=K answers once K are waiting, /bench/release answers them."""
    import uvicorn

    from slime.testing.scripted_engine import build_app

    ids = list(range(100, 100 + TOKENS))
    state: dict[str, Any] = {"armed": False, "held": 0}
    cond = asyncio.Condition()
    released = asyncio.Event()

    async def script(body: dict[str, Any]) -> dict[str, Any]:
        if state["armed"]:
            async with cond:
                state["held"] += 1
                cond.notify_all()
            await released.wait()
        return {"output_ids": ids, "finish_type": "stop", "text": ""}

    app = build_app(script, a.model_dir)

    @app.post("/bench/hold")
    async def hold():
        state["armed"], state["held"] = True, 0
        released.clear()
        return {}

    @app.get("/bench/wait")
    async def wait(at_least: int):
        async with cond:
            await cond.wait_for(lambda: state["held"] >= at_least)
        return {"held": state["held"]}

    @app.post("/bench/release")
    async def release():
        state["armed"] = False
        released.set()
        return {}

    socks = []
    for _ in range(a.ports):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen(4096)  # connections queue here until the server accepts them
        socks.append(s)
    print(*(s.getsockname()[1] for s in socks), flush=True)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="error", access_log=False, lifespan="off", backlog=4096, timeout_keep_alive=300)
    )
    server.run(sockets=socks)


# ---- manager: the default rollout, one measured rollout per `run` line on stdin ----
def manager(a: argparse.Namespace) -> None:
    from slime.cli.args import parse_args
    from slime.rollout.controller import convert_samples_to_train_data
    from slime.rollout.data_source import DataSource
    from slime.rollout.sglang_rollout import generate_rollout
    from slime.testing.runtime import bind_runtime
    from slime.utils.async_utils import run
    from slime.utils.types import Sample

    def setup(samples: int) -> tuple[Any, Any]:
        args = parse_args(
            [
                "--rollout-backend",
                "hf",
                "--hf-checkpoint",
                a.model_dir,
                "--sglang-router-ip",
                "127.0.0.1",
                "--sglang-router-port",
                str(a.router_port),
                "--rm-type",
                "exact",
                "--rollout-num-engines",
                str(a.engines),
                "--rollout-batch-size",
                str(samples // N_PER_PROMPT),
                "--n-samples-per-prompt",
                str(N_PER_PROMPT),
                "--rollout-max-response-len",
                str(TOKENS),
                "--sglang-server-concurrency",
                str(max(1, a.concurrency // a.engines)),
            ]
        )
        return args, bind_runtime(args)

    def rollout(samples: int) -> None:
        n_prompts = samples // N_PER_PROMPT
        if samples not in runtimes:
            runtimes[samples] = setup(samples)
        args, runtime = runtimes[samples]
        prompts = [Sample(prompt="p", tokens=list(PROMPT), label="x") for _ in range(n_prompts)]
        runtime.bind()  # this size's runtime: generate_rollout uses the bound one (slime's signature)
        out = generate_rollout(args, 0, DataSource(args, prompts, N_PER_PROMPT))
        batch = convert_samples_to_train_data(args, [s for g in out.samples for s in g])
        if len(batch["tokens"]) != samples or any(len(m) != TOKENS for m in batch["loss_masks"]):
            raise RuntimeError(f"rollout returned {len(batch['tokens'])} samples, expected {samples}")

    runtimes: dict[int, Any] = {}
    rollout(min(a.samples, 256))  # warm-up
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        rollout(a.samples)
        print("done", flush=True)
    for _, runtime in runtimes.values():
        run(runtime.client.close())


# ---- the measuring side ----
def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU of these processes and their descendants."""
    total = 0.0
    for p in procs:
        for q in [p, *p.children(recursive=True)]:
            try:
                t = q.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.NoSuchProcess:
                pass
    return total


class Child:
    """A role of this file in its own process, talking over stdin/stdout lines."""

    def __init__(self, *role_args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *role_args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.ps = psutil.Process(self.proc.pid)

    def line(self) -> str:
        out = self.proc.stdout.readline()
        if not out:
            raise RuntimeError(f"{self.proc.args[2:]} exited with {self.proc.wait()}")
        return out.strip()

    def send(self, text: str) -> None:
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.terminate()
        self.proc.wait(timeout=30)


class ScaleFleet:
    """`size` engines (at most `--engines-per-process` per process), a router, and a manager."""

    def __init__(self, size: int, interval: int, a: argparse.Namespace, model_dir: str) -> None:
        from slime.fleet.router import Router, register_worker

        self.size, self.interval = size, interval
        self.hosts, self.urls = [], []
        for start in range(0, size, a.engines_per_process):
            n = min(a.engines_per_process, size - start)
            host = Child("--engine-host", "--ports", str(n), "--model-dir", model_dir)
            self.hosts.append(host)
            self.urls += [f"http://127.0.0.1:{p}" for p in host.line().split()]
        self.router = Router(health_check_interval=interval).start()
        with ThreadPoolExecutor(8) as pool:  # registrations wait for the router's first check: overlap them
            list(pool.map(lambda url: register_worker(self.router.url, url), self.urls))
        self.router_ps = psutil.Process(self.router.pid)
        self.manager = Child(
            "--manager",
            "--router-port",
            str(self.router.port),
            "--engines",
            str(size),
            "--samples",
            str(a.samples),
            "--concurrency",
            str(a.concurrency),
            "--model-dir",
            model_dir,
        )
        if self.manager.line() != "ready":
            raise RuntimeError(f"manager for {size} engines did not start")
        self.rounds: list[tuple[float, float, float]] = []  # CPU ms per sample: manager, router, engines
        self.rss: list[float] = []
        self.idle: tuple[float, float] = (0.0, 0.0)  # CPU ms per second while no rollout runs: router, engines

    def background_cpu(self) -> tuple[float, float]:
        return cpu_seconds([self.router_ps]), cpu_seconds([h.ps for h in self.hosts])

    def measure(self, samples: int) -> None:
        engines = [h.ps for h in self.hosts]
        before = cpu_seconds([self.manager.ps]), cpu_seconds([self.router_ps]), cpu_seconds(engines)
        self.manager.send("run")
        if self.manager.line() != "done":
            raise RuntimeError("manager failed")
        after = cpu_seconds([self.manager.ps]), cpu_seconds([self.router_ps]), cpu_seconds(engines)
        self.rounds.append(tuple((y - x) * 1000 / samples for x, y in zip(before, after)))
        self.rss.append(self.manager.ps.memory_info().rss / 2**20)

    def medians(self) -> tuple[float, ...]:
        return (*(statistics.median(x) for x in zip(*self.rounds)), statistics.median(self.rss))

    def stop(self) -> None:
        self.manager.stop()
        self.router.stop()
        for h in self.hosts:
            h.stop()


def in_flight_memory(n: int, model_dir: str) -> tuple[float, float, float]:
    """(MB at rest, MB with `n` held, KB per in-flight sample) of a manager holding `n` requests open."""
    host = Child("--engine-host", "--ports", "1", "--model-dir", model_dir, "--hold")
    url = f"http://127.0.0.1:{host.line()}"
    mgr = None
    try:
        mgr = Child(
            "--manager",
            "--router-port",
            url.rsplit(":", 1)[1],
            "--engines",
            "1",
            "--samples",
            str(n),
            "--concurrency",
            str(n),
            "--model-dir",
            model_dir,
        )
        if mgr.line() != "ready":
            raise RuntimeError("in-flight manager did not start")
        rest = mgr.ps.memory_info().rss
        requests.post(f"{url}/bench/hold", timeout=10).raise_for_status()
        mgr.send("run")
        requests.get(f"{url}/bench/wait", params={"at_least": n}, timeout=600).raise_for_status()
        held = mgr.ps.memory_info().rss
        requests.post(f"{url}/bench/release", timeout=10).raise_for_status()
        if mgr.line() != "done":
            raise RuntimeError("in-flight rollout failed")
        return rest / 2**20, held / 2**20, (held - rest) / n / 1024
    finally:
        if mgr is not None:
            mgr.stop()
        host.stop()


def idle_window(fleets: list[ScaleFleet], seconds: float) -> None:
    """Every fleet's router and engine CPU over one window with no rollout running: the health checks'
    cost (and any other background work), per second."""
    before = [f.background_cpu() for f in fleets]
    time.sleep(seconds)  # a measurement window, not a wait for an event
    for f, b in zip(fleets, before):
        f.idle = tuple((y - x) * 1000 / seconds for x, y in zip(b, f.background_cpu()))


def report(fleets: list[ScaleFleet], a: argparse.Namespace) -> list[str]:
    lines = [
        "| health check s | engines | manager CPU ms/sample | router | engines | manager RSS MB "
        "| manager x | router x | engines x | memory x | idle CPU ms/s: router | engines |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for interval in a.intervals:
        rows = [f for f in fleets if f.interval == interval]
        base = rows[0].medians()
        for f in rows:
            m = f.medians()
            x = [v / b if b else float("nan") for v, b in zip(m, base)]
            lines.append(
                f"| {interval} | {f.size} | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.3f} | {m[3]:.0f} "
                f"| {x[0]:.2f}x | {x[1]:.2f}x | {x[2]:.2f}x | {x[3]:.2f}x | {f.idle[0]:.1f} | {f.idle[1]:.1f} |"
            )
        big = rows[-1].medians()
        x = [v / b for v, b in zip(big, base)]
        ok = x[0] <= 1.2 and x[1] <= 1.5 and x[2] <= 1.5
        verdicts.append(
            f"health check every {interval} s, {rows[-1].size} vs {rows[0].size} engine(s): manager "
            f"{x[0]:.2f}x (target <= 1.2x), router {x[1]:.2f}x, engines {x[2]:.2f}x (targets <= 1.5x), "
            f"manager memory {x[3]:.2f}x: {'met' if ok else 'NOT met'}"
        )
    return lines + verdicts


def main() -> None:
    from slime.fleet.flags import DEFAULT_ROUTER_HEALTH_CHECK_INTERVAL

    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 64, 256])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=2048, help="samples per rollout (round)")
    ap.add_argument("--concurrency", type=int, default=256, help="in-flight bound of every fleet's manager")
    ap.add_argument(
        "--intervals",
        type=int,
        nargs="+",
        default=[DEFAULT_ROUTER_HEALTH_CHECK_INTERVAL],
        help="router health-check intervals (s) to compare; one set of fleets each",
    )
    ap.add_argument("--engines-per-process", type=int, default=64)
    ap.add_argument(
        "--idle-seconds",
        type=float,
        default=10.0,
        help="window in which the idle fleets' background CPU (health checks) is measured",
    )
    ap.add_argument("--in-flight", type=int, default=10000, help="0: skip the in-flight memory figure")
    ap.add_argument("--engine-host", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--manager", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ports", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--engines", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--router-port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.engine_host:
        return engine_host(a)
    if a.manager:
        return manager(a)

    from slime.testing.tiny_model import build_tiny_model

    model_dir = str(build_tiny_model(Path(tempfile.gettempdir()) / "slime-bench-tiny"))
    sizes = sorted(a.sizes)
    procs = {s: -(-s // a.engines_per_process) for s in sizes}
    print(
        f"zero-latency scripted engines, up to {a.engines_per_process} per process "
        f"({', '.join(f'{s}: {p} process(es)' for s, p in procs.items())}); one router and one manager per "
        f"fleet; {a.samples} samples per round ({N_PER_PROMPT} per prompt, {TOKENS} tokens each), in-flight bound "
        f"{a.concurrency} for every fleet; {a.rounds} rounds, fleet sizes interleaved; medians; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    fleets: list[ScaleFleet] = []
    try:
        for interval in a.intervals:
            for size in sizes:
                fleets.append(ScaleFleet(size, interval, a, model_dir))
        for _ in range(a.rounds):
            for f in fleets:
                f.measure(a.samples)
        idle_window(fleets, a.idle_seconds)
    finally:
        for f in fleets:
            f.stop()
    print("\n".join(report(fleets, a)), flush=True)
    if a.in_flight:
        rest, held, per = in_flight_memory(a.in_flight, model_dir)
        print(
            f"memory per in-flight sample: {per:.1f} KB ({a.in_flight} samples held open by the engine: manager "
            f"RSS {rest:.0f} MB at rest -> {held:.0f} MB); load average at end {os.getloadavg()[0]:.1f}"
        )


if __name__ == "__main__":
    main()
