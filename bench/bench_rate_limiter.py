"""Rate limiter benchmark: the seed design (bench/seed_token_bucket.py) vs slime's limiter (leases while
nobody queues, FIFO tickets with local hand-over when they do), side by side in one run, plus sandbox
executions/s. Target: slime >= 10x the seed's calls/s in every row.

    .venv/bin/python bench/bench_rate_limiter.py [--duration 2] [--no-sandbox]   (or python -m bench.bench_rate_limiter)

No-op guarded calls from 1, 16 and 256 concurrent callers spread over 2 processes (Ray actors),
with a cap above the callers (uncontended: the price of the machinery) and a small cap
(contended: every caller queues). "Added latency" is the mean time a caller spends in the
limiter per call (acquire + release, not the guarded no-op itself, which yields once to the event
loop while holding the permit; for the seed, the whole `execute.remote` round trip, since that
design runs the guarded function in its pool actor). Each process starts and warms up its design
before the timed window opens, so actor start-up under load is not measured.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402


def _noop():
    return None


@ray.remote(num_cpus=0)
class Caller:
    """One process of callers. `prepare` starts and warms up the design (actor start-up is not
    measured: under load it can take longer than the measuring window), `run` then measures."""

    async def prepare(self, design: str, name: str, cap: int, n_callers: int) -> None:
        sys.path.insert(0, str(ROOT))
        self.design = design
        if design == "seed":
            from bench.seed_token_bucket import init_seed_pool

            pool = init_seed_pool(max(1, n_callers), cap, name)

            async def one():
                t = time.perf_counter()
                await pool.execute.remote(_noop)
                return time.perf_counter() - t
        else:
            from slime.tools.rate_limiter import client_for

            self.lim = lim = client_for(name)

            async def one():
                # the guarded call is a no-op that yields once to the event loop, so the permit is
                # really held while the other callers run (with a small cap: real contention)
                t = time.perf_counter()
                await lim.acquire()
                t1 = time.perf_counter()
                await asyncio.sleep(0)
                t2 = time.perf_counter()
                lim.release()
                return (t1 - t) + (time.perf_counter() - t2)

        self.one = one
        await one()

    async def run(self, n_callers: int, start_at: float, duration: float) -> dict:
        lat: list[float] = []
        stop_at = start_at + duration
        one = self.one

        async def caller():
            n = 0
            while time.time() < stop_at:
                d = await one()
                if time.time() <= stop_at:
                    lat.append(d)
                    n += 1
                await asyncio.sleep(0)  # let the other callers of this process run (fairness)
            return n

        await asyncio.sleep(max(0.0, start_at - time.time()))
        counts = await asyncio.gather(*[caller() for _ in range(n_callers)])
        out = {
            "calls": sum(counts),
            "mean_lat": statistics.fmean(lat) if lat else None,
            "p50": statistics.median(lat) if lat else None,
            "p99": sorted(lat)[int(len(lat) * 0.99)] if lat else None,
        }
        if self.design != "seed":
            lim = self.lim
            out["client"] = {"in_flight": lim.inflight, "waiting": lim.n_waiting, "handed_over": lim.handed_over}
            self.lim.close()
        return out


def run_case(design: str, cap: int, conc: int, duration: float, case_id: str) -> dict:
    from slime.tools.rate_limiter import get_or_create_rate_limiter, kill_rate_limiter

    name = f"bench-{design}-{case_id}"
    handle = get_or_create_rate_limiter(name, cap) if design == "slime" else None  # the actor lives while held
    per = [conc] if conc == 1 else [conc // 2, conc - conc // 2]
    callers = [Caller.remote() for _ in per]
    ray.get([c.prepare.remote(design, name, cap, n) for c, n in zip(callers, per)], timeout=120)
    start_at = time.time() + 0.5
    refs = [c.run.remote(n, start_at, duration) for c, n in zip(callers, per)]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=duration + 60)
    res = ray.get(ready) if len(ready) == len(refs) else []
    calls = sum(r["calls"] for r in res)
    lat = [r["mean_lat"] for r in res if r["mean_lat"] is not None]
    p50 = [r["p50"] for r in res if r["p50"] is not None]
    p99 = [r["p99"] for r in res if r["p99"] is not None]
    nan = float("nan")
    out = {
        "design": design,
        "cap": cap,
        "callers": conc,
        "calls_per_s": calls / duration,
        "added_latency_ms": 1e3 * statistics.fmean(lat) if lat else nan,
        "p50_ms": 1e3 * statistics.fmean(p50) if p50 else nan,
        "p99_ms": 1e3 * max(p99) if p99 else nan,
        "stalled": calls == 0,
        "per_process_calls": [r["calls"] for r in res],
    }
    if design == "slime":
        out["client_stats"] = [r["client"] for r in res]
        kill_rate_limiter(name)
        del handle
    else:
        with contextlib.suppress(ValueError):
            ray.kill(ray.get_actor(name))
    for c in callers:
        ray.kill(c)
    return out


def bench_sandbox(concurrency: int = 8, total: int = 200) -> dict:
    import aiohttp

    from slime.sandbox.server import start_local_sandbox

    try:
        url, handle = start_local_sandbox(max_concurrency=concurrency)
        isolation = "isolated: netns+pidns+mountns, per-run uid, rlimits"
    except RuntimeError:
        url, handle = start_local_sandbox(max_concurrency=concurrency, allow_no_isolation=True)
        isolation = "WITHOUT isolation (unavailable here)"
    try:

        async def go():
            async with aiohttp.ClientSession() as s:
                sem = asyncio.Semaphore(concurrency)
                lat = []

                async def one():
                    async with sem:
                        t = time.perf_counter()
                        async with s.post(f"{url}/run_code", json={"code": "print(1)", "language": "python"}) as r:
                            body = await r.json()
                        assert body["status"] == "Success" and body["run_result"]["stdout"] == "1\n", body
                        lat.append(time.perf_counter() - t)

                await asyncio.gather(*[one() for _ in range(8)])  # warm-up
                lat.clear()
                t0 = time.perf_counter()
                await asyncio.gather(*[one() for _ in range(total)])
                dt = time.perf_counter() - t0
                return {
                    "concurrency": concurrency,
                    "executions": total,
                    "exec_per_s": total / dt,
                    "isolation": isolation,
                    "p50_ms": 1e3 * statistics.median(lat),
                }

        return asyncio.run(go())
    finally:
        handle.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=2.0)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 256])
    ap.add_argument("--caps", type=int, nargs="+", default=[1024, 8])
    ap.add_argument("--no-sandbox", action="store_true", help="skip the sandbox print(1) executions/s")
    ap.add_argument("--verbose", action="store_true", help="print every case as JSON")
    ap.add_argument("--json", type=str, default=None)
    args = ap.parse_args()
    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}},
    )
    rows = []
    for cap in args.caps:
        for conc in args.concurrency:
            for design in ("seed", "slime"):
                r = run_case(design, cap, conc, args.duration, f"{cap}-{conc}")
                rows.append(r)
                if args.verbose:
                    print(json.dumps(r), flush=True)
    ray.shutdown()
    print(
        f"No-op guarded calls, callers spread over 2 processes, {args.duration:g} s per case; cap {max(args.caps)} = "
        f"uncontended, cap {min(args.caps)} = contended once there are more callers (FIFO across processes)."
    )
    print("\n| cap | callers | seed calls/s | slime calls/s | speed-up | seed added ms/call | slime added ms/call |")
    print("|---|---|---|---|---|---|---|")
    for cap in args.caps:
        for conc in args.concurrency:
            s = next(r for r in rows if r["design"] == "seed" and r["cap"] == cap and r["callers"] == conc)
            o = next(r for r in rows if r["design"] == "slime" and r["cap"] == cap and r["callers"] == conc)
            speed = f"{o['calls_per_s'] / s['calls_per_s']:.0f}x" if s["calls_per_s"] else "seed stalled"
            print(
                f"| {cap} | {conc} | {s['calls_per_s']:.0f} | {o['calls_per_s']:.0f} | {speed} | "
                f"{s['added_latency_ms']:.3f} | {o['added_latency_ms']:.4f} |"
            )
    speedups = [o["calls_per_s"] / s["calls_per_s"] for s, o in zip(rows[::2], rows[1::2]) if s["calls_per_s"]]
    if speedups:
        print(f"\nlowest speed-up: {min(speedups):.0f}x (target >= 10x in every row)")
    sb = None
    if not args.no_sandbox:
        sb = bench_sandbox()
        print(
            f"\nsandbox (slime-sandbox, {sb['isolation']}): print(1) at concurrency {sb['concurrency']}: "
            f"{sb['exec_per_s']:.1f} executions/s, p50 {sb['p50_ms']:.1f} ms per execution"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "sandbox": sb}, indent=1))


if __name__ == "__main__":
    main()
