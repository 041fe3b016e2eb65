"""An offline wandb run shared by two processes, read back from its files."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from slime.observability import reporting, wandb_logger, wandb_reader
from slime.observability.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[1]

SECONDARY = textwrap.dedent("""
    import argparse, sys
    sys.path.insert(0, sys.argv[3])
    from tests.test_observability import eval_data, groups
    from slime.observability import reporting, wandb_logger
    args = argparse.Namespace(use_wandb=True, wandb_dir=sys.argv[1], log_passrate=True,
                              n_samples_per_eval_prompt=4, wandb_always_use_train_step=True,
                              rollout_batch_size=4, n_samples_per_prompt=2, global_batch_size=4)
    wandb_logger.init_wandb_secondary(args, sys.argv[2])
    assert wandb_logger.is_active()
    reporting.log_eval(args, 1, eval_data())
    reporting.log_rollout(args, 1, groups(), {"rollout_time": 2.0, "engine": {"retries": 1}})
    wandb_logger.log(args, {"train/loss": 0.5}, "train/step", step=2)
    wandb_logger.finish()
""")


def test_offline_run_shared_by_two_processes(tmp_path):
    wdir = tmp_path / "wb"
    args = argparse.Namespace(use_wandb=True, wandb_dir=str(wdir), wandb_project="slime-test", wandb_group="g",
                              log_passrate=True, n_samples_per_eval_prompt=4, wandb_always_use_train_step=True,
                              rollout_batch_size=4, n_samples_per_prompt=2, global_batch_size=4)
    from tests.test_observability import eval_data, groups

    run_id = wandb_logger.init_wandb_primary(args)
    assert run_id and (wdir / f"slime-wandb-{run_id}.json").exists()
    wandb_logger.init_wandb_secondary(args, run_id)  # same process: a no-op
    run_dir = Path(wandb_logger.run_dir())
    try:
        reporting.log_rollout(args, 0, groups(), {"rollout_time": 1.0})
        # the controller: another process that did not inherit the wandb service address (like a Ray actor)
        env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
        subprocess.run([sys.executable, "-c", SECONDARY, str(wdir), run_id, str(ROOT)], env=env, check=True,
                       timeout=120)
        reporting.log_eval(args, 2, eval_data())
    finally:
        wandb_logger.finish()
    assert not (wdir / f"slime-wandb-{run_id}.json").exists()

    assert wandb_reader.find_run_dirs(wdir) == [run_dir]  # one run directory for both processes
    rows = wandb_reader.read_history(run_dir)
    keys = set().union(*rows)
    for k in ("rollout/reward_mean", "rollout/reward_std", "rollout/response_len_mean", "rollout/response_len_max",
              "rollout/truncated_ratio", "rollout/zero_std_group_ratio", "rollout/turns_mean",
              "rollout/tool_calls_per_sample", "rollout/tool_errors", "rollout/parse_errors",
              "perf/rollout_time", "perf/tokens_per_s", "perf/longest_sample_tokens", "perf/tool_time_total",
              "perf/engine_retries", "eval/gsm8k", "eval/gsm8k-truncated_ratio", "eval/gsm8k-pass@4",
              "eval/gsm8k-response_len_mean", "eval/aime-24", "train/loss", "train/step"):
        assert k in keys, k
    # each namespace against its own step (train step: rollout_id * 4 * 2 // 4)
    assert sorted(r["rollout/step"] for r in rows if "rollout/reward_mean" in r) == [0, 2]
    assert sorted(r["perf/step"] for r in rows if "perf/tokens_per_s" in r) == [0, 2]
    assert sorted(r["eval/step"] for r in rows if "eval/gsm8k" in r) == [2, 4]
    assert all(set(r) - {"_step", "_runtime", "_timestamp"} <= {k for k in r if k.startswith(ns)}
               for r in rows for ns in ("rollout/", "perf/", "eval/", "train/")
               if any(k.startswith(ns) for k in r))

    tables = [r["eval/gsm8k-samples"] for r in rows if "eval/gsm8k-samples" in r]
    assert len(tables) == 2 and tables[0]["_type"] == "table-file"
    table = wandb_reader.read_table(run_dir, tables[0])
    assert table["columns"] == reporting.TABLE_COLUMNS and len(table["data"]) == 8
    assert table["data"][0][:5] == ["question 0", "answer 0.0", "0", 1.0, "completed"]
    assert any("eval/aime-24-samples" in r for r in rows)

    # both processes also appended to the run's metrics.jsonl
    recs = list(read_metrics(run_dir / "metrics.jsonl"))
    assert sorted((r["kind"], r["rollout_id"]) for r in recs) == [
        ("eval", 1), ("eval", 2), ("perf", 0), ("perf", 1), ("rollout", 0), ("rollout", 1)]


def test_disabled_and_off_are_noops(tmp_path):
    assert wandb_logger.init_wandb_primary(argparse.Namespace()) is None
    assert wandb_logger.init_wandb_primary(argparse.Namespace(use_wandb=True, wandb_mode="disabled")) is None
    wandb_logger.init_wandb_secondary(argparse.Namespace(use_wandb=True, wandb_dir=str(tmp_path)), None)
    wandb_logger.log(argparse.Namespace(), {"rollout/x": 1}, "rollout/step")
    wandb_logger.finish()
    assert not wandb_logger.is_active()


def test_secondary_that_cannot_attach_still_writes_metrics_jsonl(tmp_path, caplog):
    """E.g. the primary's wandb service is gone: warn, keep logging to the run's metrics.jsonl."""
    import json

    from tests.test_observability import groups

    run_dir = tmp_path / "wandb" / "offline-run-x-gone"
    (tmp_path / "slime-wandb-gone.json").write_text(json.dumps(
        {"run_id": "gone", "attach_id": "gone", "service": None, "run_dir": str(run_dir)}))
    args = argparse.Namespace(use_wandb=True, wandb_dir=str(tmp_path))
    try:
        wandb_logger.init_wandb_secondary(args, "gone")
        assert not wandb_logger.is_active() and "cannot attach" in caplog.text
        reporting.log_rollout(args, 0, groups(), {})
    finally:
        wandb_logger.finish()
    assert [r["kind"] for r in read_metrics(run_dir)] == ["rollout", "perf"]
