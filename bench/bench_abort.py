"""Client CPU per sample at 1% transient engine errors, with 4 and 256 engines (issue 20, item 9).

A retried request used to abort its old `rid` on every engine: at 256 engines one transient error
cost 256 HTTP requests, and the client's CPU per sample was 2.6-2.9x its error-free cost. Now the
old rid is aborted only when no answer came back for it (an answer, even a 503, means no engine
still runs it). This measures `EngineClient.generate` through the real sglang-router to N scripted
engines (all registered, all answering `/abort_request`), hosted by one child process, rounds at 0%
and 1% errors interleaved; the engines answer 503 to a seeded 1% of requests. CPU is this process's
(`time.process_time`), which the engines, the router and other load on the machine do not inflate.
"abort everywhere" is the old policy (every retry aborts its rid on every engine), measured in the
same run for reference.

    python -m bench.bench_abort [--engines 4 256] [--samples 2000] [--rounds 7] [--error-rate 0.01]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

TOKENS = list(range(100, 108))
PROMPT = list(range(1000, 1032))


def host(a: argparse.Namespace) -> None:
    """Child process: `--engines` scripted engines on one event loop, on ports it binds itself and
    prints on one line; `/bench/error_rate` on any of them sets the share of `/generate` answered
    503 for all (one seeded generator)."""
    import uvicorn
    from fastapi import HTTPException
    from fastapi.responses import JSONResponse

    from slime.testing.scripted_engine import build_app

    state = {"rate": 0.0, "rng": random.Random(0)}

    def script(body):
        if state["rng"].random() < state["rate"]:
            raise HTTPException(status_code=503, detail="transient")
        return {"output_ids": TOKENS, "finish_type": "length", "text": ""}

    async def set_rate(request):
        body = await request.json()
        state["rate"], state["rng"] = float(body["rate"]), random.Random(int(body["seed"]))
        return JSONResponse({"rate": state["rate"]})

    servers, sockets = [], []
    for _ in range(a.engines[0]):
        app = build_app(script, a.model_dir)
        app.add_route("/bench/error_rate", set_rate, methods=["POST"])
        servers.append(uvicorn.Server(uvicorn.Config(app, log_level="error", access_log=False, lifespan="off")))
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))  # bound here, not picked by the parent: no other process can take it
        sockets.append(sock)
    print(*(s.getsockname()[1] for s in sockets), flush=True)

    def stop_when_stdin_closes() -> None:  # uvicorn's signal handling covers one server, not 256
        sys.stdin.read()
        for srv in servers:
            srv.should_exit = True

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()

    async def serve():
        await asyncio.gather(*(srv.serve(sockets=[sock]) for srv, sock in zip(servers, sockets)))

    asyncio.run(serve())


class Fleet:
    """N scripted engines (one child process) behind a real router of their own."""

    def __init__(self, n: int, model_dir: Path):
        from slime.fleet.router import Router
        from slime.utils.child_process import wait_until

        started, self.router = time.monotonic(), None
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.bench_abort", "--host", "--model-dir",
                                      str(model_dir), "--engines", str(n)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        try:
            self.urls = [f"http://127.0.0.1:{p}" for p in self.proc.stdout.readline().split()]
            if len(self.urls) != n:
                raise RuntimeError(f"engine host exited with {self.proc.wait()} before binding {n} ports")
            for u in self.urls:
                wait_until(lambda u=u: requests.get(f"{u}/health", timeout=2).ok, 120, f"engine {u}", self.proc)
            # health checks of 256 workers every second would load the machine: every 60 s is enough here
            self.router = Router(health_check_interval=60).start()
            for u in self.urls:
                self.router.add_worker(u)
        except BaseException:
            self.stop()
            raise
        print(f"  ({n} engines serving and registered in {time.monotonic() - started:.0f} s)", file=sys.stderr,
              flush=True)

    def set_error_rate(self, rate: float, seed: int) -> None:
        r = requests.post(f"{self.urls[0]}/bench/error_rate", json={"rate": rate, "seed": seed}, timeout=10)
        r.raise_for_status()

    def stop_engines(self) -> None:
        self.proc.stdin.close()  # the host stops its servers and exits
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        self.stop_engines()


def make_client(fleet: Fleet, everywhere: bool):
    from slime.rollout.engine_client import EngineClient
    from slime.utils.endpoints import Endpoints

    class AbortEverywhere(EngineClient):
        """The policy before issue 20: every retry aborts its old rid on every engine."""

        def _renew_rid(self, payload, failure):
            return super()._renew_rid(payload, type(failure)(failure.reason, failure.detail, True))

    cls = AbortEverywhere if everywhere else EngineClient
    client = cls(Endpoints(fleet.router.url, fleet.urls), concurrency=64, vocab_size=2048)
    client.retry_policy.base_delay = client.retry_policy.max_delay = 0.0  # no back-off sleeps in the figure
    return client


async def generate_all(client, n: int) -> None:
    outs = await asyncio.gather(*(client.generate(PROMPT, {"max_new_tokens": 8}) for _ in range(n)))
    assert all(o.token_ids == TOKENS for o in outs)
    await asyncio.gather(*client._background)  # the aborts are part of the cost


def measure(fleet: Fleet, everywhere: bool, rate: float, n: int, seed: int) -> tuple[float, int, int]:
    """(client CPU ms per sample, retries, abort requests) of one round of `n` samples."""
    fleet.set_error_rate(rate, seed)
    client = make_client(fleet, everywhere)

    async def go():
        try:
            await generate_all(client, n)
        finally:
            await client.close()

    cpu = time.process_time()
    asyncio.run(go())
    cpu_ms = (time.process_time() - cpu) * 1000 / n
    return cpu_ms, client.stats.total_retries, client.abort_stats.requests


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, nargs="*", default=[4, 256])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--error-rate", type=float, default=0.01)
    ap.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.host:
        return host(a)

    from slime.testing.tiny_model import build_tiny_model

    model_dir = build_tiny_model(Path(tempfile.gettempdir()) / "slime-bench-tiny")
    print(f"samples={a.samples} per round, rounds={a.rounds}, errors={a.error_rate:.0%} (engine 503s), "
          "client CPU ms per sample (median of rounds)")
    for n_engines in a.engines:
        fleet = Fleet(n_engines, model_dir)
        try:
            measure(fleet, False, 0.0, 200, 0)  # warm-up: connections, code paths
            runs: dict[str, list[tuple[float, int, int]]] = {"0%": [], "1%": [], "1% abort everywhere": []}
            for r in range(a.rounds):  # interleaved, so drift of the machine's load hits all alike
                runs["0%"].append(measure(fleet, False, 0.0, a.samples, r))
                runs["1%"].append(measure(fleet, False, a.error_rate, a.samples, r))
                runs["1% abort everywhere"].append(measure(fleet, True, a.error_rate, a.samples, r))
        finally:
            fleet.stop()
        base = statistics.median(c for c, _, _ in runs["0%"])
        print(f"{n_engines} engines:")
        for name, xs in runs.items():
            cpu = statistics.median(c for c, _, _ in xs)
            retries, aborts = sum(x[1] for x in xs), sum(x[2] for x in xs)
            print(f"  {name:<20}: {cpu:6.3f} ms/sample  ratio {cpu / base:5.2f}x  (retries {retries}, "
                  f"abort requests {aborts}; rounds {', '.join(f'{c:.3f}' for c, _, _ in xs)})")
    print("target: the 1% ratio <= 1.2x at 256 engines")


if __name__ == "__main__":
    main()
