"""Ctrl-C in the middle of a `slime-train` step (issue 13): the command exits with the orderly-stop
code (130) and nothing it started survives: trainer workers, engine servers, the router, Ray's
workers, raylet and GCS. The interrupt is sent when the output says the first step is under way (no
sleep): right after "trainer: ..." the trainer's rank 0 pushes the initial weights, then rollout 0
is generated and trained. (Interrupting after "rollout 0: ..." was checked too; one case keeps the
suite short.)
"""

from __future__ import annotations

import json
import signal

from slime.testing.processes import cmdline, descendants, survivors


def test_ctrl_c_mid_step_stops_everything(tiny_model_dir, tmp_path, cli_runs):
    when = "trainer:"
    rows = [{"messages": [{"role": "user", "content": f"Count to {i}."}], "label": ""} for i in range(32)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = [
        "-m",
        "slime.train",
        "--rollout-backend",
        "hf",
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(tmp_path / "train.jsonl"),
        "--input-key",
        "messages",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-num-engines",
        "2",
        "--rollout-num-cpus-per-engine",
        "0.5",
        "--engine-threads",
        "1",
        "--actor-num-workers",
        "2",
        "--actor-num-cpus-per-worker",
        "0.5",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--rollout-max-response-len",
        "6",
        "--global-batch-size",
        "4",
        "--micro-batch-size",
        "2",
        "--lr",
        "1e-3",
        "--custom-rm-path",
        "tests.plugins.train_rewards.even_token_fraction",
        "--num-rollout",
        "100000",
        "--log-dir",
        str(tmp_path / "logs"),
    ]
    proc = cli_runs.start(argv, deadline=360)
    lines: list[str] = []
    cli_runs.read_until(proc, when, lines)
    started = descendants(proc.pid)
    names = " ".join(cmdline(p) for p in started)
    for part in ("raylet", "gcs_server", "ray::RolloutManager", "ray::TrainWorker", "router"):
        assert part in names, (part, names[-3000:])
    assert len(started) >= 8, names[-3000:]  # plus the engine servers and Ray's agents
    out = cli_runs.stop(proc, signal.SIGINT, 180)
    text = "".join(lines) + out
    assert proc.returncode == 130, text[-4000:]
    assert "interrupted" in out, text[-4000:]
    assert survivors(started, tmp_path) == []
