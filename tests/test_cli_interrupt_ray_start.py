"""Issue 20 (a gap left): SIGTERM while `ray.init` runs. Ray installs SIGTERM handlers of its own
while it starts (a Python one that exits 15, and its core worker's native crash handler that aborts
with a stack dump); a command that re-installed its handler only after `ray.init` died of a SIGTERM
landing in between. The signal is sent by a hook on Ray's own start (no sleep): from inside `ray.init`,
once `connect` returned (Ray's Python handler and its core worker's native one are both installed by
then, and the rest of `ray.init` still runs). The command exits 143 the orderly way, and nothing it
started is left running. (One command is enough: both start Ray through `slime.ray.session.ray_init`.)"""

from __future__ import annotations

import json
import os
import signal
import sys

from slime.ray.keep_sigterm import keep_sigterm_handler
from slime.testing.processes import survivors

# `python -c`: wrap one of Ray's start-up functions so that it SIGTERMs this process once it returns,
# then run a command's `main()` as from a real command line (argv from sys.argv).
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
command = importlib.import_module(sys.argv.pop(1))
sys.exit(command.main())
"""


def test_sigterm_while_ray_starts_exits_143_and_stops_everything(tiny_model_dir, tmp_path, cli_runs):
    window, command, prog = "ray._private.worker.connect", "slime.cli.train", "slime-train"
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"text": f"Solve {i}", "label": "x"}) + "\n" for i in range(4)))
    proc = cli_runs.start(
        [
            "-c",
            HOOKED_COMMAND,
            window,
            command,
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
            "--num-rollout",
            "1",
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "1",
            "--rollout-max-response-len",
            "4",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        deadline=300,
    )
    lines: list[str] = []
    cli_runs.read_until(proc, f"hook: SIGTERM sent at the end of {window}", lines)
    out = cli_runs.stop(proc, 0, 240)  # signal 0: the hook sent the real one; only wait for the end
    text = "".join(lines) + out
    assert proc.returncode == 143, text[-4000:]
    assert f"{prog}: terminated; everything started was stopped" in out, text[-4000:]
    assert "SIGTERM received" not in text and "leftover" not in text, text[-4000:]
    assert survivors([], tmp_path) + survivors([], f"slime-ray-{proc.pid}") == []


def test_inside_the_block_ray_cannot_replace_the_handler_and_a_sigterm_waits_for_its_end():
    import ray._private.ray_constants as ray_constants
    import ray._private.utils as ray_utils

    seen: list[int] = []

    def ours(signum, frame):
        seen.append(signum)

    install, native_off = ray_utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    before = signal.signal(signal.SIGTERM, ours)
    try:
        with keep_sigterm_handler():
            ray_utils.set_sigterm_handler(lambda signum, frame: sys.exit(signum))  # what ray.init does
            assert ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER is True  # no native handler for this driver
            os.kill(os.getpid(), signal.SIGTERM)  # Ray's handler would exit 15 here
            assert seen == []  # held while Ray starts
        assert seen == [signal.SIGTERM]  # then handed, once, to the handler from before
        assert signal.getsignal(signal.SIGTERM) is ours
        restored = ray_utils.set_sigterm_handler, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
        assert restored == (install, native_off)
    finally:
        signal.signal(signal.SIGTERM, before)
