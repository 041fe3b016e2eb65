"""The agent gateway: its cost per request, per turn as a conversation grows, and under load.

All against zero-latency scripted engines behind the real sglang-router, in one process:
  1. overhead: N single-turn requests sent directly as `/generate` (EngineClient) and the same
     turns sent to the gateway's /v1/chat/completions, interleaved in rounds; CPU ms per request of
     the thread doing the work (the bench's thread for direct calls, the gateway's server thread
     for gateway calls) and latency, side by side;
  2. per-turn cost: sessions of 64 turns (user follow-ups, the client sends the whole history each
     turn, as agents do); cost of turn k = the turn's latency minus its engine round trip, median
     over sessions, for the gateway (append-only prompts) and the same gateway re-rendering every
     prompt (slime's FullRender) side by side;
  3. load: 256 concurrent sessions of 4 turns each against 2 engines; every session's sample is
     checked token by token (each sampled span must be what the engines answer to the prompt
     before it, and carry the session's own tag).

    python -m bench.bench_agent_gateway [--requests 300] [--turns 64] [--sessions 256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import aiohttp  # noqa: E402

from slime.agent.gateway import Gateway, GatewayConfig  # noqa: E402
from slime.agent.rendering import FullRender  # noqa: E402
from slime.testing.agent_stack import AgentStack  # noqa: E402
from slime.testing.tiny_model import qwen_tokenizer_dir  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

REPORT_TURNS = (1, 2, 4, 8, 16, 32, 48, 64)


def replies(case: str, turn: int) -> str:
    return f"Reply {turn} for {case}: noted, go on."


def thread_cpu(native_id: int) -> float:
    """CPU seconds of one thread of this process (Linux)."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Timed:
    """Wraps a gateway's engine calls to time their round trips (the part that is not the gateway)."""

    def __init__(self, gateway: Gateway) -> None:
        self.engine_s: list[float] = []
        inner = gateway.engine.generate

        async def generate(*a, **kw):
            t = time.perf_counter()
            try:
                return await inner(*a, **kw)
            finally:
                self.engine_s.append(time.perf_counter() - t)

        gateway.engine.generate = generate


async def chat(http: aiohttp.ClientSession, url: str, sid: str, messages: list[dict]) -> dict:
    async with http.post(f"{url}/s/{sid}/v1/chat/completions",
                         json={"model": "m", "messages": messages, "max_tokens": 64}) as r:
        body = await r.json()
        if r.status != 200:
            raise RuntimeError(f"gateway answered {r.status}: {body}")
        return body


async def overhead(stack: AgentStack, n: int, rounds: int) -> None:
    gw, client, tok = stack.gateway, stack.client, stack.tok
    gw_thread = gw._thread.native_id
    me = threading.get_native_id()
    msgs = [{"role": "user", "content": "case=ovh hello"}]
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
    params = {"max_new_tokens": 64, "skip_special_tokens": False, "no_stop_trim": True}
    direct_cpu, gw_cpu, direct_lat, gw_lat = [], [], [], []
    async with aiohttp.ClientSession() as http:
        for r in range(rounds + 1):  # CPU: a block of each path per round (round 0 warms both up)
            c0 = thread_cpu(me)
            for _ in range(n):
                await client.generate(ids, params)
            direct = (thread_cpu(me) - c0) / n
            c0 = thread_cpu(gw_thread)
            for i in range(n):
                await chat(http, gw.url, f"ovh-{r}-{i}", msgs)
            if r:
                direct_cpu.append(direct)
                gw_cpu.append((thread_cpu(gw_thread) - c0) / n)
        for i in range(n * rounds):  # latency: the two paths alternate request by request
            t = time.perf_counter()
            await client.generate(ids, params)
            direct_lat.append(time.perf_counter() - t)
            t = time.perf_counter()
            await chat(http, gw.url, f"ovh-lat-{i}", msgs)
            gw_lat.append(time.perf_counter() - t)
    for sid in [f"ovh-{r}-{i}" for r in range(rounds + 1) for i in range(n)] + \
            [f"ovh-lat-{i}" for i in range(n * rounds)]:
        await gw.drop_session(sid)
    d_cpu, d_lat = statistics.median(direct_cpu) * 1e3, statistics.median(direct_lat) * 1e3
    g_cpu, g_lat = statistics.median(gw_cpu) * 1e3, statistics.median(gw_lat) * 1e3
    print(f"1. overhead: single-turn requests; CPU: {n} per path x {rounds} rounds (median of rounds); "
          f"latency: {n * rounds} per path, the paths alternating (median)")
    print("| path | CPU ms/request | latency ms (median) |")
    print("|---|---:|---:|")
    print(f"| direct /generate (EngineClient) | {d_cpu:.3f} | {d_lat:.3f} |")
    print(f"| gateway /v1/chat/completions (server thread) | {g_cpu:.3f} | {g_lat:.3f} |")
    print(f"gateway adds {g_lat - d_lat:.3f} ms latency and {g_cpu:.3f} ms CPU per request "
          f"(its own thread: parse, render, engine call, parse the answer, reply, record)")


async def session(http: aiohttp.ClientSession, gw: Gateway, timer: Timed, sid: str, turns: int) -> list[float]:
    """Per-turn gateway cost of one session (latency minus engine round trip), seconds."""
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": f"case={sid} let us start"}]
    costs = []
    for k in range(turns):
        n = len(timer.engine_s)
        t = time.perf_counter()
        body = await chat(http, gw.url, sid, msgs)
        costs.append(time.perf_counter() - t - sum(timer.engine_s[n:]))
        msgs += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                 {"role": "user", "content": f"ok, step {k + 2} please"}]
    await gw.drop_session(sid)
    return costs


async def per_turn(stack: AgentStack, full: Gateway, turns: int, sessions: int) -> None:
    delta_timer, full_timer = Timed(stack.gateway), Timed(full)
    delta_costs, full_costs = [], []
    async with aiohttp.ClientSession() as http:
        for s in range(sessions):  # interleaved, so both see the same machine load
            delta_costs.append(await session(http, stack.gateway, delta_timer, f"pt-d{s}", turns))
            full_costs.append(await session(http, full, full_timer, f"pt-f{s}", turns))
    print(f"2. per-turn cost: {sessions} sessions of {turns} turns each per approach, interleaved; the client sends "
          "the whole history each turn; cost = turn latency minus the engine round trip (median over sessions)")
    print("| turn | delta (gateway) ms | re-render (FullRender) ms |")
    print("|---:|---:|---:|")
    med = {}
    for k in [t for t in REPORT_TURNS if t <= turns]:
        d = statistics.median(c[k - 1] for c in delta_costs) * 1e3
        f = statistics.median(c[k - 1] for c in full_costs) * 1e3
        med[k] = (d, f)
        print(f"| {k} | {d:.3f} | {f:.3f} |")
    (d1, f1), (d2, f2), (dn, fn) = med[1], med[2], med[max(med)]
    print(f"ratio turn {max(med)} / turn 1: delta {dn / d1:.2f}x (limit 1.5x), re-render {fn / f1:.2f}x; "
          f"turn {max(med)} / turn 2 (the first appended turn): delta {dn / d2:.2f}x, re-render {fn / f2:.2f}x")


def check_session(stack: AgentStack, sid: str, sample: Sample, turns: int) -> None:
    """Each sampled span is exactly the engines' answer to the prompt before it; the session's tag is its own."""
    start = len(sample.tokens) - sample.response_length
    mask = [0] * start + sample.loss_mask
    spans, i = [], start
    while i < len(mask):
        if mask[i]:
            j = i
            while j < len(mask) and mask[j]:
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    assert len(spans) == turns, f"{sid}: {len(spans)} sampled spans for {turns} turns"
    text = stack.tok.decode(sample.tokens[:start])
    assert f"case={sid} " in text, f"{sid}: the sample's prompt belongs to another session"
    for a, b in spans:
        want = stack.answer({"input_ids": sample.tokens[:a], "sampling_params": {"max_new_tokens": 64}})
        assert sample.tokens[a:b] == want["output_ids"], f"{sid}: span {a}:{b} is not what the engine sampled"
        assert sample.rollout_log_probs[a - start:b - start] == want["log_probs"], f"{sid}: log-probs differ"


async def load(stack: AgentStack, sessions: int, turns: int) -> None:
    gw = stack.gateway

    async def run(http: aiohttp.ClientSession, sid: str) -> None:
        msgs = [{"role": "user", "content": f"case={sid} begin"}]
        for k in range(turns):
            body = await chat(http, gw.url, sid, msgs)
            msgs += [{"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"next {k}"}]

    sids = [f"load{i}" for i in range(sessions)]
    t = time.perf_counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(run(http, sid) for sid in sids))
    wall = time.perf_counter() - t
    bad = 0
    for sid in sids:
        samples = await gw.finish_session(sid, base_sample=Sample(index=0, prompt=""), reward=1.0)
        try:
            assert len(samples) == 1, f"{sid}: {len(samples)} samples"
            check_session(stack, sid, samples[0], turns)
        except AssertionError as e:
            bad += 1
            print(f"   {e}")
    print(f"3. load: {sessions} concurrent sessions x {turns} turns against {stack.n_engines} engines: "
          f"{sessions * turns} turns in {wall:.1f} s ({sessions * turns / wall:.0f} turns/s); "
          f"sessions with a lost or mixed-up turn: {bad}")
    if bad:
        raise SystemExit(1)


async def main_async(a: argparse.Namespace, stack: AgentStack, full: Gateway) -> None:
    await overhead(stack, a.requests, a.rounds)
    await per_turn(stack, full, a.turns, a.per_turn_sessions)
    await load(stack, a.sessions, a.load_turns)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--turns", type=int, default=64)
    ap.add_argument("--per-turn-sessions", type=int, default=7)
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--load-turns", type=int, default=4)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    stack = AgentStack(tok, qwen_tokenizer_dir(), replies, engines=2,
                       log_dir=tempfile.mkdtemp(prefix="bench-agent-")).start()
    full = Gateway(stack.client, tokenizer=tok, renderer=FullRender(tok), config=GatewayConfig()).start()
    print("zero-latency scripted engines behind sglang-router; Qwen3 chat template; gateway on 127.0.0.1")
    try:
        asyncio.run(main_async(a, stack, full))
    finally:
        full.stop()
        stack.stop()


if __name__ == "__main__":
    main()
