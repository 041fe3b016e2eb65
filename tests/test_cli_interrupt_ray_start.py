"""Issue 20 (a gap left): SIGTERM while `ray.init` runs. Ray installs SIGTERM handlers of its own
while it starts (a Python one that exits 15, and its core worker's native crash handler that aborts
with a stack dump); a command that re-installed its handler only after `ray.init` died of a SIGTERM
landing in between. The signal is sent by a hook on Ray's own start (no sleep): from inside `connect`
(Ray's core worker is up) and at the very end of `ray.init`. Either way the command exits 143 the
orderly way, and nothing it started is left running."""

from __future__ import annotations

import json

import pytest

from slime.testing.processes import survivors

# `python -c`: wrap one of Ray's start-up functions so that it SIGTERMs this process once it returns,
# then run `slime-rollout` as from a real command line (argv from sys.argv).
HOOKED_COMMAND = """
import functools, importlib, os, signal, sys
module_name, attr = sys.argv.pop(1).rsplit(".", 1)
module = importlib.import_module(module_name)
original = getattr(module, attr)

@functools.wraps(original)
def hooked(*args, **kwargs):
    result = original(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)
    print("hook: SIGTERM sent at the end of", module_name + "." + attr, flush=True)
    return result

setattr(module, attr, hooked)
from slime.cli.rollout import main
sys.exit(main())
"""


@pytest.mark.parametrize("window", ["ray._private.worker.connect", "ray.init"])
def test_sigterm_while_ray_starts_exits_143_and_stops_everything(window, tiny_model_dir, tmp_path, cli_runs):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"text": f"Solve {i}", "label": "x"}) + "\n" for i in range(4)))
    proc = cli_runs.start(["-c", HOOKED_COMMAND, window, "--rollout-backend", "hf",
                           "--hf-checkpoint", str(tiny_model_dir), "--prompt-data", str(data),
                           "--input-key", "text", "--label-key", "label", "--num-rollout", "1",
                           "--rollout-batch-size", "2", "--n-samples-per-prompt", "1",
                           "--rollout-max-response-len", "4", "--log-dir", str(tmp_path / "logs")], deadline=300)
    lines: list[str] = []
    cli_runs.read_until(proc, f"hook: SIGTERM sent at the end of {window}", lines)
    out = cli_runs.stop(proc, 0, 240)  # signal 0: the hook sent the real one; only wait for the end
    text = "".join(lines) + out
    assert proc.returncode == 143, text[-4000:]
    assert "slime-rollout: terminated; everything started was stopped" in out, text[-4000:]
    assert "SIGTERM received" not in text and "leftover" not in text, text[-4000:]
    assert survivors([], tmp_path) + survivors([], f"slime-ray-{proc.pid}") == []
