"""Asynchronous rollout on a long-tail workload: five modes side by side, in one run.

Engines: `--engines` paced scripted engines (`slime.testing.paced_engine`, in this process) behind
the real sglang-router, each decoding at most `--slots` requests at once at `--tokens-per-s` per
request (the rest wait in the engine's queue), so capacity is finite and idle slots are measured
inside the engine. Response lengths are heavy-tailed like reasoning RL, drawn per sample (the samples
of a group differ), seeded: 80% short (uniform in [S/2, S] tokens), 20% long (log-uniform in
[2S, 16S]); S = 32: mean 62 tokens, max 512, and the long fifth holds about 70% of all tokens.

The loop, the same in every mode, for `--rollouts` R rollouts of `--groups` G groups x `--n-samples`:
rollout r (the mode's rollout function, called as the controller calls it) -> train step
(`--train-time` T seconds of wall time; in the synchronous modes the engines idle, the fully-async
worker keeps generating) -> weight update bracketed as the rollout manager does it (the workers'
`pause`, every engine's `/update_weights_from_disk {"weight_version": r + 1}`, `resume(r + 1)`).
  (a) sync:          `slime.rollout.sglang_rollout.generate_rollout`, over-sampling = batch;
  (b) over + abort:  the same with `--over-sampling-batch-size` = 2 G: stops at G finished groups,
                     aborts the rest, which restarts from scratch later;
  (c) over + partial: (b) with `--partial-rollout`: the rest is continued by the next rollout;
  (d) fully async:   `--rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async
                     --max-staleness 1` (groups more than one version behind are dropped);
  (e) fully async + `--partial-rollout`, staleness 1 (in-flight samples are aborted at each weight
                     update and continued under the new weights: AReaL's interruptible generation).

Why these defaults (chosen from the model of a deployment, not tuned for a result): 2 engines x 16
slots and a batch of 16 x 4 = 64 samples, two per slot, so requests queue as in a real engine.
T = the batch's pure decode time at full capacity (G n mean / (engines slots tokens/s) = 1.25 s): a
trainer sized to keep pace with the engines, which is how a disaggregated async setup is
provisioned; then a sync step is T + the longest response (~5 s), i.e. training is ~20% of a sync
step. The fully-async worker owns `--sglang-server-concurrency` x engines = 2 G groups (one batch
ready, one generating). 100 tokens/s keeps each short response (160-320 ms) long against the
harness's per-request overhead (~ms, more on a loaded machine). The first rollout of every mode
starts cold and is counted. Left out, which makes the async gains an upper bound: a real engine
decodes faster per request when its batch is small, has prefill, and re-prefills a continued
sample's prefix.

Columns: trained tokens/s = response tokens of the trained samples / wall time of the whole loop
(rollouts, train steps, weight updates), the headline and what the goals are stated in; samples/s =
trained samples / the same wall time, kept beside it (it rewards modes that train shorter responses:
abort without partial rollout restarts long samples, staleness drops them); mean trained len = mean response length of the trained samples (modes that drop or
restart long samples train on shorter ones: the bias of abort without partial rollout and of
staleness drops); in rollout fn = time the trainer waited for rollouts; abort = the rollout's
`perf/abort_time`; weight push = the updates with the workers' pause/resume; engine busy =
time-weighted fraction of decode slots occupied, over the whole loop and over the time inside the
rollout function; aborted tokens = tokens answered with finish "abort"; wasted tokens = tokens the
engines generated that were neither trained nor kept (partial or finished samples in the buffer or
a worker's queue) once generation is quiesced after the last rollout; staleness = weight version
the sample is trained at minus the oldest version that sampled any of its tokens.

`--rounds K` runs every mode K times, rounds interleaved (abcde, edcba, abcde, ...), so load that other
work puts on a shared box falls on every mode alike; the table sums the rounds, and each mode's ratio to
sync is also given per round (both measured within the same minutes).

    python -m bench.bench_async_rollout [--rollouts 8] [--groups 16] [--modes abcde] [--rounds 1] [--short]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from slime.fleet.router import Router  # noqa: E402
from slime.testing.paced_engine import LongTail, PacedScript  # noqa: E402
from slime.testing.scripted_engine import ScriptedEngine  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

ASYNC_FN = "slime.rollout.fully_async_rollout.generate_rollout_fully_async"
PROMPT_LEN = 16


@dataclass(frozen=True)
class Mode:
    key: str
    title: str
    flags: tuple[str, ...] = ()
    over_sampling: bool = False  # --over-sampling-batch-size = workload.over_sampling x groups
    fully_async: bool = False


ASYNC_FLAGS = ("--rollout-function-path", ASYNC_FN, "--max-staleness", "1")
MODES = {
    "a": Mode("a", "sync"),
    "b": Mode("b", "over-provisioned + abort", over_sampling=True),
    "c": Mode("c", "over-provisioned + partial rollout", ("--partial-rollout",), over_sampling=True),
    "d": Mode("d", "fully async, staleness 1", ASYNC_FLAGS, fully_async=True),
    "e": Mode(
        "e", "fully async + partial rollout, staleness 1", ASYNC_FLAGS + ("--partial-rollout",), fully_async=True
    ),
}


@dataclass
class Workload:
    engines: int = 2
    slots: int = 16
    tokens_per_s: float = 100.0
    lengths: LongTail = field(default_factory=LongTail)
    groups: int = 16
    n_samples: int = 4
    rollouts: int = 8
    train_time: float | None = None  # None: the batch's decode time at full capacity
    over_sampling: float = 2.0
    async_pool: int | None = None  # groups the fully-async worker owns; None: 2 x groups
    seed: int = 1
    prompts: int = 4096

    @property
    def batch_samples(self) -> int:
        return self.groups * self.n_samples

    @property
    def total_slots(self) -> int:
        return self.engines * self.slots

    @property
    def capacity_time(self) -> float:
        """Seconds to decode one batch's expected tokens with every slot of every engine busy."""
        return self.batch_samples * self.lengths.mean() / (self.total_slots * self.tokens_per_s)

    @property
    def train_seconds(self) -> float:
        return self.capacity_time if self.train_time is None else self.train_time

    @property
    def over_sampling_groups(self) -> int:
        return max(self.groups, int(round(self.over_sampling * self.groups)))

    @property
    def pool_groups(self) -> int:
        pool = 2 * self.groups if self.async_pool is None else self.async_pool
        return max(self.engines, pool // self.engines * self.engines)  # the flag is per engine


@dataclass
class ModeResult:
    mode: Mode
    trained_samples: int = 0
    trained_tokens: int = 0
    wall: float = 0.0
    rollout_time: float = 0.0
    push_time: float = 0.0  # weight updates, the workers' pause and resume included
    busy_whole: float = 0.0
    busy_rollout: float = 0.0
    generated_tokens: int = 0
    aborted_tokens: int = 0
    carried_tokens: int = 0
    staleness: list[int] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # summed over rollouts
    rollouts: list[list[list[Sample]]] = field(default_factory=list)  # what each rollout returned (tests)
    engine: dict[str, int] = field(default_factory=dict)
    prompts_handed_out: int = 0  # fresh groups the data source created
    buffer: list[list[Sample]] = field(default_factory=list)  # the data source's buffer after the run
    error: str | None = None

    @property
    def samples_per_s(self) -> float:
        return self.trained_samples / self.wall if self.wall else 0.0

    @property
    def tokens_per_s(self) -> float:
        """The headline: trained response tokens per second. Samples/s rewards a mode for training shorter
        responses (dropping or restarting the long ones); tokens/s does not."""
        return self.trained_tokens / self.wall if self.wall else 0.0

    @property
    def wasted_tokens(self) -> int:
        return self.generated_tokens - self.trained_tokens - self.carried_tokens


class PacedCluster:
    """`engines` paced scripted engines in this process, registered with a router."""

    def __init__(self, router: Router, workload: Workload, model_dir: str, seed: int):
        self.router, self.workload = router, workload
        self.scripts = [
            PacedScript(
                workload.lengths, slots=workload.slots, tokens_per_s=workload.tokens_per_s, seed=seed * 1000 + i
            )
            for i in range(workload.engines)
        ]
        self.engines = [ScriptedEngine(s, model_dir) for s in self.scripts]

    def __enter__(self) -> "PacedCluster":
        try:
            for e in self.engines:
                e.start()
                self.router.add_worker(e.url)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for e in self.engines:
            try:
                if e.url in self.router.workers:
                    self.router.remove_worker(e.url)
            finally:
                e.stop()

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    def set_weight_version(self, version: int) -> None:
        for url in self.urls:
            requests.post(
                f"{url}/update_weights_from_disk", json={"weight_version": str(version)}, timeout=10
            ).raise_for_status()

    def reset_window(self) -> None:
        for s in self.scripts:
            s.reset_window()

    def busy_slot_seconds(self) -> float:
        return sum(s.busy_slot_seconds() for s in self.scripts)

    def totals(self) -> dict[str, int]:
        snaps = [s.snapshot() for s in self.scripts]
        return {
            k: sum(int(sn[k]) for sn in snaps)
            for k in ("generated_tokens", "aborted_tokens", "requests", "aborts", "continuations")
        }


def make_prompts(n: int) -> list[Sample]:
    """Distinct pre-tokenised prompts (ids below the paced engine's response range)."""
    return [
        Sample(
            prompt=f"prompt {i}", tokens=[1000 + (i * PROMPT_LEN + j) % 100_000 for j in range(PROMPT_LEN)], label="x"
        )
        for i in range(n)
    ]


def build_args(mode: Mode, w: Workload, router: Router, model_dir: str):
    from slime.cli.args import parse_args

    if mode.fully_async:
        # the worker owns `--sglang-server-concurrency` x engines groups (in flight + finished, untaken)
        concurrency = w.pool_groups // w.engines
    else:  # the client's in-flight bound never binds: the engines' slots and queues are the limit
        concurrency = max(64, w.over_sampling_groups * w.n_samples)
    argv = [
        "--rollout-backend",
        "hf",
        "--hf-checkpoint",
        model_dir,
        "--sglang-router-ip",
        router.host,
        "--sglang-router-port",
        str(router.port),
        "--rm-type",
        "exact",
        "--rollout-batch-size",
        str(w.groups),
        "--n-samples-per-prompt",
        str(w.n_samples),
        "--rollout-max-response-len",
        str(w.lengths.max_len),
        "--rollout-num-engines",
        str(w.engines),
        "--sglang-server-concurrency",
        str(concurrency),
        "--rollout-seed",
        str(w.seed),
    ]
    if mode.over_sampling:
        argv += ["--over-sampling-batch-size", str(w.over_sampling_groups)]
    return parse_args(argv + list(mode.flags))


def sample_staleness(sample: Sample, trained_at: int) -> int:
    """Versions between the policy that trains on the sample and the oldest that sampled it."""
    versions = [int(str(v)) for v in (sample.weight_versions or [])]
    return trained_at - min(versions) if versions else 0


def response_tokens(groups: list[list[Sample]]) -> int:
    return sum(int(s.response_length or 0) for g in groups for s in g)


class WeightUpdates:
    """A weight push as the rollout manager brackets it: the fully-async workers are paused, every
    engine gets the new version, the workers resume knowing it. Without the hub: the push alone."""

    def __init__(self, runtime: Any, cluster: PacedCluster):
        self.runtime, self.cluster = runtime, cluster
        try:
            from slime.rollout.fully_async_rollout import worker_hub
        except ImportError:
            worker_hub = None
        self.hub = worker_hub(runtime) if worker_hub is not None else None

    def push(self, version: int) -> None:
        from slime.utils.async_utils import run

        if self.hub is not None:
            run(self.hub.pause())
        try:
            self.cluster.set_weight_version(version)
        finally:
            if self.hub is not None:
                run(self.hub.resume(str(version)))

    def workers(self) -> list[Any]:
        return list(getattr(self.hub, "workers", []) or [])

    def held_groups(self) -> list[list[Sample]]:
        """Quiesce the fully-async workers (start nothing, let what runs finish, or with
        --partial-rollout abort it keeping its tokens) and return the groups they hold."""
        from slime.utils.async_utils import run

        if self.hub is None or not self.workers():
            return []
        run(self.hub.pause())
        held = []
        for w in self.workers():
            run(w.settled())
            held += [group for _, group in w.output_queue.items()]
            held += [e.result for e in getattr(w, "suspended", []) if e.result]
        return held

    def stop(self) -> None:
        from slime.utils.async_utils import run

        if self.hub is not None:
            run(self.hub.stop())


def run_mode(mode: Mode, w: Workload, router: Router, model_dir: str, *, keep_samples: bool = False) -> ModeResult:
    from slime.rollout.base_types import call_rollout_fn
    from slime.rollout.data_source import DataSource
    from slime.rollout.runtime import unbind
    from slime.testing.runtime import bind_runtime
    from slime.utils.async_utils import run
    from slime.utils.misc import load_function

    result = ModeResult(mode)
    args = build_args(mode, w, router, model_dir)
    fn = load_function(args.rollout_function_path, "--rollout-function-path")
    source = DataSource(args, make_prompts(w.prompts), w.n_samples)
    with PacedCluster(router, w, model_dir, w.seed) as cluster:
        runtime = bind_runtime(args, engine_urls=cluster.urls)
        updates = WeightUpdates(runtime, cluster)
        try:
            cluster.set_weight_version(0)
            cluster.reset_window()
            start = time.monotonic()
            for r in range(w.rollouts):
                busy0, t0 = cluster.busy_slot_seconds(), time.monotonic()
                out = call_rollout_fn(fn, args, r, source, evaluation=False)  # runtime: bound above
                result.rollout_time += time.monotonic() - t0
                result.busy_rollout += cluster.busy_slot_seconds() - busy0
                groups = out.samples
                for k, v in (out.metrics or {}).items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        result.metrics[k] = result.metrics.get(k, 0) + v
                flat = [s for g in groups for s in g]
                result.trained_samples += len(flat)
                result.trained_tokens += sum(s.response_length for s in flat)
                result.staleness += [sample_staleness(s, r) for s in flat]
                if keep_samples:
                    result.rollouts.append(groups)
                time.sleep(w.train_seconds)  # the train step (simulated work: the trainer is busy)
                t2 = time.monotonic()
                updates.push(r + 1)
                result.push_time += time.monotonic() - t2
            result.wall = time.monotonic() - start
            result.busy_whole = cluster.busy_slot_seconds() / (w.total_slots * result.wall)
            result.busy_rollout /= w.total_slots * max(result.rollout_time, 1e-9)
            # accounting, once nothing is generating: every token generated is trained, kept
            # (buffer, worker queue, partial samples) or wasted
            held = updates.held_groups()
            totals = cluster.totals()
            result.engine = totals
            result.generated_tokens, result.aborted_tokens = totals["generated_tokens"], totals["aborted_tokens"]
            result.carried_tokens = response_tokens(source.buffer) + response_tokens(held)
        finally:
            updates.stop()  # whatever the workers held goes back to the data source
            run(runtime.client.abort_all())
            run(runtime.client.close())
            unbind(runtime)
    result.buffer = [list(g) for g in source.buffer]
    result.prompts_handed_out = source.group_counter
    return result


def mode_available(mode: Mode, router: Router, model_dir: str, w: Workload) -> str | None:
    """Why a mode cannot run in this tree (its flags or function missing), else None."""
    try:
        build_args(mode, w, router, model_dir)
    except SystemExit:
        return f"flags {' '.join(mode.flags)} are not accepted by slime.cli.args"
    return None


def fmt_table(results: list[ModeResult]) -> str:
    base = next((r for r in results if r.mode.key == "a" and not r.error), None)
    lines = [
        "| mode | trained tokens/s | vs sync | samples/s | vs sync | mean trained len | in rollout fn s "
        "| abort s | weight push s | engine busy: whole run | busy: in rollout fn | aborted tokens | wasted tokens "
        "| staleness mean (max) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.error:
            lines.append(f"| ({r.mode.key}) {r.mode.title} | n/a: {r.error} |" + " |" * 13)
            continue
        tokens_ratio = f"{r.tokens_per_s / base.tokens_per_s:.2f}x" if base else "-"
        ratio = f"{r.samples_per_s / base.samples_per_s:.2f}x" if base else "-"
        stale = f"{statistics.fmean(r.staleness):.2f} ({max(r.staleness)})" if r.staleness else "-"
        mean_len = r.trained_tokens / r.trained_samples if r.trained_samples else 0.0
        lines.append(
            f"| ({r.mode.key}) {r.mode.title} | {r.tokens_per_s:.0f} | {tokens_ratio} | "
            f"{r.samples_per_s:.1f} | {ratio} | {mean_len:.0f} | "
            f"{r.rollout_time:.1f} | {r.metrics.get('perf/abort_time', 0.0):.1f} | {r.push_time:.1f} | "
            f"{r.busy_whole:.0%} | {r.busy_rollout:.0%} | {r.aborted_tokens} | {r.wasted_tokens} | {stale} |"
        )
    return "\n".join(lines)


def merge(results: list[ModeResult]) -> ModeResult:
    """One mode's rounds as one run: counts and times summed, busy fractions weighted by their time."""
    if any(r.error for r in results):
        return next(r for r in results if r.error)
    out = ModeResult(results[0].mode)
    for r in results:
        for name in (
            "trained_samples",
            "trained_tokens",
            "wall",
            "rollout_time",
            "push_time",
            "generated_tokens",
            "aborted_tokens",
            "carried_tokens",
        ):
            setattr(out, name, getattr(out, name) + getattr(r, name))
        out.busy_whole += r.busy_whole * r.wall
        out.busy_rollout += r.busy_rollout * r.rollout_time
        out.staleness += r.staleness
        for k, v in r.metrics.items():
            out.metrics[k] = out.metrics.get(k, 0) + v
    out.busy_whole /= max(out.wall, 1e-9)
    out.busy_rollout /= max(out.rollout_time, 1e-9)
    return out


def run_rounds(w: Workload, modes: list[str], rounds: int) -> list[list[ModeResult]]:
    """`rounds` runs of every mode, the order reversed every other round; one list per round, in `modes` order."""
    out = []
    for i in range(rounds):
        order = modes if i % 2 == 0 else modes[::-1]
        by_key = {r.mode.key: r for r in run_all(w, order)}
        out.append([by_key[k] for k in modes])
    return out


def per_round_ratios(rounds: list[list[ModeResult]]) -> list[str]:
    """Each mode's trained tokens/s against sync's of the same round."""
    lines = []
    for i, key in enumerate(r.mode.key for r in rounds[0]):
        ratios = []
        for results in rounds:
            base = next((r for r in results if r.mode.key == "a" and not r.error), None)
            if base and not results[i].error:
                ratios.append(f"{results[i].tokens_per_s / base.tokens_per_s:.2f}x")
        if key != "a" and ratios:
            lines.append(f"({key}) trained tokens/s vs sync, per round: {', '.join(ratios)}")
    return lines


def describe(w: Workload) -> str:
    L = w.lengths
    train = (
        f"{w.train_seconds:.2f} s (= one batch's decode time at full capacity)"
        if w.train_time is None
        else f"{w.train_seconds:.2f} s"
    )
    return (
        f"{w.engines} paced engines x {w.slots} slots at {w.tokens_per_s:g} tokens/s per request, behind "
        f"sglang-router; {w.rollouts} rollouts of {w.groups} groups x {w.n_samples} samples "
        f"({w.rollouts * w.batch_samples} trained samples per mode); lengths: "
        f"{1 - L.long_fraction:.0%} uniform in [{L.short_len // 2}, {L.short_len}], {L.long_fraction:.0%} "
        f"log-uniform in [{2 * L.short_len}, {L.max_len}] tokens (mean {L.mean():.0f}); train step {train}; "
        f"over-sampling {w.over_sampling_groups} groups in (b), (c); fully-async pool {w.pool_groups} groups; "
        f"seed {w.seed}."
    )


def run_all(w: Workload, modes: list[str], *, keep_samples: bool = False) -> list[ModeResult]:
    from slime.testing.tiny_model import qwen_tokenizer_dir

    model_dir = str(qwen_tokenizer_dir())  # the only thing read from --hf-checkpoint: prompts come tokenised
    router = Router().start()
    results = []
    try:
        for key in modes:
            mode = MODES[key]
            why = mode_available(mode, router, model_dir, w)
            if why:
                results.append(ModeResult(mode, error=why))
                continue
            try:
                results.append(run_mode(mode, w, router, model_dir, keep_samples=keep_samples))
            except Exception as e:  # noqa: BLE001 - one broken mode is reported in its row, the others still run
                logging.getLogger(__name__).exception("mode (%s) failed", key)
                results.append(ModeResult(mode, error=f"{type(e).__name__}: {e}"[:200]))
    finally:
        router.stop()
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--tokens-per-s", type=float, default=100.0)
    ap.add_argument("--short-len", type=int, default=32)
    ap.add_argument("--long-fraction", type=float, default=0.2)
    ap.add_argument("--long-max-factor", type=float, default=16.0)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--n-samples", type=int, default=4)
    ap.add_argument("--rollouts", type=int, default=8)
    ap.add_argument("--train-time", type=float, default=None, help="seconds; default: one batch at full capacity")
    ap.add_argument("--over-sampling", type=float, default=2.0, help="x --groups, for modes b and c")
    ap.add_argument(
        "--async-pool",
        type=int,
        default=None,
        help="groups the fully-async worker owns (in flight + finished); default 2 x --groups",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="abcde", help="letters of the modes to run (see the module docstring)")
    ap.add_argument("--short", action="store_true", help="a quick run (tests): small batch, fast engine")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs of every mode, interleaved (abcde, edcba, ...) so load drift falls on all alike",
    )
    a = ap.parse_args(argv)
    if a.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {a.rounds}")
    w = Workload(
        engines=a.engines,
        slots=a.slots,
        tokens_per_s=a.tokens_per_s,
        lengths=LongTail(a.short_len, a.long_fraction, a.long_max_factor),
        groups=a.groups,
        n_samples=a.n_samples,
        rollouts=a.rollouts,
        train_time=a.train_time,
        over_sampling=a.over_sampling,
        async_pool=a.async_pool,
        seed=a.seed,
    )
    if a.short:
        w = short_workload(w)
    logging.getLogger("uvicorn.error").addFilter(_QuietEngines())
    rounds = run_rounds(w, list(a.modes), a.rounds)
    results = [merge([rnd[i] for rnd in rounds]) for i in range(len(a.modes))]
    print(describe(w) + (f" {a.rounds} interleaved rounds, summed." if a.rounds > 1 else ""))
    print(fmt_table(results))
    if a.rounds > 1:
        print("\n".join(per_round_ratios(rounds)))
    base = next((r for r in results if r.mode.key == "a" and not r.error), None)
    for r in results:
        if r.error or base is None:
            continue
        goal = {"c": "over + partial >= 1.3x sync", "d": "fully async >= 2x sync", "e": "fully async >= 2x sync"}.get(
            r.mode.key
        )
        if goal:
            print(
                f"goal ({r.mode.key}) {goal} in trained tokens/s, engine busy >= 90%: "
                f"{r.tokens_per_s / base.tokens_per_s:.2f}x (samples/s {r.samples_per_s / base.samples_per_s:.2f}x), "
                f"busy whole run {r.busy_whole:.0%}, in rollout fn {r.busy_rollout:.0%}"
            )
    failed = [r.mode.key for r in results if r.error]
    if failed:
        sys.exit(f"modes failed: {failed}")


class _QuietEngines(logging.Filter):
    """Drop uvicorn's "Invalid HTTP request received" (a probe at registration, two per engine)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Invalid HTTP request" not in record.getMessage()


def short_workload(w: Workload) -> Workload:
    """A few seconds per mode: small batch, a fast engine, a short train step."""
    return dataclasses.replace(
        w,
        engines=2,
        slots=4,
        tokens_per_s=400.0,
        lengths=LongTail(8, 0.25, 8.0),
        groups=4,
        n_samples=2,
        rollouts=3,
        train_time=0.1,
        prompts=256,
    )


if __name__ == "__main__":
    main()
