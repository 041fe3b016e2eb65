"""An offline wandb run, written through `WandbRun` and read back from its files."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slime.cli.finalize import complete_namespace
from slime.observability import reporting, wandb_reader
from slime.observability.flags import ReportConfig
from slime.observability.metrics_log import read_metrics
from slime.observability.wandb_logger import WandbRun, end_wandb_session


def _ns(**kw) -> argparse.Namespace:
    """A namespace built by hand, completed with the flags' defaults where the command line's would be."""
    return complete_namespace(argparse.Namespace(**kw))


ROOT = Path(__file__).resolve().parents[1]

TRAINER = textwrap.dedent("""
    import argparse, sys
    from slime.observability.wandb_logger import WandbRun
    from slime.cli.finalize import complete_namespace
    args = complete_namespace(argparse.Namespace(use_wandb=True, wandb_dir=sys.argv[1], wandb_project="slime-test"))
    run = WandbRun.join(args, sys.argv[2])
    assert run.id == sys.argv[2]
    run.log({"train/loss": 0.5}, "train/step", step=2)
    run.finish()
""")


@pytest.fixture(scope="module", autouse=True)
def _wandb_service_stopped():
    """The runs here start this process's wandb service (a process and its threads); it is stopped
    when the module ends, as a command's orderly stop does (`WandbRun.finish(end_session=True)`)."""
    yield
    end_wandb_session()


def _args(wdir: Path) -> argparse.Namespace:
    return _ns(
        use_wandb=True,
        wandb_dir=str(wdir),
        wandb_project="slime-test",
        wandb_group="g",
        log_passrate=True,
        n_samples_per_eval_prompt=4,
        wandb_always_use_train_step=True,
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        global_batch_size=4,
    )


def test_offline_run_holds_every_namespace_against_its_step(tmp_path):
    from tests.test_observability import eval_data, groups

    wdir = tmp_path / "wb"
    args = _args(wdir)
    run = WandbRun.start(args)
    run_dir = Path(run.dir)
    try:
        config = ReportConfig.from_args(args)
        reporting.log_rollout(config, 0, groups(), {"rollout_time": 1.0}, run)
        reporting.log_eval(config, 1, eval_data(), run)
        reporting.log_rollout(config, 1, groups(), {"rollout_time": 2.0, "engine": {"retries": 1}}, run)
        reporting.log_eval(config, 2, eval_data(), run)
        run.log({"train/loss": 0.5}, "train/step", step=2)
    finally:
        run.finish()

    assert wandb_reader.find_run_dirs(wdir) == [run_dir]
    rows = wandb_reader.read_history(run_dir)
    keys = set().union(*rows)
    for k in (
        "rollout/reward_mean",
        "rollout/reward_std",
        "rollout/response_len_mean",
        "rollout/response_len_max",
        "rollout/truncated_ratio",
        "rollout/zero_std_group_ratio",
        "rollout/turns_mean",
        "rollout/tool_calls_per_sample",
        "rollout/tool_errors",
        "rollout/parse_errors",
        "perf/rollout_time",
        "perf/tokens_per_s",
        "perf/longest_sample_tokens",
        "perf/tool_time_total",
        "perf/engine_retries",
        "eval/gsm8k",
        "eval/gsm8k-truncated_ratio",
        "eval/gsm8k-pass@4",
        "eval/gsm8k-response_len_mean",
        "eval/aime-24",
        "train/loss",
        "train/step",
    ):
        assert k in keys, k
    # each namespace against its own step (train step: rollout_id * 4 * 2 // 4)
    assert sorted(r["rollout/step"] for r in rows if "rollout/reward_mean" in r) == [0, 2]
    assert sorted(r["perf/step"] for r in rows if "perf/tokens_per_s" in r) == [0, 2]
    assert sorted(r["eval/step"] for r in rows if "eval/gsm8k" in r) == [2, 4]
    assert all(
        set(r) - {"_step", "_runtime", "_timestamp"} <= {k for k in r if k.startswith(ns)}
        for r in rows
        for ns in ("rollout/", "perf/", "eval/", "train/")
        if any(k.startswith(ns) for k in r)
    )

    tables = [r["eval/gsm8k-samples"] for r in rows if "eval/gsm8k-samples" in r]
    assert len(tables) == 2 and tables[0]["_type"] == "table-file"
    table = wandb_reader.read_table(run_dir, tables[0])
    assert table["columns"] == reporting.TABLE_COLUMNS and len(table["data"]) == 8
    assert table["data"][0][:5] == ["question 0", "answer 0.0", "0", 1.0, "completed"]
    assert any("eval/aime-24-samples" in r for r in rows)

    # the run's metrics.jsonl has every record too
    recs = list(read_metrics(run_dir / "metrics.jsonl"))
    assert sorted((r["kind"], r["rollout_id"]) for r in recs) == [
        ("eval", 1),
        ("eval", 2),
        ("perf", 0),
        ("perf", 1),
        ("rollout", 0),
        ("rollout", 1),
    ]


def test_another_process_joins_the_run_by_id(tmp_path):
    """A trainer process logs into the same run through wandb's public resume API."""
    wdir = tmp_path / "wb"
    run = WandbRun.start(_args(wdir))
    try:
        run.log({"rollout/x": 1.0}, "rollout/step", step=0)
        # like a trainer actor: its own wandb service, not this process's
        env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        subprocess.run([sys.executable, "-c", TRAINER, str(wdir), run.id], env=env, check=True, timeout=120)
    finally:
        run.finish()
    dirs = wandb_reader.find_run_dirs(wdir)
    # offline-run-<time>-<id>, and "-1" appended when both processes started within the same second
    assert len(dirs) == 2 and all(re.search(rf"-{run.id}(-\d+)?$", d.name) for d in dirs), dirs
    keys = set().union(*(set().union(*wandb_reader.read_history(d)) for d in dirs))
    assert {"rollout/x", "train/loss", "train/step"} <= keys


def test_off_and_disabled_give_no_run(tmp_path):
    assert WandbRun.start(_ns()) is None
    assert WandbRun.start(_ns(use_wandb=True, wandb_mode="disabled")) is None
    # without a run, reporting still writes metrics.jsonl where asked
    from tests.test_observability import groups

    reporting.log_rollout(ReportConfig.from_args(_ns(metrics_dir=str(tmp_path))), 0, groups(), {}, None)
    assert [r["kind"] for r in read_metrics(tmp_path / "metrics.jsonl")] == ["rollout", "perf"]


INTERRUPTED_TRAINER = textwrap.dedent("""
    import argparse, os, signal, sys, threading
    import slime.cli.command as command
    from slime.observability.wandb_logger import WandbRun
    from slime.train.loop import MetricsSink

    command.preflight = lambda args: {"resumed_after": None}  # no data or model to check here
    from slime.cli.finalize import complete_namespace
    args = complete_namespace(argparse.Namespace(use_wandb=True, wandb_dir=sys.argv[1], wandb_project="slime-test"))

    def body(args):
        sink = MetricsSink(args, wandb=WandbRun.start(args, label="trainer"))
        try:
            sink.wandb.log({"train/loss": 0.25}, "train/step", step=1)
            print("wandb children:", ",".join(c.name() for c in __import__("psutil").Process().children()),
                  flush=True)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of a step
            threading.Event().wait(120)
        finally:
            sink.close()  # the loop's orderly stop

    sys.exit(command.run_cli("slime-train", None, lambda argv: args, body))
""")


def test_ctrl_c_stop_finishes_the_run_without_a_traceback(tmp_path):
    """slime-train's way out after Ctrl-C: the loop closes its metrics sink, then `run_cli` kills
    every leftover child process (wandb's service included). The run must be complete on disk and
    nothing printed by wandb's atexit hook (before: `ConnectionResetError: Connection lost`)."""
    wdir = tmp_path / "wb"
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_TRAINER, str(wdir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        start_new_session=True,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 130, out[-4000:]
    assert "wandb-core" in out and "slime-train: interrupted" in out, out[-4000:]
    for marker in ("Traceback", "Exception ignored", "ConnectionResetError"):
        assert marker not in out, out[-4000:]
    [run_dir] = wandb_reader.find_run_dirs(wdir)
    rows = wandb_reader.read_history(run_dir)
    assert [(r["train/step"], r["train/loss"]) for r in rows if "train/loss" in r] == [(1, 0.25)]
