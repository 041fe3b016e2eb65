"""Issue 20: SIGTERM while the rollout manager loads a large prompt file. Before, a SIGTERM then
exited 130 (Ray's `ray.get` turns the signal's exception into a plain KeyboardInterrupt) and an
engine actor outlived the command. The signal is sent when the manager's own progress line says it
is tokenising the rows for the prompt-length limit (no sleep): the command exits 143, says so, and
nothing it started (Ray's processes, the manager, the engine, the router) is left running."""

from __future__ import annotations

import json
import signal

from slime.testing.processes import cmdline, descendants, survivors

ROWS = 100_000  # ~75 MB: the manager tokenises every row for the limit, for longer than a progress period


def test_sigterm_while_the_manager_loads_the_data_stops_everything(tiny_model_dir, tmp_path, cli_runs):
    data = tmp_path / "big.jsonl"
    data.write_text((json.dumps({"text": "Solve: " + "lorem ipsum dolor sit amet " * 26, "label": "x"}) + "\n") * ROWS)
    proc = cli_runs.start(
        [
            "-m",
            "slime",
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(data),
            "--input-key",
            "text",
            "--label-key",
            "label",
            "--rollout-max-prompt-len",
            "4096",
            "--num-rollout",
            "1",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "4",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        deadline=400,
    )
    lines: list[str] = []
    cli_runs.read_until(proc, f"prompt data {data}: tokenised", lines, anywhere=True)
    started = descendants(proc.pid)
    names = " ".join(cmdline(p) for p in started)
    for part in ("raylet", "gcs_server", "ray::RolloutManager"):
        assert part in names, (part, names[-3000:])
    out = cli_runs.stop(proc, signal.SIGTERM, 60)
    text = "".join(lines) + out
    assert proc.returncode == 143, text[-4000:]
    assert "slime-rollout: terminated; everything started was stopped" in out, text[-4000:]
    assert "leftover" not in out, text[-4000:]  # stopped in order, not by the exit hook
    assert survivors(started, tmp_path) == []
