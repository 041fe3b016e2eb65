"""The agent gateway: its cost per request, per turn as a conversation grows, and under load.

All against zero-latency scripted engines behind the real sglang-router, the engines in a process of
their own as real engines are (`--engines-here`: threads of the bench's process), the gateway and its
clients in the bench's process:
  1. overhead: single-turn requests sent directly as `/generate` (EngineClient) and the same turns
     sent to the gateway's /v1/chat/completions, alternating request by request; per request, the
     CPU time of the thread doing the work (`time.thread_time` in the bench's thread around the
     direct call; in the gateway's server thread from the request's arrival to the last byte of the
     answer, engine call included) and the latency, medians side by side;
  1b. overhead at concurrency 8: the same single-turn requests, 8 in flight at a time, per path;
     CPU per request = the CPU the doing thread spent over the whole run / requests (the gateway's
     server thread includes its own engine calls, i.e. the direct path's work); every session opens
     with one prompt (as a GRPO group's do), then each with its own (a render per request);
  2. per-turn cost: sessions of 64 turns (user follow-ups, the client sends the whole history each
     turn, as agents do); cost of turn k = the gateway thread's CPU time for that request (robust to
     the machine's load, unlike wall time), median over sessions, for the gateway (append-only
     prompts) and the same gateway re-rendering every prompt (slime's FullRender) side by side;
  2b. the same with realistic tool results: each turn the model calls a tool and the client sends a
     4 kB tool result back (64 turns: ~270 kB of JSON and ~70k prompt tokens by the last turn);
  2c. memory: what the gateway holds for one session of those 64 turns before it is finished
     (tracemalloc: live allocations made in slime's modules, the scripted engines of slime/testing
     left out: they keep every request for the tests);
  3. load: 256 concurrent sessions of 4 turns each against 2 engines; every session's sample is
     checked token by token (each sampled span must be what the engines answer to the prompt
     before it, and carry the session's own tag).

    python -m bench.bench_agent_gateway [--requests 300] [--turns 64] [--sessions 256] [--concurrency 8]
                                        [--engines-here]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("SLIME_BENCH_TREE", str(ROOT)))  # a worker imports slime from the tree it measures
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import aiohttp  # noqa: E402

from slime.agent.gateway.server import Gateway  # noqa: E402
from slime.agent.gateway.rendering import FullRender  # noqa: E402
from slime.testing.agent_stack import AgentStack  # noqa: E402
from slime.testing.tiny_model import qwen_tokenizer_dir  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

REPORT_TURNS = (1, 2, 4, 8, 16, 32, 48, 64)


TOOL_CALL = '<tool_call>\n{"name": "read_file", "arguments": {"path": "src/module_%d.py"}}\n</tool_call>'
READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}

# A coding agent's first prompt: a system message and six tool schemas every task of the run shares
# (~1,000 tokens rendered), then the task's own few lines (~150 tokens).
AGENT_SYSTEM = (
    "You are an autonomous software engineer working in a repository checked out at /workspace. "
    "Read the code before changing it, run the tests after every change, keep changes minimal, and explain "
    "what you changed and why when you are done. Never modify the tests to make them pass. "
) * 6
AGENT_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{what} Returns the output as text; long outputs are cut to their first 16 kB.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "a path relative to /workspace"},
                    "content": {"type": "string", "description": "the text to write or the command to run"},
                    "timeout": {"type": "integer", "description": "seconds before the call is stopped"},
                },
                "required": ["path"],
            },
        },
    }
    for name, what in (
        ("read_file", "Read a file of the repository."),
        ("write_file", "Write a file of the repository, replacing its content."),
        ("run", "Run a shell command in the repository's sandbox."),
        ("search", "Search the repository's files for a regular expression."),
        ("list_dir", "List a directory of the repository."),
        ("run_tests", "Run the repository's test suite, or one test file."),
    )
]


def agent_task(tag: str, i: int) -> list[dict]:
    """A first prompt of its own (a task) after the run's shared system message."""
    task = (
        f"case=ovc {tag} task {i}: the CSV parser in src/parser_{i}.py drops the last field of a line that ends "
        "with a comma, and tests/test_parser.py::test_trailing_comma fails. Find the cause and fix it. "
    ) * 3
    return [{"role": "system", "content": AGENT_SYSTEM}, {"role": "user", "content": task}]


def replies(case: str, turn: int) -> str:
    if case.startswith("tool"):
        return TOOL_CALL % turn
    return f"Reply {turn} for {case}: noted, go on."


def tool_result(k: int, size: int = 4096) -> str:
    """A realistic 4 kB tool result: source lines, distinct per turn."""
    lines = (
        f"{k}.{i}: def function_{i}(value):  return value * {i} + {k}  # helper of module {k}\n"
        for i in range(size // 40)
    )
    return "".join(lines)[:size]


class ThreadCPU:
    """ASGI middleware: the server thread's CPU seconds per request, arrival to last byte (`cpu`)."""

    def __init__(self, app, cpu: list[float]) -> None:
        self.app, self.cpu = app, cpu

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.thread_time()

        async def timed(message):
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                self.cpu.append(time.thread_time() - t0)

        await self.app(scope, receive, timed)


def timed_gateway(stack: AgentStack, **kw) -> tuple[Gateway, list[float]]:
    cpu: list[float] = []
    gw = Gateway(stack.client, tokenizer=stack.tok, **kw)
    gw.asgi = ThreadCPU(gw.asgi, cpu)  # around the app the gateway serves (its turn routes too)
    return gw.start(), cpu


async def chat(
    http: aiohttp.ClientSession, gw: Gateway, sid: str, messages: list[dict], tools: list[dict] | None = None
) -> dict:
    """One turn of session `sid` (opened on its first turn: a request holds its session's key)."""
    if sid not in gw.sessions:
        gw.open_session(sid)
    body = {"model": "m", "messages": messages, "max_tokens": 64, **({"tools": tools} if tools else {})}
    async with http.post(f"{gw.base_url(sid)}/chat/completions", json=body) as r:
        body = await r.json()
        if r.status != 200:
            raise RuntimeError(f"gateway answered {r.status}: {body}")
        return body


async def overhead(stack: AgentStack, gw: Gateway, gw_cpu: list[float], n: int) -> None:
    client, tok = stack.client, stack.tok
    msgs = [{"role": "user", "content": "case=ovh hello"}]
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
    params = {"max_new_tokens": 64, "skip_special_tokens": False, "no_stop_trim": True}
    direct_cpu, direct_lat, gw_lat = [], [], []
    async with aiohttp.ClientSession() as http:
        for i in range(n // 10):  # warm-up of both paths
            await client.generate(ids, params)
            await chat(http, gw, f"ovh-w{i}", msgs)
        del gw_cpu[:]
        for i in range(n):
            t, c = time.perf_counter(), time.thread_time()
            await client.generate(ids, params)
            direct_cpu.append(time.thread_time() - c)
            direct_lat.append(time.perf_counter() - t)
            t = time.perf_counter()
            await chat(http, gw, f"ovh-{i}", msgs)
            gw_lat.append(time.perf_counter() - t)
    for sid in [f"ovh-w{i}" for i in range(n // 10)] + [f"ovh-{i}" for i in range(n)]:
        await gw.drop_session(sid)
    med = {
        k: statistics.median(v) * 1e3
        for k, v in (("dc", direct_cpu), ("dl", direct_lat), ("gc", gw_cpu), ("gl", gw_lat))
    }
    print(f"1. overhead: {n} single-turn requests per path, alternating request by request (medians)")
    print("| path | CPU ms/request (the thread doing the work) | latency ms |")
    print("|---|---:|---:|")
    print(f"| direct /generate (EngineClient, bench thread) | {med['dc']:.3f} | {med['dl']:.3f} |")
    print(f"| gateway /v1/chat/completions (server thread) | {med['gc']:.3f} | {med['gl']:.3f} |")
    print(
        f"gateway adds {med['gl'] - med['dl']:.3f} ms latency and {med['gc'] - med['dc']:.3f} ms CPU per request "
        "(HTTP server, parse, render, parse the answer, reply, record; "
        "its engine call costs what the direct one does)"
    )


async def session(
    http: aiohttp.ClientSession, gw: Gateway, cpu: list[float], sid: str, turns: int, tools: bool = False
) -> list[float]:
    """The gateway thread's CPU seconds for each turn of one session (`tools`: a tool call and a
    4 kB tool result per turn; else a short user follow-up)."""
    msgs = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": f"case={sid} let us start"},
    ]
    costs = []
    for k in range(turns):
        n = len(cpu)
        body = await chat(http, gw, sid, msgs, tools=[READ_FILE] if tools else None)
        deadline = time.monotonic() + 5
        while len(cpu) == n and time.monotonic() < deadline:  # the server thread notes it after the last byte
            await asyncio.sleep(0.001)
        costs.append(sum(cpu[n:]))
        message = body["choices"][0]["message"]
        if tools:
            msgs += [
                message,
                {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": tool_result(k)},
            ]
        else:
            msgs += [
                {"role": "assistant", "content": message["content"]},
                {"role": "user", "content": f"ok, step {k + 2} please"},
            ]
    await gw.drop_session(sid)
    return costs


async def concurrent_overhead(
    stack: AgentStack, gw: Gateway, n: int, concurrency: int, tag: str = ""
) -> dict[str, float]:
    """CPU per request with `concurrency` requests in flight: each path's doing thread, whole run / n
    (ms), and requests/s: `direct`, `shared` (sessions opening with one prompt), `own` (each its own)."""
    client, tok = stack.client, stack.tok
    msgs = [{"role": "user", "content": "case=ovc hello"}]
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
    params = {"max_new_tokens": 64, "skip_special_tokens": False, "no_stop_trim": True}
    server_clock = time.pthread_getcpuclockid(gw._thread.ident)  # the gateway's server thread's CPU clock

    async def pool(work) -> float:
        queue = iter(range(n))

        async def worker():
            for i in queue:
                await work(i)

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - t

    async with aiohttp.ClientSession() as http:
        await pool(lambda i: client.generate(ids, params))  # warm-up
        c = time.thread_time()
        direct_wall = await pool(lambda i: client.generate(ids, params))
        direct_cpu = time.thread_time() - c
        await pool(lambda i: chat(http, gw, f"ovc{tag}-w{i}", msgs))
        c0 = time.clock_gettime(server_clock)
        gw_wall = await pool(lambda i: chat(http, gw, f"ovc{tag}-{i}", msgs))
        gw_cpu = time.clock_gettime(server_clock) - c0
        c0 = time.clock_gettime(server_clock)  # each session its own first prompt: rendered, not reused
        own_wall = await pool(
            lambda i: chat(http, gw, f"ovc{tag}-own-{i}", [{"role": "user", "content": f"case=ovc {tag} {i}"}])
        )
        own_cpu = time.clock_gettime(server_clock) - c0
        c0 = time.clock_gettime(server_clock)  # an agent's task each: the run's system message and tools, its own task
        task_wall = await pool(lambda i: chat(http, gw, f"ovc{tag}-task-{i}", agent_task(tag, i), tools=AGENT_TOOLS))
        task_cpu = time.clock_gettime(server_clock) - c0
    for sid in [f"ovc{tag}{kind}{i}" for kind in ("-w", "-", "-own-", "-task-") for i in range(n)]:
        await gw.drop_session(sid)
    return {
        "direct": direct_cpu / n * 1e3,
        "shared": gw_cpu / n * 1e3,
        "own": own_cpu / n * 1e3,
        "task": task_cpu / n * 1e3,
        "direct_rate": n / direct_wall,
        "shared_rate": n / gw_wall,
        "own_rate": n / own_wall,
        "task_rate": n / task_wall,
    }


def print_concurrent(r: dict[str, float], n: int, concurrency: int) -> None:
    print(
        f"1b. overhead at concurrency {concurrency}: {n} single-turn requests per path; CPU = the doing thread's "
        "CPU over the run / requests"
    )
    print("| path | CPU ms/request | requests/s |")
    print("|---|---:|---:|")
    print(f"| direct /generate (EngineClient, bench thread) | {r['direct']:.3f} | {r['direct_rate']:.0f} |")
    print(
        f"| gateway /v1/chat/completions (server thread, its engine call included) | {r['shared']:.3f} | "
        f"{r['shared_rate']:.0f} |"
    )
    print(f"| gateway, each session its own first prompt (rendered each time) | {r['own']:.3f} | {r['own_rate']:.0f} |")
    print(
        f"| gateway, an agent's task each (shared ~1,000-token system message and tools, its own task) "
        f"| {r['task']:.3f} | {r['task_rate']:.0f} |"
    )
    print(
        f"gateway CPU per request beyond the direct call: {r['shared'] - r['direct']:.3f} ms (target <= 1 ms; "
        f"sessions opening with one prompt, as a GRPO group's do: rendered once), "
        f"{r['own'] - r['direct']:.3f} ms with a prompt of its own each; "
        f"gateway rate / direct rate: {r['shared_rate'] / r['direct_rate']:.2f} "
        f"({r['own_rate'] / r['direct_rate']:.2f})"
    )


class TreeWorker:
    """Section 1b of one source tree, in a process of its own (its own stack and gateway) that imports
    slime from that tree: one measured round per `run` line on stdin, its figures as JSON."""

    def __init__(self, tree: Path, a: argparse.Namespace) -> None:
        env = {**os.environ, "SLIME_BENCH_TREE": str(tree), "PYTHONPATH": str(tree)}
        self.tree = tree
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--worker",
                "--requests",
                str(a.requests),
                "--concurrency",
                str(a.concurrency),
                *(["--engines-here"] if a.engines_here else []),
            ],
            cwd=tree,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"bench worker for {tree} did not start (exit code {self.proc.poll()})")

    def run(self) -> dict[str, float]:
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"bench worker for {self.tree} ended (exit code {self.proc.poll()})")
        return json.loads(line)

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def worker(a: argparse.Namespace) -> None:
    """`TreeWorker`'s side: a stack and a gateway of this process's tree, a warm-up round, then rounds."""
    with started_stack(a.engines_here) as stack:
        gw = Gateway(stack.client, tokenizer=stack.tok).start()
        try:
            asyncio.run(concurrent_overhead(stack, gw, a.requests, a.concurrency, tag="warm"))
            print("ready", flush=True)
            for k, line in enumerate(sys.stdin):
                if line.strip() != "run":
                    break
                r = asyncio.run(concurrent_overhead(stack, gw, a.requests, a.concurrency, tag=f"r{k}"))
                print(json.dumps(r), flush=True)
        finally:
            gw.stop()


def trees_side_by_side(a: argparse.Namespace) -> None:
    """Section 1b for this tree and each `--before-tree`, rounds interleaved, medians per tree."""
    workers = {"this tree": TreeWorker(ROOT, a)}
    try:
        for tree in a.before_tree:
            workers[f"before ({tree})"] = TreeWorker(tree.resolve(), a)
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in workers}
        for _ in range(a.rounds):
            for name, w in workers.items():
                rounds[name].append(w.run())
    finally:
        for w in workers.values():
            w.stop()
    print(
        f"1b. side by side: {a.requests} single-turn requests per path at concurrency {a.concurrency}, "
        f"{a.rounds} rounds interleaved between trees (each tree in a process of its own), medians; "
        "CPU ms per request of the doing thread"
    )
    print(
        "| tree | direct /generate | gateway, shared first prompt | beyond direct | gateway, own prompt each "
        "| beyond direct | rounds (own prompt, beyond direct) | an agent's task each (system message and tools "
        "shared) |"
    )
    print("|---|---:|---:|---:|---:|---:|---|---:|")
    for name, rs in rounds.items():
        med = {k: statistics.median(r.get(k, float("nan")) for r in rs) for k in ("direct", "shared", "own", "task")}
        beyond = [r["own"] - r["direct"] for r in rs]
        print(
            f"| {name} | {med['direct']:.3f} | {med['shared']:.3f} | "
            f"{statistics.median(r['shared'] - r['direct'] for r in rs):.3f} | {med['own']:.3f} | "
            f"{statistics.median(beyond):.3f} | {', '.join(f'{b:.3f}' for b in beyond)} | {med['task']:.3f} |"
        )


async def per_turn(
    delta: tuple[Gateway, list[float]], full: tuple[Gateway, list[float]], turns: int, sessions: int
) -> None:
    delta_costs, full_costs, tool_costs = [], [], []
    async with aiohttp.ClientSession() as http:
        for s in range(sessions):  # interleaved, so both see the same machine load
            delta_costs.append(await session(http, *delta, f"pt-d{s}", turns))
            full_costs.append(await session(http, *full, f"pt-f{s}", turns))
            tool_costs.append(await session(http, *delta, f"tool-pt{s}", turns, tools=True))
    print(
        f"2. per-turn cost: {sessions} sessions of {turns} turns each per approach, interleaved; the client sends "
        "the whole history each turn; cost = the gateway thread's CPU ms for the turn (median over sessions); "
        "last column: each turn a tool call and a 4 kB tool result (delta gateway)"
    )
    print("| turn | delta (gateway) ms | re-render (FullRender) ms | 4 kB tool results, delta ms |")
    print("|---:|---:|---:|---:|")
    med = {}
    for k in [t for t in REPORT_TURNS if t <= turns]:
        d = statistics.median(c[k - 1] for c in delta_costs) * 1e3
        f = statistics.median(c[k - 1] for c in full_costs) * 1e3
        t = statistics.median(c[k - 1] for c in tool_costs) * 1e3
        med[k] = (d, f, t)
        print(f"| {k} | {d:.3f} | {f:.3f} | {t:.3f} |")
    (d1, f1, t1), (dn, fn, tn) = med[1], med[max(med)]
    print(
        f"ratio turn {max(med)} / turn 1: delta {dn / d1:.2f}x, re-render {fn / f1:.2f}x, "
        f"4 kB tool results {tn / t1:.2f}x (turn 1 renders two short messages, later turns a 4 kB tool result)"
    )
    if turns >= 16:
        first, last = range(8), range(turns - 8, turns)

        def mean_ms(costs: list[list[float]], ks: range) -> float:
            return statistics.mean(statistics.median(c[k] for c in costs) for k in ks) * 1e3

        spans = {
            name: (mean_ms(c, first), mean_ms(c, last))
            for name, c in (("delta", delta_costs), ("re-render", full_costs), ("4 kB tool results", tool_costs))
        }
        print(
            f"mean CPU ms per turn, turns 1-8 -> {turns - 7}-{turns}: "
            + "; ".join(f"{name} {a:.3f} -> {b:.3f} ({b / a:.2f}x)" for name, (a, b) in spans.items())
            + " (limit 1.5x)"
        )


async def held_memory(gw: Gateway, cpu: list[float], turns: int) -> None:
    """Bytes the gateway holds for one session of `turns` tool-result turns, before it is finished."""
    async with aiohttp.ClientSession() as http:
        await session(http, gw, cpu, "tool-mem-warm", 2, tools=True)  # the process's one-off caches
        tracemalloc.start()  # one frame: deeper stacks slow the in-process engines past the router's health checks
        try:
            sid, msgs = "tool-mem", [{"role": "user", "content": "case=tool-mem let us start"}]
            for k in range(turns):
                message = (await chat(http, gw, sid, msgs, tools=[READ_FILE]))["choices"][0]["message"]
                msgs += [
                    message,
                    {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": tool_result(k)},
                ]
            ours = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(True, "*/slime/*"), tracemalloc.Filter(False, "*/slime/testing/*")]
            )
        finally:
            tracemalloc.stop()
        await gw.drop_session(sid)
    held = sum(s.size for s in ours.statistics("filename"))
    print(
        f"2c. memory: one session of {turns} turns with 4 kB tool results, before it is finished: the gateway "
        f"holds {held / 1e6:.1f} MB (live allocations made in slime's modules; the messages json parses, not counted)"
    )


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
        assert sample.rollout_log_probs[a - start : b - start] == want["log_probs"], f"{sid}: log-probs differ"


async def load(stack: AgentStack, sessions: int, turns: int) -> None:
    gw = stack.gateway

    async def run(http: aiohttp.ClientSession, sid: str) -> None:
        msgs = [{"role": "user", "content": f"case={sid} begin"}]
        for k in range(turns):
            body = await chat(http, gw, sid, msgs)
            msgs += [
                {"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"next {k}"},
            ]

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
    print(
        f"3. load: {sessions} concurrent sessions x {turns} turns against {stack.n_engines} engines: "
        f"{sessions * turns} turns in {wall:.1f} s ({sessions * turns / wall:.0f} turns/s); "
        f"sessions with a lost or mixed-up turn: {bad}"
    )
    if bad:
        raise SystemExit(1)


async def main_async(a: argparse.Namespace, stack: AgentStack, delta: tuple, full: tuple) -> None:
    if "1" in a.sections:
        await overhead(stack, *delta, a.requests)
    if "1b" in a.sections and not a.before_tree:
        print_concurrent(
            await concurrent_overhead(stack, delta[0], a.requests, a.concurrency), a.requests, a.concurrency
        )
    if "2" in a.sections:
        await per_turn(delta, full, a.turns, a.per_turn_sessions)
        await held_memory(*delta, a.turns)
    if "3" in a.sections:
        await load(stack, a.sessions, a.load_turns)


def stack_of(engine_urls: list[str] | None = None) -> AgentStack:
    """Two zero-latency scripted engines (Qwen3 chat template): those at `engine_urls`, else new ones."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    return AgentStack(
        tok,
        qwen_tokenizer_dir(),
        replies,
        engines=2,
        log_dir=tempfile.mkdtemp(prefix="bench-agent-"),
        engine_urls=engine_urls,
    )


class EngineProcess:
    """The scripted engines in a process of their own, as every real engine is (SGLang's servers, the
    embedded engine's actors). Run as threads of the bench's process, each engine's request handling
    (a decode and an encode of the ids per request) took the gateway thread's GIL and caches and was
    counted in its CPU: 0.1-0.2 ms a request at concurrency 8. `--engines-here` measures that way."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve-engines"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the bench's engine process did not start (exit code {self.proc.poll()})")
        self.urls = json.loads(line)

    def stop(self) -> None:
        self.proc.stdin.close()  # its cue to end
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve_engines() -> None:
    """`--serve-engines`: the engines of `stack_of()`, their URLs as one JSON line, until stdin closes."""
    stack = stack_of()
    print(json.dumps(stack.start_engines()), flush=True)
    try:
        sys.stdin.read()
    finally:
        for e in stack.engines:
            e.stop()


@contextlib.contextmanager
def started_stack(engines_here: bool) -> Iterator[AgentStack]:
    """A started stack: its engines in a process of their own (`EngineProcess`), or in this one."""
    engines = None if engines_here else EngineProcess()
    try:
        stack = stack_of(engines.urls if engines else None).start()
        try:
            yield stack
        finally:
            stack.stop()
    finally:
        if engines is not None:
            engines.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--turns", type=int, default=64)
    ap.add_argument("--per-turn-sessions", type=int, default=7)
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--load-turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument(
        "--sections",
        default="1,1b,2,3",
        type=lambda v: set(v.split(",")),
        help="which sections to run, comma-separated (1, 1b, 2, 3)",
    )
    ap.add_argument(
        "--before-tree",
        type=Path,
        action="append",
        default=[],
        help="another source tree whose section 1b runs side by side with this tree's, rounds "
        "interleaved (e.g. `git worktree add /tmp/before main`); repeatable",
    )
    ap.add_argument("--rounds", type=int, default=5, help="rounds of section 1b per tree with --before-tree")
    ap.add_argument(
        "--engines-here",
        action="store_true",
        help="run the scripted engines as threads of the bench's process (as before: they then take the "
        "gateway thread's GIL and caches); by default they run in a process of their own",
    )
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serve-engines", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve_engines:
        return serve_engines()
    if a.worker:
        return worker(a)
    if a.before_tree and "1b" in a.sections:
        trees_side_by_side(a)
        a.sections = a.sections - {"1b"}  # done side by side; the stack below runs the other sections
    if not a.sections:
        return
    with started_stack(a.engines_here) as stack:
        delta, full = timed_gateway(stack), timed_gateway(stack, renderer=FullRender(stack.tok))
        where = "in this process" if a.engines_here else "in a process of their own"
        print(
            f"zero-latency scripted engines ({where}) behind sglang-router; Qwen3 chat template; gateways on 127.0.0.1"
        )
        try:
            asyncio.run(main_async(a, stack, delta, full))
        finally:
            for g, _ in (delta, full):
                g.stop()


if __name__ == "__main__":
    main()
