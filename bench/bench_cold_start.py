"""Cold start: seconds from the `slime-rollout` command to the first sample served, with two
embedded engines (Ray start, placement group, engine processes loading the model, router,
registration, first rollout of one sample).

    python -m bench.bench_cold_start [--model default|tiny] [--runs 2]
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


def one_run(model_dir: str, data: Path) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1",
           "HF_ENDPOINT": "http://127.0.0.1:9"}
    cmd = [sys.executable, "-m", "slime", "--debug-rollout-only", "--rollout-backend", "hf", "--hf-checkpoint",
           model_dir, "--rollout-num-engines", "2", "--engine-threads", "1", "--prompt-data", str(data),
           "--rm-type", "exact", "--rollout-batch-size", "1", "--n-samples-per-prompt", "1",
           "--rollout-max-response-len", "1", "--num-rollout", "1"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)
    ready = first = None
    for line in proc.stdout:
        if line.startswith("router ") and ready is None:
            ready = time.perf_counter() - t0
        if line.startswith("rollout 0:"):
            first = time.perf_counter() - t0
    proc.wait()
    if first is None or proc.returncode != 0:
        raise SystemExit(f"cold start run failed (exit {proc.returncode})")
    return ready, first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["default", "tiny"], default="default")
    ap.add_argument("--runs", type=int, default=2)
    a = ap.parse_args()
    if a.model == "default":
        from slime.engine.default_model import ensure_default_model

        model_dir = str(ensure_default_model())
    else:
        from slime.testing.tiny_model import build_tiny_model

        model_dir = str(build_tiny_model(Path(tempfile.gettempdir()) / "slime-bench-tiny"))
    data = Path(tempfile.mkdtemp()) / "p.jsonl"
    data.write_text(json.dumps({"input": "Hello"}) + "\n")
    runs = [one_run(model_dir, data) for _ in range(a.runs)]
    print(f"model={a.model} ({model_dir}) engines=2 runs={a.runs}")
    print(f"command -> router+engines ready : {statistics.median(r[0] for r in runs):6.1f} s  "
          f"(runs: {', '.join(f'{r[0]:.1f}' for r in runs)})")
    print(f"command -> first sample served  : {statistics.median(r[1] for r in runs):6.1f} s  "
          f"(runs: {', '.join(f'{r[1]:.1f}' for r in runs)})")


if __name__ == "__main__":
    main()
