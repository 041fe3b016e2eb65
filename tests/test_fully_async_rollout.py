"""The fully-async rollout worker (issue 15): a pool of groups generating across rollout boundaries,
bounded staleness, weight updates that pause and resume it, the dynamic filter on whole groups,
an engine killed under it, and shutdown with groups in flight.

Scripted engines behind the real sglang-router. Every prompt is counted in and out: a group handed
out by the data source is either trained (once), dropped by the filter, or handed back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from slime.cli.args import parse_args
from slime.rollout.controller import RolloutController
from slime.rollout.data_source import DataSource
from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.rollout.fully_async_rollout import generate_rollout_fully_async, worker_hub
from slime.testing.runtime import bind_runtime
from slime.testing.until import until
from slime.utils.async_utils import run
from slime.utils.endpoints import Endpoints
from slime.utils.misc import find_free_port
from slime.utils.types import Sample

ROOT = Path(__file__).resolve().parents[1]
DEADLINE = 60.0
ANSWER = [7, 8, 9]
PARTIAL = [5, 6]


class Script:
    """Abort-aware answers: ANSWER at once; requests for prompts after the first `answer_prompts`
    distinct ones (or all, while `hold`) wait until aborted and then answer PARTIAL with finish reason
    `abort`, as SGLang does. Counting prompts, not requests, answers whole groups whatever the order
    in which the samples of concurrent groups arrive."""

    def __init__(self, answer_prompts: int | None = None):
        self.answer_prompts = answer_prompts
        self.hold = False
        self.prompts: list[tuple[int, ...]] = []
        self.holding = 0

    async def __call__(self, body, aborted):
        prompt = tuple(body["input_ids"])
        if prompt not in self.prompts:
            self.prompts.append(prompt)
        late = self.answer_prompts is not None and self.prompts.index(prompt) >= self.answer_prompts
        if self.hold or late:
            self.holding += 1
            try:
                await aborted.wait()
            finally:
                self.holding -= 1
            return {"output_ids": PARTIAL, "finish_type": "abort", "text": "5 6"}
        return {"output_ids": ANSWER, "finish_type": "stop", "text": "7 8 9"}


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return tiny_tokenizer  # the session's (tests/conftest.py): loaded once


def make_args(tmp_path, router, tiny_model_dir, *extra, n_prompts=40):
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(json.dumps({"input": f"question number {i}", "label": "7 8 9"}) + "\n" for i in range(n_prompts))
    )
    return parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(data),
            "--label-key",
            "label",
            "--sglang-router-ip",
            router.host,
            "--sglang-router-port",
            str(router.port),
            "--rm-type",
            "exact",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "5",
            "--sglang-server-concurrency",
            "4",
            "--rollout-num-engines",
            "1",
            "--rollout-function-path",
            "slime.rollout.fully_async_rollout.generate_rollout_fully_async",
            *extra,
        ]
    )


class CountingSource:
    """The data source, counting every group handed out and handed back (by group index)."""

    def __init__(self, inner):
        self.inner = inner
        self.out: Counter = Counter()
        self.back: Counter = Counter()
        self.lock = threading.Lock()

    def get_samples(self, n):
        groups = self.inner.get_samples(n)
        with self.lock:
            for g in groups:
                self.out[g[0].group_index] += 1
        return groups

    def add_samples(self, groups):
        with self.lock:
            for g in groups:
                assert len({s.group_index for s in g}) == 1
                assert all(s.response_length == 0 and s.status == Sample.Status.PENDING for s in g), (
                    "a group handed back must be fresh"
                )
                self.back[g[0].group_index] += 1
        self.inner.add_samples(groups)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def set_version(runtime, engines, version: str) -> None:
    """A weight update as a trainer does it: pause the worker, swap (the engines' version), resume."""
    hub = worker_hub(runtime)
    run(hub.pause())
    for e in engines:
        requests.post(
            f"{e.url}/update_weights_from_disk", json={"model_path": "x", "weight_version": version}, timeout=10
        ).raise_for_status()
    run(hub.resume(version))


def stop(runtime) -> dict:
    """Stop the runtime's workers, then close its HTTP session, as `RolloutController.close` does
    (an unclosed session is a ResourceWarning)."""
    try:
        return run(worker_hub(runtime).stop())
    finally:
        run(runtime.client.close())


def pending_generation_tasks() -> list[str]:
    """Unfinished tasks on the shared loop that generate samples (there must be none after a stop)."""

    async def names():
        me = asyncio.current_task()
        return [t.get_coro().__qualname__ for t in asyncio.all_tasks() if t is not me and not t.done()]

    return [n for n in run(names()) if "generate" in n or "_on_done" in n]


def assert_accounted(source: CountingSource, trained: list[list[Sample]], filtered: Counter | None = None) -> None:
    """After the worker stopped: every group handed out was trained once, filtered, or handed back."""
    taken = Counter(g[0].group_index for g in trained)
    assert max(taken.values()) == 1, f"a group was trained twice: {taken}"
    filtered = filtered or Counter()
    keys = set(source.out) | set(source.back) | set(taken) | set(filtered)
    wrong = {
        k: (source.out[k], source.back[k], taken[k], filtered[k])
        for k in keys
        if source.out[k] != source.back[k] + taken[k] + filtered[k]
    }
    assert not wrong, f"(out, back, trained, filtered) do not add up: {wrong}"
    assert source.inner.get_buffer_length() == sum(source.back.values()) - sum(
        source.out[k] - 1 for k in source.out if source.out[k] > 1
    )


def versions(groups):
    return [tuple(s.weight_versions) for g in groups for s in g]


# ---- three rollouts, a weight update between each, staleness K ----------------------------------
@pytest.mark.parametrize("k", [0, 1])
def test_three_rollouts_with_weight_updates_respect_staleness(tmp_path, fleet_of, tiny_model_dir, tok, k):
    router, engines = fleet_of(Script())
    args = make_args(tmp_path, router, tiny_model_dir, "--max-staleness", str(k))
    runtime = bind_runtime(args, tokenizer=tok, engine_urls=[e.url for e in engines])
    source = CountingSource(DataSource.from_args(args, tok))
    hub = worker_hub(runtime)
    set_version(runtime, engines, "0")
    trained, outs = [], []
    for rollout_id in range(3):
        if rollout_id:
            set_version(runtime, engines, str(rollout_id))
        out = generate_rollout_fully_async(args, rollout_id, source)
        [worker] = hub.workers
        run(worker.settled())  # the pool (4 groups) full of finished groups before the next update
        assert worker.queue_size() == 4 and worker.in_flight() == 0
        outs.append(out)
        trained += out.samples
        assert [len(g) for g in out.samples] == [2, 2]
        assert all(s.status == Sample.Status.COMPLETED and s.tokens[-3:] == ANSWER for g in out.samples for s in g)
    # rollout 0 by version 0; then: K=0 drops every queued group at each update (4 groups, 8 samples)
    # and serves fresh ones; K=1 keeps one update's worth and drops the two groups two versions old
    assert versions(outs[0].samples) == [("0",)] * 4
    if k == 0:
        assert [versions(o.samples) for o in outs[1:]] == [[("1",)] * 4, [("2",)] * 4]
        assert [o.metrics["rollout/stale_dropped"] for o in outs] == [0, 8, 8]
        assert [o.metrics["rollout/stale_dropped_groups"] for o in outs] == [0, 4, 4]
        assert [o.metrics["rollout/mean_staleness"] for o in outs] == [0.0, 0.0, 0.0]
    else:
        assert [versions(o.samples) for o in outs[1:]] == [[("0",)] * 4, [("1",)] * 4]
        assert [o.metrics["rollout/stale_dropped"] for o in outs] == [0, 0, 4]
        assert [o.metrics["rollout/mean_staleness"] for o in outs] == [0.0, 1.0, 1.0]
    assert all(o.metrics["rollout/max_staleness"] <= k for o in outs)
    assert [o.metrics["rollout/weight_version"] for o in outs] == [0, 1, 2]
    # each segment records the rollout its group was started for: the one taking groups then (rollout_id passed
    # to the rollout function), so a group a rollout serves was started by it or by the one before
    started_for = [{seg["rollout_id"] for g in o.samples for s in g for seg in s.metadata["segments"]} for o in outs]
    assert started_for[0] == {0} and all(ids <= {i - 1, i} for i, ids in enumerate(started_for))
    assert stop(runtime) == {"returned_groups": 4}
    assert not pending_generation_tasks()
    assert_accounted(source, trained)
    assert source.inner.get_buffer_length() == 4


# ---- the dynamic filter sees whole, finished groups only -----------------------------------------
SEEN_BY_FILTER: list[list[tuple]] = []


def even_groups_only(args, samples, **kwargs):
    SEEN_BY_FILTER.append([(s.group_index, s.status, s.response_length) for s in samples])
    keep = samples[0].group_index % 2 == 0
    return DynamicFilterOutput(keep=keep, reason=None if keep else "odd_group")


def test_filter_sees_whole_groups_and_drops_are_counted(tmp_path, fleet_of, tiny_model_dir, tok):
    SEEN_BY_FILTER.clear()
    router, engines = fleet_of(Script())
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        "--dynamic-sampling-filter-path",
        f"{__name__}.even_groups_only",
        "--n-samples-per-prompt",
        "3",
    )
    runtime = bind_runtime(args, tokenizer=tok, engine_urls=[e.url for e in engines])
    source = CountingSource(DataSource.from_args(args, tok))
    trained, dropped = [], 0
    for rollout_id in range(3):
        out = generate_rollout_fully_async(args, rollout_id, source)
        trained += out.samples
        dropped += out.metrics.get("rollout/dropped_groups_odd_group", 0)
        assert all(len(g) == 3 and len({s.group_index for s in g}) == 1 for g in out.samples)
        assert all(g[0].group_index % 2 == 0 for g in out.samples)
    hub = worker_hub(runtime)
    run(hub.workers[0].settled())
    dropped += hub.workers[0].metrics_since_last().get("dropped_groups_odd_group", 0)
    # every call saw one whole group of finished samples, each group once
    assert all(len(call) == 3 and len({g for g, _, _ in call}) == 1 for call in SEEN_BY_FILTER)
    assert all(st == Sample.Status.COMPLETED and n == 3 for call in SEEN_BY_FILTER for _, st, n in call)
    seen = Counter(call[0][0] for call in SEEN_BY_FILTER)
    assert max(seen.values()) == 1
    filtered = Counter({g: 1 for g in seen if g % 2})
    assert dropped == len(filtered) > 0
    stop(runtime)
    assert not pending_generation_tasks()
    assert_accounted(source, trained, filtered)


# ---- partial rollout: a weight update aborts what is in flight and continues it -----------------
def test_weight_update_with_partial_rollout_aborts_and_continues(tmp_path, fleet_of, tiny_model_dir, tok):
    script = Script()
    router, engines = fleet_of(script)
    args = make_args(tmp_path, router, tiny_model_dir, "--partial-rollout", "--max-staleness", "0")
    runtime = bind_runtime(args, tokenizer=tok, engine_urls=[e.url for e in engines])
    source = CountingSource(DataSource.from_args(args, tok))
    hub = worker_hub(runtime)
    set_version(runtime, engines, "0")
    out0 = generate_rollout_fully_async(args, 0, source)
    [worker] = hub.workers
    run(worker.settled())
    script.hold = True  # what starts now stays on the engine until aborted
    out1 = generate_rollout_fully_async(args, 1, source)  # 2 queued groups; 2 start
    assert until(lambda: script.holding == 4, DEADLINE), "timed out waiting for 4 requests held on the engine"
    run(hub.pause())
    assert len(worker.suspended) == 2 and worker.in_flight() == 0  # aborted, kept with their tokens
    assert all(
        s.status == Sample.Status.ABORTED and s.weight_versions == ["0"] for e in worker.suspended for s in e.result
    )
    script.hold = False
    for e in engines:
        requests.post(
            f"{e.url}/update_weights_from_disk", json={"model_path": "x", "weight_version": "1"}, timeout=10
        ).raise_for_status()
    run(hub.resume("1"))
    out2 = generate_rollout_fully_async(args, 2, source)
    run(worker.settled())
    counts = worker.metrics_since_last()
    # the 2 queued version-0 groups were dropped (K=0); the 2 aborted ones were continued, not dropped
    assert out2.metrics["rollout/stale_dropped_groups"] == 2
    assert out2.metrics["rollout/fully_async_continued_groups"] == 2
    continued = [g for g in out2.samples if g[0].weight_versions[0] == "0"] + [
        group for _, group in worker.output_queue.items() if group[0].weight_versions[0] == "0"
    ]
    assert len(continued) == 2
    assert all(
        s.weight_versions == ["0", "1"] and s.status == Sample.Status.COMPLETED and s.tokens[-3:] == ANSWER
        for g in continued
        for s in g
    )
    assert counts.get("stale_dropped", 0) == 0
    assert any(a.get("abort_all") for e in engines for a in e.aborts)
    stop(runtime)
    assert not pending_generation_tasks()
    assert_accounted(source, out0.samples + out1.samples + out2.samples)


# ---- an engine killed while the worker runs ------------------------------------------------------
def serve_stuck_engine(port: int, model_path: str, log: str) -> None:
    """A scripted engine (separate process, so it can be killed) that never answers; logs each rid."""
    import uvicorn

    from slime.testing.scripted_engine import build_app

    async def script(body):
        with open(log, "a") as f:
            f.write(f"{body.get('rid')}\n")
        await asyncio.Event().wait()

    uvicorn.run(build_app(script, model_path), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def test_engine_killed_mid_run_loses_nothing(tmp_path, fleet_of, tiny_model_dir, tok):
    router, (good,) = fleet_of(Script())
    port, log = find_free_port(), tmp_path / "stuck.log"
    log.touch()
    stuck = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from tests.test_fully_async_rollout import serve_stuck_engine;"
            f"serve_stuck_engine({port}, {str(tiny_model_dir)!r}, {str(log)!r})",
        ],
        cwd=str(ROOT),
        start_new_session=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        router.add_worker(url)
        args = make_args(
            tmp_path, router, tiny_model_dir, "--rollout-num-engines", "2", "--sglang-server-concurrency", "2"
        )
        runtime = bind_runtime(args, tokenizer=tok, engine_urls=[good.url, url])
        source = CountingSource(DataSource.from_args(args, tok))
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(generate_rollout_fully_async, args, 0, source)
            # round robin: samples of the pool's groups wait on the stuck engine, until every
            # request the client may have in flight (--sglang-server-concurrency x 2) is one of them
            stuck_rids = lambda: log.read_text().split()  # noqa: E731
            assert until(
                lambda: len(stuck_rids()) == runtime.client.concurrency == runtime.client.in_flight, DEADLINE
            ), "timed out waiting for the client's in-flight requests all on the stuck engine"
            os.killpg(stuck.pid, signal.SIGKILL)
            stuck.wait(10)
            held = len(stuck_rids())
            router.remove_worker(url)  # what the fleet does when it sees an engine die
            out0 = first.result(timeout=120)
        out1 = generate_rollout_fully_async(args, 1, source)
        trained = out0.samples + out1.samples
        assert all(s.status == Sample.Status.COMPLETED and s.tokens[-3:] == ANSWER for g in trained for s in g)
        assert runtime.client.stats.total_retries >= held  # each request the dead engine held was retried
        stop(runtime)
        assert not pending_generation_tasks()
        assert_accounted(source, trained)
    finally:
        if stuck.poll() is None:
            os.killpg(stuck.pid, signal.SIGKILL)
            stuck.wait(10)


# ---- shutdown through the controller, with groups in flight --------------------------------------
def test_controller_weight_updates_and_shutdown_return_everything(tmp_path, fleet_of, tiny_model_dir):
    script = Script(answer_prompts=4)  # rollout 0's pool (4 groups x 2) answers; the next groups hang
    router, engines = fleet_of(script)
    args = make_args(tmp_path, router, tiny_model_dir, "--save", str(tmp_path / "ckpt"))
    controller = RolloutController(args, Endpoints(router.url, [e.url for e in engines]))
    closed = False
    try:
        controller.begin_weight_update()
        for e in engines:
            requests.post(
                f"{e.url}/update_weights_from_disk", json={"model_path": "x", "weight_version": "3"}, timeout=10
            ).raise_for_status()
        controller.end_weight_update("3")
        batch = controller.generate(0)
        assert batch["weight_versions"] == [["3"]] * 4
        [worker] = worker_hub(controller.runtime).workers
        # The next 2 groups hold at the engine once rollout 0 took 2 of the pool; the other 2 answered
        # groups may still be scoring then (in flight, not yet queued): wait for both events.
        assert until(lambda: script.holding == 4 and worker.queue_size() == 2, DEADLINE), (
            f"timed out: {script.holding} requests held, {worker.queue_size()} groups queued"
        )
        assert worker.in_flight() == 2 and worker.current_version == 3
        controller.save(0)  # a checkpoint now: the 4 groups the worker holds are saved as buffered prompts
        resumed = DataSource(args, controller.data_source.prompts, args.n_samples_per_prompt)
        assert resumed.load(args.save) == 0 and resumed.get_buffer_length() == 4
        saved = {s.index for g in resumed.buffer for s in g}
        assert all(s.response_length == 0 for g in resumed.buffer for s in g)
        assert controller.close() == {"returned_groups": 4}
        closed = True
        assert not pending_generation_tasks()
        assert controller.data_source.get_buffer_length() == 4
        assert all(
            s.response_length == 0 and s.status == Sample.Status.PENDING
            for g in controller.data_source.buffer
            for s in g
        )
        trained = set(batch["sample_indices"])
        returned = {s.index for g in controller.data_source.buffer for s in g}
        assert not trained & returned and len(trained | returned) == 12  # 6 groups of 2, each once
        assert saved == returned  # the checkpoint held exactly what was neither trained nor in the buffer
    finally:
        if not closed:
            controller.close()


def test_pause_holds_new_groups_until_resume(tmp_path, fleet_of, tiny_model_dir, tok):
    """While a weight update runs, the worker starts nothing; it fills the pool again after it."""
    router, engines = fleet_of(Script())
    args = make_args(tmp_path, router, tiny_model_dir)
    runtime = bind_runtime(args, tokenizer=tok, engine_urls=[e.url for e in engines])
    source = CountingSource(DataSource.from_args(args, tok))
    hub = worker_hub(runtime)
    out0 = generate_rollout_fully_async(args, 0, source)
    [worker] = hub.workers
    run(worker.settled())
    run(hub.pause())
    run(hub.pause())  # nested (a trainer's bracket around update_weights_from_disk's own)
    with ThreadPoolExecutor(1) as pool:
        rollout = pool.submit(generate_rollout_fully_async, args, 1, source)
        out1 = rollout.result(timeout=DEADLINE)  # served from the queue, nothing new started
        assert sum(source.out.values()) == 6 and worker.in_flight() == 0 and worker.queue_size() == 2
        run(hub.resume("5"))
        assert worker.in_flight() == 0
        run(hub.resume("5"))
    run(worker.settled())
    assert sum(source.out.values()) == 8 and worker.queue_size() == 4 and worker.current_version == 5
    stop(runtime)
    assert_accounted(source, out0.samples + out1.samples)
