"""SIGTERM to `slime-train`'s whole process group, as systemd, Slurm and `kill -TERM -PGID` send it,
mid-run: the same orderly stop as a SIGTERM to the command alone (143, our stop line, nothing left,
Ray's temp dir removed). Before, Ray's GCS and raylet were in the group and died of the signal; the
stop waited 60 s for them and Ray's "Failed to connect to GCS within 60 seconds" ended it (rc 1).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

from slime.testing.processes import cmdline, descendants, survivors


def test_sigterm_to_the_process_group_mid_run_stops_in_order(tiny_model_dir, tmp_path, cli_runs):
    rows = [{"messages": [{"role": "user", "content": f"Count to {i}."}], "label": ""} for i in range(32)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["-m", "slime.train", "--rollout-backend", "hf", "--hf-checkpoint", str(tiny_model_dir),
            "--prompt-data", str(tmp_path / "train.jsonl"), "--input-key", "messages", "--label-key", "label",
            "--apply-chat-template", "--rollout-num-engines", "1", "--rollout-num-cpus-per-engine", "0.5",
            "--engine-threads", "1", "--actor-num-workers", "1", "--actor-num-cpus-per-worker", "0.5",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6",
            "--global-batch-size", "4", "--micro-batch-size", "2", "--lr", "1e-3",
            "--custom-rm-path", "tests.plugins.train_rewards.even_token_fraction", "--num-rollout", "100000",
            "--log-dir", str(tmp_path / "logs")]
    proc = cli_runs.start(argv, deadline=360)  # its own session: the group is the command's
    lines: list[str] = []
    cli_runs.read_until(proc, "trainer:", lines)
    started = descendants(proc.pid)
    names = " ".join(cmdline(p) for p in started)
    for part in ("raylet", "gcs_server", "ray::RolloutManager", "ray::TrainWorker"):
        assert part in names, (part, names[-3000:])
    ray_tmp = Path(tempfile.gettempdir()) / f"slime-ray-{proc.pid}"
    assert ray_tmp.is_dir()
    os.killpg(proc.pid, signal.SIGTERM)  # every process of the group
    out = cli_runs.stop(proc, 0, 180)  # (signal 0: nothing more sent) wait for the end, read the rest
    text = "".join(lines) + out
    assert proc.returncode == 143, text[-4000:]
    assert "slime-train: terminated; everything started was stopped" in out, text[-4000:]
    assert "Failed to connect to GCS" not in text, text[-4000:]
    assert survivors(started, tmp_path) == []
    assert not ray_tmp.exists()
