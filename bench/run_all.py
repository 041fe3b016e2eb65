"""`make bench`: run every benchmark, one after the other on the same machine, and write
`bench/RESULTS.md` with each one's command and output.

    python -m bench.run_all [--only NAME ...]
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

BENCHMARKS = [
    ("Rollout orchestration overhead", ["-m", "bench.bench_rollout_overhead"]),
    ("Cold start", ["-m", "bench.bench_cold_start"]),
    ("Multi-turn", ["-m", "bench.bench_multi_turn"]),
    ("Rate limiter and sandbox", ["-m", "bench.bench_rate_limiter"]),
    ("Trainer batches", ["-m", "bench.bench_train_batch"]),
    ("Sandbox throughput", ["-m", "bench.bench_sandbox"]),
    ("Weight sync", ["-m", "bench.bench_weight_sync"]),
    ("Asynchronous rollout", ["-m", "bench.bench_async_rollout"]),
    ("Scale: 1 to 256 engines", ["-m", "bench.bench_scale"]),
    ("Prompt data loading", ["-m", "bench.bench_data_loading"]),
    ("Aborts at 1% engine errors", ["-m", "bench.bench_abort"]),
    ("Agent gateway", ["-m", "bench.bench_agent_gateway"]),
    ("Prompt encoding: shared pieces kept", ["-m", "bench.bench_prompt_encode"]),
    ("Sandbox API under a 26 MB body", ["-m", "bench.bench_sandbox_bodies"]),
    ("Engine forward: its own against transformers'", ["-m", "bench.bench_engine_forward"]),
]


def _sections(path: Path) -> dict[str, str]:
    """`## title` -> body of an existing RESULTS.md, so `--only` reruns keep the other results."""
    if not path.exists():
        return {}
    sections, title = {}, None
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith("## "):
            title = line[3:].strip()
            sections[title] = ""
        elif title is not None:
            sections[title] += line
    return sections


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None, help="substrings of benchmark titles")
    a = ap.parse_args()
    out = [
        "# Benchmark results",
        "",
        f"Written by `python -m bench.run_all` (`make bench`) on {time.strftime('%Y-%m-%d')}, "
        f"{platform.machine()}, {__import__('os').cpu_count()} cores, Python {platform.python_version()}. "
        "Each section gives the command that produced it; ratios are measured side by side in one run.",
        "",
    ]
    failed = []
    previous = _sections(ROOT / "bench" / "RESULTS.md")
    for title, cmd in BENCHMARKS:
        if a.only and not any(o.lower() in title.lower() for o in a.only):
            if title in previous:  # not rerun: keep its last result
                out += [f"## {title}", "", previous[title].strip(), ""]
            continue
        print(f"== {title}", flush=True)
        t = time.monotonic()
        proc = subprocess.run([sys.executable, *cmd], cwd=ROOT, capture_output=True, text=True)
        text = "\n".join(line for line in proc.stdout.splitlines() if line.strip())
        print(text, flush=True)
        if proc.returncode:
            failed.append(title)
            text += f"\n(exit {proc.returncode})\n" + proc.stderr[-2000:]
        out += [
            f"## {title}",
            "",
            f"`python {' '.join(cmd)}` ({time.monotonic() - t:.0f} s)",
            "",
            "```",
            text,
            "```",
            "",
        ]
    (ROOT / "bench" / "RESULTS.md").write_text("\n".join(out))
    if failed:
        sys.exit(f"benchmarks failed: {failed}")


if __name__ == "__main__":
    main()
