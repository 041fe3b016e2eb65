"""Orchestration overhead of the rollout path, measured side by side in one run.

A zero-latency engine stub (same HTTP protocol) sits behind the real sglang-router. We compare
samples/s of (a) a raw aiohttp client posting the same requests to the router with the same
concurrency, and (b) slime's full rollout path: data source -> default rollout function
(the engine client: concurrency bound, deadlines, retries; statuses, rewards) -> training batch.
Rounds alternate (raw, slime, raw, slime, ...) and the median of each is reported.

    python -m bench.bench_rollout_overhead [--samples 2000] [--concurrency 64] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from slime.fleet.router import Router  # noqa: E402
from slime.utils.child_process import wait_until  # noqa: E402
from slime.utils.misc import find_free_port  # noqa: E402
from slime.testing.tiny_model import build_tiny_model  # noqa: E402

PROMPT = list(range(1000, 1032))


async def raw_client(url: str, n: int, concurrency: int) -> float:
    sem = asyncio.Semaphore(concurrency)
    payload = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 1.0},
               "return_logprob": True}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one():
            async with sem:
                async with s.post(url, json=payload) as r:
                    body = await r.json()
                    assert body["meta_info"]["output_token_logprobs"]

        t = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return n / (time.perf_counter() - t)


def slime_path(args, n: int, source, runtime) -> float:
    from slime.rollout.sglang_rollout import generate_rollout
    from slime.rollout.train_data import convert_samples_to_train_data

    t = time.perf_counter()
    out = generate_rollout(args, 0, source, runtime=runtime)
    samples = [s for g in out.samples for s in g]
    batch = convert_samples_to_train_data(args, samples)
    rate = n / (time.perf_counter() - t)
    assert len(batch["tokens"]) == n and all(len(x) == 8 for x in batch["loss_masks"])
    return rate


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()

    from slime.cli.args import parse_args
    from slime.rollout.data_source import DataSource
    from slime.testing.runtime import bind_runtime
    from slime.utils.async_utils import run
    from slime.utils.types import Sample

    model_dir = build_tiny_model(Path(tempfile.gettempdir()) / "slime-bench-tiny")
    port = find_free_port()
    stub = subprocess.Popen([sys.executable, "-m", "slime.testing.scripted_engine", "--port", str(port),
                             "--model-path", str(model_dir), "--tokens", "8"], cwd=ROOT)
    router = Router().start()
    try:
        wait_until(lambda: requests.get(f"http://127.0.0.1:{port}/health", timeout=1).ok, 30, "stub engine")
        router.add_worker(f"http://127.0.0.1:{port}")
        n_per_prompt = 8
        args = parse_args(["--rollout-backend", "hf", "--hf-checkpoint", str(model_dir), "--sglang-router-ip",
                           router.host, "--sglang-router-port", str(router.port), "--rm-type", "exact",
                           "--rollout-batch-size", str(a.samples // n_per_prompt), "--n-samples-per-prompt",
                           str(n_per_prompt), "--rollout-max-response-len", "8", "--sglang-server-concurrency",
                           str(a.concurrency)])
        prompts = [Sample(prompt="p", tokens=list(PROMPT), label="x") for _ in range(a.samples // n_per_prompt)]
        n = (a.samples // n_per_prompt) * n_per_prompt
        url = f"{router.url}/generate"
        runtime = bind_runtime(args)  # what the controller creates: one engine client for every round
        asyncio.run(raw_client(url, 200, a.concurrency))  # warm-up both paths
        slime_path(args, n, DataSource(args, prompts, n_per_prompt), runtime)
        raw, ours = [], []
        for _ in range(a.rounds):
            raw.append(asyncio.run(raw_client(url, n, a.concurrency)))
            ours.append(slime_path(args, n, DataSource(args, prompts, n_per_prompt), runtime))
        r, o = statistics.median(raw), statistics.median(ours)
        overhead_ms = (1 / o - 1 / r) * 1000  # negative: slime was faster in this run (noise)
        print(f"samples={n} concurrency={a.concurrency} rounds={a.rounds}")
        print(f"raw aiohttp -> router -> stub : {r:8.0f} samples/s  (rounds: {', '.join(f'{x:.0f}' for x in raw)})")
        print(f"slime rollout path           : {o:8.0f} samples/s  (rounds: {', '.join(f'{x:.0f}' for x in ours)})")
        print(f"ratio slime/raw              : {o / r:8.2f}x   (target >= 0.5x)")
        print(f"orchestration per sample     : {overhead_ms:8.3f} ms  (target < 1 ms; 1/slime - 1/raw, "
              f"negative = within run-to-run noise)")
        run(runtime.client.close())
    finally:
        router.stop()
        stub.terminate()
        stub.wait()


if __name__ == "__main__":
    main()
