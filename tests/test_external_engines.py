"""slime's --rollout-external-engine-addrs: engines started elsewhere serve the rollout through our router, none of
ours is started; an address nothing answers at is refused before anything starts, naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from slime.testing.scripted_engine import ScriptedEngine
from slime.utils.misc import find_free_port

ROOT = Path(__file__).resolve().parents[1]


def rollout_argv(model_dir, tmp_path, *extra):
    return [
        sys.executable,
        "-m",
        "slime",
        "--debug-rollout-only",
        "--hf-checkpoint",
        str(model_dir),
        "--prompt-data",
        str(ROOT / "configs/demo/train.jsonl"),
        "--input-key",
        "messages",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rm-type",
        "gsm8k",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--num-rollout",
        "1",
        "--rollout-max-response-len",
        "8",
        "--log-dir",
        str(tmp_path / "logs"),
        *extra,
    ]


def run(argv):
    return subprocess.run(
        argv, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600
    )


def test_an_unreachable_external_engine_is_refused_before_ray_starts(tiny_model_dir, tmp_path):
    port = find_free_port()
    proc = run(rollout_argv(tiny_model_dir, tmp_path, "--rollout-external-engine-addrs", f"127.0.0.1:{port}"))
    assert proc.returncode != 0
    assert f"--rollout-external-engine-addrs: no engine answers at http://127.0.0.1:{port}" in proc.stderr
    assert "ray" not in proc.stderr.lower().replace("--rollout-external", "")  # refused before Ray said anything


@pytest.mark.slow
def test_the_external_engine_serves_every_request_and_none_of_ours_starts(tiny_model_dir, tmp_path):
    def script(body):
        return {"output_ids": [11, 12, 13], "finish_type": "stop", "text": ""}

    engine = ScriptedEngine(script, str(tiny_model_dir)).start()
    try:
        proc = run(
            rollout_argv(
                tiny_model_dir, tmp_path, "--rollout-external-engine-addrs", engine.url.removeprefix("http://")
            )
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "rollout 0: samples=4" in proc.stdout and "failed=0" in proc.stdout, proc.stdout[-2000:]
        # round robin over two workers would have sent this engine half: it is the only one
        assert len([r for r in engine.requests if "input_ids" in r or "text" in r]) == 4
    finally:
        engine.stop()


def test_slime_train_refuses_external_engines():
    from slime.cli.args import ArgError
    from slime.cli.train import parse_train_args

    with pytest.raises(ArgError, match="--rollout-external-engine-addrs with slime-train"):
        parse_train_args(["--rollout-external-engine-addrs", "127.0.0.1:30000"])
