"""Cold start: seconds from the `slime-rollout` command to the first sample served, with two
embedded engines (Ray start, placement group, engine processes loading the model, router,
registration, first rollout of one sample). Before and after side by side in one run: the
"before" tree is a git commit exported to a temp dir (default: the last one measured before the
fleet hardening), the "after" tree is this checkout; runs alternate so both see the same load.

    python -m bench.bench_cold_start [--model default|tiny] [--runs 2] [--before REF|none]

Each run also prints its timeline: the milestones the run's processes write to
SLIME_STARTUP_TRACE (Ray started, engine fork server preloaded, engines forked and loaded; see
slime.utils.startup_trace) next to what the command printed, and the CPU seconds each part of the run
burnt, in all and between those milestones (bench/cpu_sampler.py): on a shared box the wall time says
more about the other tenants than about us. What a run left in /dev/shm and /tmp is listed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.cpu_sampler import CpuSampler  # noqa: E402
from slime.utils.startup_trace import read as read_trace  # noqa: E402

BEFORE_DEFAULT = "7390f02"  # README: benchmarks (18-19 s to the first sample)


def settle(started: list, timeout: float = 30.0) -> int:
    """Wait for every process a run started to be gone (the next run must not share the CPUs with
    its leftovers); kill the stragglers. Returns how many outlived their command."""
    from slime.cli.lifeline import kill_survivors

    return len(kill_survivors(started, timeout))


def scratch_entries(pid: int | None = None) -> set[str]:
    """/dev/shm entries, and /tmp entries naming `pid` (a run's private dirs carry its pid): what a
    run must not leave behind."""
    shm = {f"/dev/shm/{n}" for n in os.listdir("/dev/shm")} if os.path.isdir("/dev/shm") else set()
    tmp = {f"/tmp/{n}" for n in os.listdir("/tmp") if pid is not None and str(pid) in n}
    return shm | tmp


def one_run(tree: Path, model_dir: str, data: Path) -> tuple:
    trace = Path(tempfile.mkdtemp(prefix="slime-cold-trace-")) / "trace.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "RAY_AUTH_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "HF_ENDPOINT": "http://127.0.0.1:9",
        "SLIME_STARTUP_TRACE": str(trace),
    }
    cmd = [
        sys.executable,
        "-m",
        "slime",
        "--debug-rollout-only",
        "--rollout-backend",
        "hf",
        "--hf-checkpoint",
        model_dir,
        "--rollout-num-engines",
        "2",
        "--engine-threads",
        "1",
        "--prompt-data",
        str(data),
        "--rm-type",
        "exact",
        "--rollout-batch-size",
        "1",
        "--n-samples-per-prompt",
        "1",
        "--rollout-max-response-len",
        "1",
        "--num-rollout",
        "1",
    ]
    shm_before = scratch_entries()
    t0, wall0 = time.perf_counter(), time.time()
    err = tempfile.TemporaryFile(mode="w+")  # shown if the run fails
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=tree)
    sampler = CpuSampler(proc.pid)
    ready = first = None
    phases = ""
    started: list = []
    for line in proc.stdout:
        if line.startswith("router ") and ready is None:
            ready = time.perf_counter() - t0
            phases = line.split("(ready after: ", 1)[-1].rstrip(")\n")
        if line.startswith("rollout 0:"):
            first = time.perf_counter() - t0
            import psutil

            started = psutil.Process(proc.pid).children(recursive=True)
    proc.wait()
    exited = time.perf_counter() - t0
    sampler.stop()
    leftovers = settle(started)
    left_files = sorted(scratch_entries(proc.pid) - shm_before)
    if first is None or proc.returncode != 0:
        err.seek(0)
        raise SystemExit(f"cold start run in {tree} failed (exit {proc.returncode}):\n{err.read()[-3000:]}")
    err.close()
    timeline = [(e["t"] - wall0, e["event"]) for e in read_trace(str(trace))]  # old trees write none
    timeline += [
        (ready, "CLI: router + engines ready line"),
        (first, "CLI: first sample served"),
        (exited, "command exited"),
    ]
    wanted = (
        "ray_init: begin",
        "ray_init: ray.init done",
        "fork server: preloaded",
        "fleet: engines serving",
        "CLI: router + engines ready line",
        "exit: last line printed",
        "command exited",
    )
    edges = [(wall0, "command")] + [(wall0 + t, e) for t, e in sorted(timeline) if e in wanted]
    components = sampler.totals()
    cpu = {
        "total": sum(components.values()),
        "components": components,
        "phases": sampler.phases(edges),
        "left": left_files,
    }
    return ready, first, phases, leftovers, sorted(timeline), exited, cpu


def export_tree(ref: str) -> Path:
    """`git archive REF` into a temp dir (read-only on the repository)."""
    out = Path(tempfile.mkdtemp(prefix=f"slime-cold-{ref}-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    return out


def report(name: str, runs: list[tuple]) -> None:
    print(
        f"{name:<7} command -> router+engines ready : {statistics.median(r[0] for r in runs):6.1f} s  "
        f"(runs: {', '.join(f'{r[0]:.1f}' for r in runs)})"
    )
    print(
        f"{name:<7} command -> first sample served  : {statistics.median(r[1] for r in runs):6.1f} s  "
        f"(runs: {', '.join(f'{r[1]:.1f}' for r in runs)})"
    )
    print(
        f"{name:<7} command -> exit                 : {statistics.median(r[5] for r in runs):6.1f} s  "
        f"(runs: {', '.join(f'{r[5]:.1f}' for r in runs)}; after the first sample: "
        f"{', '.join(f'{r[5] - r[1]:.1f}' for r in runs)})"
    )
    if runs[-1][2]:
        print(f"{name:<7} manager start-up phases (last run) : {runs[-1][2]}")
    print(f"{name:<7} processes alive 30 s after exit    : {', '.join(str(r[3]) for r in runs)}")
    print(
        f"{name:<7} left in /dev/shm and /tmp           : "
        f"{'; '.join(', '.join(r[6]['left']) or 'nothing' for r in runs)}"
    )
    print(
        f"{name:<7} CPU seconds, every process of the run: {statistics.median(r[6]['total'] for r in runs):6.1f} s  "
        f"(runs: {', '.join(format(r[6]['total'], '.1f') for r in runs)})"
    )
    cpu = runs[-1][6]
    print(f"{name:<7} CPU seconds per component (last run, sampled every 0.2 s):")
    for label, secs in cpu["components"].items():
        if secs >= 0.05:
            print(f"          {secs:6.2f}  {label}")
    print(f"{name:<7} CPU seconds per phase (last run; wall seconds of the phase in brackets):")
    for window, wall, per in cpu["phases"]:
        parts = ", ".join(f"{label} {secs:.2f}" for label, secs in per.items() if secs >= 0.05)
        print(f"          [{wall:5.2f}] {sum(per.values()):5.2f}  {window}: {parts}")
    print(f"{name:<7} timeline of the last run (s after the command started):")
    for t, event in runs[-1][4]:
        print(f"          {t:6.2f}  {event}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["default", "tiny"], default="default")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--before", default=BEFORE_DEFAULT, help="git ref to compare against, or 'none'")
    a = ap.parse_args()
    if a.model == "default":
        from slime.engine.default_model import ensure_default_model

        model_dir = str(ensure_default_model())
    else:
        from slime.testing.tiny_model import build_tiny_model

        model_dir = str(build_tiny_model(Path(tempfile.gettempdir()) / "slime-bench-tiny"))
    data = Path(tempfile.mkdtemp()) / "p.jsonl"
    data.write_text(json.dumps({"input": "Hello"}) + "\n")
    trees = {"after": ROOT}
    if a.before != "none":
        trees = {"before": export_tree(a.before), **trees}
    # both trees as installed (`make setup` compiles ours): bytecode, whatever PYTHONDONTWRITEBYTECODE says
    for tree in trees.values():
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", "-j", "0", "slime"], cwd=tree, check=True, capture_output=True
        )
    results: dict[str, list] = {name: [] for name in trees}
    loads = [os.getloadavg()[0]]
    for _ in range(a.runs):  # alternate, so both trees see the same machine load
        for name, tree in trees.items():
            results[name].append(one_run(tree, model_dir, data))
            loads.append(os.getloadavg()[0])
    print(
        f"model={a.model} ({model_dir}) engines=2 runs={a.runs} cpus={os.cpu_count()} "
        f"before={a.before} after=working tree"
    )
    print(
        f"load average (1 min) before/after each run: {', '.join(f'{x:.1f}' for x in loads)} "
        f"(the runs are CPU-bound: compare before and after of one sitting only)"
    )
    for name, runs in results.items():
        report(name, runs)


if __name__ == "__main__":
    main()
