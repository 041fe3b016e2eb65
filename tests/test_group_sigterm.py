"""SIGTERM to `slime-train`'s whole process group, as `kill -TERM -PGID` and job runners send it,
mid-run: the same orderly stop as a SIGTERM to the command alone (143, our stop line, nothing left,
Ray's temp dir and the weight ring in /dev/shm removed). Before, Ray's GCS and raylet were in the group
and died of the signal; the stop waited 60 s for them and Ray's "Failed to connect to GCS within 60
seconds" ended it (rc 1). Now a private Ray's processes lead sessions of their own, out of the group
(`slime.ray.process_keeper`); the SIGKILL case is tests/test_fleet_faults.py's.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

from slime.weights.transfer import SHM_PREFIX, shm_dir
from slime.testing.processes import cmdline, descendants, survivors

RAY_PARTS = ("raylet", "gcs_server", "ray::RolloutManager", "ray::TrainWorker")


def _argv(tmp_path: Path, model: Path) -> list[str]:
    rows = [{"messages": [{"role": "user", "content": f"Count to {i}."}], "label": ""} for i in range(32)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [
        "-m",
        "slime.train",
        "--rollout-backend",
        "hf",
        "--hf-checkpoint",
        str(model),
        "--prompt-data",
        str(tmp_path / "train.jsonl"),
        "--input-key",
        "messages",
        "--label-key",
        "label",
        "--apply-chat-template",
        "--rollout-num-engines",
        "1",
        "--rollout-num-cpus-per-engine",
        "0.5",
        "--engine-threads",
        "1",
        "--actor-num-workers",
        "1",
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


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:  # ended meanwhile
        return None


def test_sigterm_to_the_process_group_mid_run_stops_in_order(tiny_model_dir, tmp_path, cli_runs):
    """Sent as "trainer:" is printed: the first weight push, then the first rollout, are under way. Where
    Ray's processes are (not in the command's group) is the same in every phase."""
    proc = cli_runs.start(_argv(tmp_path, tiny_model_dir), deadline=300)  # its own session: the group is its own
    lines: list[str] = []
    cli_runs.read_until(proc, "trainer:", lines)
    started = descendants(proc.pid)
    ray = [p for p in started if any(part in cmdline(p) for part in RAY_PARTS)]
    names = " ".join(cmdline(p) for p in ray)
    for part in RAY_PARTS:
        assert part in names, (part, names[-3000:])
    in_group = [cmdline(p) for p in ray if _group_of(p.pid) == proc.pid]  # asserted after the outcome
    ray_tmp = Path(tempfile.gettempdir()) / f"slime-ray-{proc.pid}"
    assert ray_tmp.is_dir()
    pids = {proc.pid, *(p.pid for p in started)}
    os.killpg(proc.pid, signal.SIGTERM)  # every process of the group
    out = cli_runs.stop(proc, 0, 240)  # (signal 0: nothing more sent) wait for the end, read the rest
    text = "".join(lines) + out
    assert proc.returncode == 143, text[-4000:]
    assert "slime-train: terminated; everything started was stopped" in out, text[-4000:]
    assert "Failed to connect to GCS" not in text and "leftover" not in text, text[-4000:]
    assert in_group == []  # the group signal did not reach them
    assert survivors(started, tmp_path, timeout=30) == []
    assert not ray_tmp.exists()
    owners = {p.name: p.name[len(SHM_PREFIX) :].split("-")[0] for p in shm_dir().glob(f"{SHM_PREFIX}*")}
    rings = [name for name, owner in owners.items() if owner.isdigit() and int(owner) in pids]  # slime-weights-<pid>-*
    assert rings == []
    assert list(Path(tempfile.gettempdir()).glob(f"slime-fork-{proc.pid}-*")) == []
