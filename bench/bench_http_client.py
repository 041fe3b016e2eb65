"""Instructions per engine request in the client process: slime's `EngineClient.generate` against a raw aiohttp client.

The CPU benches (bench_rollout_overhead, bench_agent_gateway) cannot resolve a 1-2% change of the HTTP layer on a
shared box: the raw client's own rounds spread 0.3-0.7 ms. Instructions counted by callgrind do not depend on the
box's load (repeats agree to ~0.5%), so a change of the HTTP layer is judged here. A zero-latency scripted engine
sits behind the real sglang-router, as in bench_rollout_overhead; each (tree, path) runs in a client process of
its own under `valgrind --tool=callgrind`, counting only the measured requests (a 300-request warm-up is not
counted): instrumentation is switched on and off around them through a tiny C shim built with gcc at start.

    python -m bench.bench_http_client [--requests 2000] [--concurrency 64] [--repeats 2] [--before-tree DIR ...]

Paths: `raw` (`session.post(url, json=body)`, `resp.json()`, the bench_rollout_overhead raw client's request),
`slime` (`EngineClient.generate`: the in-flight bound, the deadline, retries, the router-loss watch and the
answer's checks).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("SLIME_BENCH_TREE", str(ROOT)))

from bench.bench_rollout_overhead import PROMPT, SAMPLING_PARAMS  # noqa: E402 - the same requests as that bench


SHIM = """#include <valgrind/callgrind.h>
void on(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void off(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("measured"); }
"""


async def client(path: str, url: str, n: int, concurrency: int, shim: ctypes.CDLL) -> None:
    """`n` requests of `path`, `concurrency` in flight, counted between `shim.on()` and `shim.off()`."""
    import aiohttp

    if path == "raw":
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        async def one(i: int) -> None:
            body = {"input_ids": PROMPT, "sampling_params": SAMPLING_PARAMS, "return_logprob": True, "rid": f"r{i}"}
            async with session.post(f"{url}/generate", json=body) as r:
                assert (await r.json(content_type=None))["meta_info"]["output_token_logprobs"]

        close = session.close
    else:
        from slime.rollout.engine_client import EngineClient
        from slime.utils.endpoints import Endpoints

        engine_client = EngineClient(Endpoints(router_url=url), concurrency=concurrency, vocab_size=1 << 20)

        async def one(i: int) -> None:
            assert len((await engine_client.generate(PROMPT, SAMPLING_PARAMS)).token_ids) == 8

        close = engine_client.close
    bound = asyncio.Semaphore(concurrency)

    async def bounded(i: int) -> None:
        async with bound:
            await one(i)

    await asyncio.gather(*(bounded(i) for i in range(300)))  # warm-up, not counted
    shim.on()
    await asyncio.gather(*(bounded(i) for i in range(300, 300 + n)))
    shim.off()
    await close()


def count(tree: Path, path: str, url: str, a: argparse.Namespace, shim: Path, out: Path) -> float:
    """Instructions per request of one client process under callgrind."""
    for f in out.parent.glob(f"{out.name}*"):
        f.unlink()
    env = {**os.environ, "SLIME_BENCH_TREE": str(tree), "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p"]
    cmd += [sys.executable, str(Path(__file__).resolve()), "--client", path, "--url", url, "--shim", str(shim)]
    cmd += ["--requests", str(a.requests), "--concurrency", str(a.concurrency)]
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total = 0
    for f in out.parent.glob(f"{out.name}.*"):
        total += sum(int(line.split()[1]) for line in f.read_text().splitlines() if line.startswith("totals:"))
    return total / a.requests


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2, help="client processes per (tree, path), alternating")
    ap.add_argument("--before-tree", type=Path, action="append", default=[])
    ap.add_argument("--client", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--shim", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.client:
        return asyncio.run(client(a.client, a.url, a.requests, a.concurrency, ctypes.CDLL(a.shim)))

    import requests

    from slime.fleet.router import Router
    from slime.testing.tiny_model import build_tiny_model
    from slime.utils.child_process import wait_until
    from slime.utils.misc import find_free_port

    work = Path(tempfile.mkdtemp(prefix="bench-http-"))
    (work / "shim.c").write_text(SHIM)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", work / "shim.so", work / "shim.c"], check=True)
    model_dir = build_tiny_model(Path(tempfile.gettempdir()) / "slime-bench-tiny")
    port = find_free_port()
    engine = [sys.executable, "-m", "slime.testing.scripted_engine", "--port", str(port)]
    stub = subprocess.Popen(engine + ["--model-path", str(model_dir), "--tokens", "8"], cwd=ROOT)
    router = Router().start()
    try:
        wait_until(lambda: requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok, 30, "stub engine")
        router.add_worker(f"http://127.0.0.1:{port}")
        runs = [("raw", ROOT)] + [("slime", t.resolve()) for t in [ROOT, *a.before_tree]]
        counts: dict[tuple[str, Path], list[float]] = {run: [] for run in runs}
        for _ in range(a.repeats):
            for path, tree in runs:
                counts[path, tree].append(count(tree, path, router.url, a, work / "shim.so", work / "cg"))
        print(f"instructions per request (thousands), client process, {a.requests} requests at {a.concurrency}")
        raw = min(counts["raw", ROOT])
        for (path, tree), xs in counts.items():
            runs_k = ", ".join(f"{x / 1e3:.1f}" for x in xs)
            print(f"{path:<6} {str(tree):<40} {min(xs) / 1e3:8.1f}  ({runs_k})  {min(xs) / raw:.3f}x raw")
    finally:
        router.stop()
        stub.terminate()
        stub.wait(30)


if __name__ == "__main__":
    main()
