"""Instructions per request in the agent gateway's process, counted by callgrind, per source tree.

The CPU bench (`bench_agent_gateway` section 1b) cannot resolve a 10-20% change of the gateway's own work on a
shared box: a tree's own rounds spread by +-0.25 ms. Instructions counted by callgrind do not depend on the load
(repeats agree to ~1%). Each (tree, path) runs a gateway in a process of its own under `valgrind --tool=callgrind`,
in front of the real sglang-router and two zero-latency scripted engines (processes of their own, not counted);
this process is the client, sending section 1b's single-turn requests at concurrency 8. Only the measured requests
are counted: instrumentation is switched on and off around them through a tiny C shim built with gcc at start.

    python -m bench.bench_gateway_instructions [--requests 200] [--repeats 2] [--before-tree DIR ...]

Paths: `shared` (every session opens with one prompt, as a GRPO group's do), `own` (each its own first prompt),
`task` (an agent's task each: a shared ~1,000-token system message and tool schemas, its own task).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("SLIME_BENCH_TREE", str(ROOT)))  # a measured gateway imports slime from its tree

SHIM = """#include <valgrind/callgrind.h>
void on(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void off(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("measured"); }
"""
PATHS = ("shared", "own", "task")


def messages_of(path: str, i: int) -> tuple[list[dict], list[dict] | None]:
    from bench.bench_agent_gateway import AGENT_TOOLS, agent_task  # (the client's side: this tree's bench)

    if path == "shared":
        return [{"role": "user", "content": "case=ovc hello"}], None
    if path == "own":
        return [{"role": "user", "content": f"case=ovc own {i}"}], None
    return agent_task("cg", i), AGENT_TOOLS


def serve(a: argparse.Namespace) -> None:
    """The gateway under measurement: this tree's, in front of the router and engines given; commands
    on stdin (`open N`: open N sessions, print their keys; `on` / `off`: count or not), a line each."""
    from transformers import AutoTokenizer

    from slime.agent.gateway.server import Gateway
    from slime.rollout.engine_client import EngineClient
    from slime.testing.tiny_model import qwen_tokenizer_dir
    from slime.utils.endpoints import Endpoints

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    client = EngineClient(Endpoints(a.router, json.loads(a.engines)), tokenizer=tok, request_timeout=300.0)
    gw = Gateway(client, tokenizer=tok).start()
    shim = ctypes.CDLL(a.shim)
    print(json.dumps({"url": gw.url}), flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "open":
            keys = [gw.open_session(f"s{k}-{i}") for k, i in enumerate(range(int(args[0])))]
            print(json.dumps(keys), flush=True)
        elif cmd == "on":
            shim.on()
            print("{}", flush=True)
        elif cmd == "off":
            shim.off()
            print("{}", flush=True)
    gw.stop()


class Measured:
    """A gateway process under callgrind, driven over its stdin."""

    def __init__(self, tree: Path, router: str, engines: list[str], shim: Path, out: Path) -> None:
        env = {**os.environ, "SLIME_BENCH_TREE": str(tree), "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
        cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p"]
        cmd += [sys.executable, str(Path(__file__).resolve()), "--serve", "--engines", json.dumps(engines)]
        cmd += ["--router", router, "--shim", str(shim)]
        self.out = out
        self.proc = subprocess.Popen(
            cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
        )
        self.url = self.ask("")["url"]

    def ask(self, command: str):
        if command:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the measured gateway ended (exit code {self.proc.poll()})")
        return json.loads(line)

    def stop(self) -> float:
        """Instructions counted, in total; the process ends."""
        self.proc.stdin.close()
        self.proc.wait(timeout=300)
        total = 0
        for f in self.out.parent.glob(f"{self.out.name}.*"):
            total += sum(int(line.split()[1]) for line in f.read_text().splitlines() if line.startswith("totals:"))
            f.unlink()
        return total


async def drive(gw: Measured, path: str, n: int, warm: int, concurrency: int = 8) -> None:
    import aiohttp

    keys = gw.ask(f"open {warm + n}")
    async with aiohttp.ClientSession() as http:

        async def one(i: int) -> None:
            messages, tools = messages_of(path, i)
            body = {"model": "m", "messages": messages, "max_tokens": 64, **({"tools": tools} if tools else {})}
            async with http.post(f"{gw.url}/s/{keys[i]}/v1/chat/completions", json=body) as r:
                assert r.status == 200, await r.text()
                await r.read()

        async def pool(indexes: range) -> None:
            queue = iter(indexes)

            async def worker() -> None:
                for i in queue:
                    await one(i)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

        await pool(range(warm))  # not counted: the process's one-off work (imports, caches, first renders)
        gw.ask("on")
        await pool(range(warm, warm + n))
        gw.ask("off")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warm-up", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2, help="gateway processes per (tree, path), alternating")
    ap.add_argument("--paths", default=",".join(PATHS), type=lambda v: v.split(","))
    ap.add_argument("--before-tree", type=Path, action="append", default=[])
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engines", help=argparse.SUPPRESS)
    ap.add_argument("--router", help=argparse.SUPPRESS)
    ap.add_argument("--shim", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        return serve(a)
    work = Path(tempfile.mkdtemp(prefix="bench-gw-cg-"))
    (work / "shim.c").write_text(SHIM)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", work / "shim.so", work / "shim.c"], check=True)
    from bench.bench_agent_gateway import EngineProcess
    from slime.fleet.router import Router

    engines = EngineProcess()
    router = Router(log_dir=str(work)).start()
    for url in engines.urls:
        router.add_worker(url)
    trees = [ROOT, *(t.resolve() for t in a.before_tree)]
    counts: dict[tuple[str, Path], list[float]] = {(p, t): [] for p in a.paths for t in trees}
    try:
        for _ in range(a.repeats):
            for path in a.paths:
                for tree in trees:
                    gw = Measured(tree, router.url, engines.urls, work / "shim.so", work / "cg")
                    try:
                        asyncio.run(drive(gw, path, a.requests, a.warm_up))
                    finally:
                        total = gw.stop()
                    counts[path, tree].append(total / a.requests)
    finally:
        router.stop()
        engines.stop()
    print(
        f"instructions per request (thousands), the gateway's process under callgrind, {a.requests} requests at "
        f"concurrency 8 after {a.warm_up} not counted; each repeat a process of its own"
    )
    print("| path | tree | min | repeats |")
    print("|---|---|---:|---|")
    for (path, tree), xs in counts.items():
        print(f"| {path} | {tree} | {min(xs) / 1e3:.0f} | {', '.join(f'{x / 1e3:.0f}' for x in xs)} |")


if __name__ == "__main__":
    main()
