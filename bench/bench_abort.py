"""Client CPU per sample at 1% transient engine errors, with 4 and 256 engines (issue 20, item 9).

A retried request used to abort its old `rid` on every engine: at 256 engines one transient error
cost 256 HTTP requests, and the client's CPU per sample was 2.6-2.9x its error-free cost. Now an
answered request (even a 503) is aborted nowhere, and one abandoned without an answer (a timeout)
is aborted where it was: through the router, by the closed connection (the router closes its own
to that engine, which aborts the request), so nothing is sent. This measures `EngineClient.generate`
through the real sglang-router to N scripted engines (all registered, all answering `/abort_request`),
hosted by one child process, rounds of every condition interleaved. The errors are a seeded 1% of
requests: answered 503, or left hanging until the client's deadline (`--timeout`) gives up on them.
CPU is this process's (`time.process_time`), which the engines, the router and other load on the
machine do not inflate. "abort everywhere" is the old policy for timeouts (the abandoned rid
aborted on every engine), measured in the same run for reference.

    python -m bench.bench_abort [--engines 4 256] [--samples 2000] [--rounds 7] [--error-rate 0.01] [--timeout 10]
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

    state = {"rate": 0.0, "rng": random.Random(0), "kind": "503"}

    async def script(body, aborted: asyncio.Event):
        if state["rng"].random() < state["rate"]:
            if state["kind"] == "503":
                raise HTTPException(status_code=503, detail="transient")
            await aborted.wait()  # a stuck request: until an abort, or its client going away
            return {"output_ids": [], "finish_type": "abort", "text": ""}
        return {"output_ids": TOKENS, "finish_type": "length", "text": ""}

    async def set_rate(request):
        body = await request.json()
        state.update(rate=float(body["rate"]), rng=random.Random(int(body["seed"])), kind=body["kind"])
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
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_abort", "--host", "--model-dir", str(model_dir), "--engines", str(n)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
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
        print(
            f"  ({n} engines serving and registered in {time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True
        )

    def set_error_rate(self, rate: float, seed: int, kind: str) -> None:
        r = requests.post(
            f"{self.urls[0]}/bench/error_rate", json={"rate": rate, "seed": seed, "kind": kind}, timeout=10
        )
        r.raise_for_status()

    def stop_engines(self) -> None:
        self.proc.stdin.close()  # the host stops its servers and exits
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        self.stop_engines()


def make_client(fleet: Fleet, everywhere: bool, timeout: float):
    from slime.fleet import sglang_payloads as payloads
    from slime.rollout.engine_client import EngineClient
    from slime.utils.endpoints import Endpoints

    class AbortEverywhere(EngineClient):
        """The policy before issue 20: a request abandoned without an answer is aborted on every engine."""

        def _renew_rid(self, payload, failure, engine):
            if failure.may_still_run:
                body = payloads.abort_request(rid=payload["rid"])
                self._in_background(self._abort_on(list(self.endpoints.engine_urls), body))
            return {**payload, "rid": self.new_rid()}

    cls = AbortEverywhere if everywhere else EngineClient
    client = cls(Endpoints(fleet.router.url, fleet.urls), concurrency=64, vocab_size=2048, request_timeout=timeout)
    client.retry_policy.base_delay = client.retry_policy.max_delay = 0.0  # no back-off sleeps in the figure
    return client


async def generate_all(client, n: int) -> int:
    """Samples that failed (their budget spent: the old policy's abort storm can starve requests)."""
    from slime.utils.http_retry import HttpError

    outs = await asyncio.gather(
        *(client.generate(PROMPT, {"max_new_tokens": 8}) for _ in range(n)), return_exceptions=True
    )
    unexpected = [o for o in outs if isinstance(o, BaseException) and not isinstance(o, HttpError)]
    if unexpected:
        raise unexpected[0]
    assert all(o.token_ids == TOKENS for o in outs if not isinstance(o, HttpError))
    await asyncio.gather(*client._background)  # the aborts are part of the cost
    return sum(isinstance(o, HttpError) for o in outs)


# condition -> (error kind, abort everywhere); the error rate is --error-rate for all but "0%"
CONDITIONS = {
    "0%": ("503", False),
    "1% 503s": ("503", False),
    "1% timeouts": ("timeout", False),
    "1% timeouts, abort everywhere": ("timeout", True),
}


def measure(fleet: Fleet, condition: str, rate: float, n: int, seed: int, timeout: float) -> dict[str, float]:
    """Client CPU ms per sample, retries, abort requests and rids left to the closed connection, of
    one round of `n` samples."""
    kind, everywhere = CONDITIONS[condition]
    fleet.set_error_rate(0.0 if condition == "0%" else rate, seed, kind)
    client = make_client(fleet, everywhere, timeout)

    async def go():
        try:
            return await generate_all(client, n)
        finally:
            await client.close()

    cpu = time.process_time()
    failed = asyncio.run(go())
    return {
        "cpu": (time.process_time() - cpu) * 1000 / n,
        "retries": client.stats.total_retries,
        "aborts": client.abort_stats.requests,
        "disconnects": client.disconnect_aborts,
        "failed": failed,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, nargs="*", default=[4, 256])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--error-rate", type=float, default=0.01)
    ap.add_argument("--timeout", type=float, default=10.0, help="the client's deadline per request, seconds")
    ap.add_argument(
        "--no-reference",
        action="store_true",
        help="skip the old abort-everywhere policy (at 256 engines its abort storms can exhaust the "
        "engine host's file descriptors)",
    )
    ap.add_argument("--host", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.host:
        return host(a)

    from slime.testing.tiny_model import build_tiny_model

    model_dir = build_tiny_model(Path(tempfile.gettempdir()) / "slime-bench-tiny")
    print(
        f"samples={a.samples} per round, rounds={a.rounds}, errors={a.error_rate:.0%} (engine 503s, or requests "
        f"left hanging past the client's {a.timeout} s deadline), client CPU ms per sample (median of rounds)"
    )
    ratios = {}
    for n_engines in a.engines:
        fleet = Fleet(n_engines, model_dir)
        try:
            measure(fleet, "0%", 0.0, 200, 0, a.timeout)  # warm-up: connections, code paths
            conditions = [c for c in CONDITIONS if not (a.no_reference and CONDITIONS[c][1])]
            runs: dict[str, list[dict[str, float]]] = {c: [] for c in conditions}
            for r in range(a.rounds):  # interleaved, so drift of the machine's load hits all alike
                for condition in conditions:
                    runs[condition].append(measure(fleet, condition, a.error_rate, a.samples, r, a.timeout))
        finally:
            fleet.stop()
        base = statistics.median(x["cpu"] for x in runs["0%"])
        print(f"{n_engines} engines:")
        for name, xs in runs.items():
            cpu = statistics.median(x["cpu"] for x in xs)
            ratios[n_engines, name] = cpu / base
            total = {k: int(sum(x[k] for x in xs)) for k in ("retries", "aborts", "disconnects", "failed")}
            rounds = ", ".join(f"{x['cpu']:.3f}" for x in xs)
            print(
                f"  {name:<30}: {cpu:6.3f} ms/sample  ratio {cpu / base:5.2f}x  (retries {total['retries']}, "
                f"abort requests {total['aborts']}, aborted by the closed connection {total['disconnects']}, "
                f"failed samples {total['failed']}; "
                f"rounds {rounds})"
            )
    worst = max((r for (n, c), r in ratios.items() if c in ("1% 503s", "1% timeouts")), default=float("nan"))
    print(
        f"target: the 1% ratios <= 1.2x with every fleet size: worst {worst:.2f}x "
        f"({'met' if worst <= 1.2 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
