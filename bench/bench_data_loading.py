"""Prompt data loading: peak RSS and time to the first batch against the file's size (issue 20, item 14).

Generates chat-message JSONL files (about 1 KB a row, like the issue's 200 MB / 214k-prompt file),
then in a fresh process per measurement builds what the rollout manager builds at start
(`DataSource.from_args` with --apply-chat-template and the tiny model's real Qwen3 tokenizer) and
takes the first batch of groups (`get_samples`). Reported: the process's peak RSS (VmHWM, reset
after the imports and the tokenizer's load) and how far above that baseline it went, seconds to
the first batch. "before" is the same
measurement on another tree (default: main, which read and templated every row at start); it runs
on the smallest size only unless asked (it held every prompt as objects: ~2.5 GB at 200 MB).
The preflight check of a file (every row rendered and tokenised, one at a time) is measured too.
With a prompt-length limit, the manager's start is measured alone (it tokenises every row to filter)
and after the command's preflight, which hands it the rows it dropped (each row tokenised once).

    python -m bench.bench_data_loading [--sizes-mb 20 200] [--before REF|none] [--before-sizes-mb 20]
                                       [--limit-mb 20] [--preflight-mb 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROW_BYTES = 980  # about the 200 MB / 214k rows

CHILD = r"""
import json, sys, time
from types import SimpleNamespace
mode, data, model = sys.argv[1], sys.argv[2], sys.argv[3]
from slime.rollout.data_source import DataSource
from slime.utils.processing_utils import load_tokenizer
tok = load_tokenizer(model)
args = SimpleNamespace(prompt_data=data, input_key="messages", label_key="label", apply_chat_template=True,
                       apply_chat_template_kwargs={}, rollout_max_prompt_len=None, rollout_max_context_len=None,
                       metadata_key=None, tool_key=None, n_samples_per_prompt=8, rollout_shuffle=True,
                       rollout_seed=42, buffer_filter_path=None, over_long_prompt="filter")
def status_kb(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1])
if mode.startswith("manager-limit"):  # over-long prompts filtered at start, as slime does
    args.rollout_max_prompt_len = 4096
if mode == "manager-limit-carried":  # the command's way: preflight filtered first, the manager reuses its rows
    from slime.cli.preflight import check_prompt_file
    check_prompt_file(args, "--prompt-data", data, "messages", "label", tok)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak (VmHWM): the tokenizer's own load peak is not the data's
base = status_kb("VmRSS")
t0 = time.monotonic()
if mode.startswith("manager"):
    source = DataSource.from_args(args, tok)
    groups = source.get_samples(32)
    n = len(source)
else:
    from slime.cli.preflight import check_prompt_file
    n = check_prompt_file(args, "--prompt-data", data, "messages", "label", tok)
seconds = time.monotonic() - t0
peak = status_kb("VmHWM")
print(json.dumps({"rows": n, "seconds": seconds, "base_mb": base / 1024, "peak_mb": peak / 1024}))
"""


def make_file(path: Path, megabytes: int) -> int:
    """A chat JSONL of about `megabytes` MB; returns the rows written."""
    rows = megabytes * (1 << 20) // ROW_BYTES
    filler = "lorem ipsum dolor sit amet " * 30
    with open(path, "w") as f:
        for i in range(rows):
            f.write(
                json.dumps(
                    {
                        "messages": [
                            {"role": "system", "content": "You are a careful solver."},
                            {"role": "user", "content": f"Problem {i}: {filler[:800]}"},
                        ],
                        "label": str(i % 97),
                    }
                )
                + "\n"
            )
    return rows


def measure(tree: Path, mode: str, data: Path, model: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(data), str(model)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = out.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    result["progress_lines"] = sum(1 for line in lines if line.startswith("prompt data "))
    return result


def export_tree(ref: str, into: Path) -> Path:
    tree = into / f"tree-{ref}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def line(label: str, size_mb: int, r: dict) -> str:
    return (
        f"{label:<26} {size_mb:>5} MB {r['rows']:>8} rows  peak RSS {r['peak_mb']:7.0f} MB "
        f"(+{r['peak_mb'] - r['base_mb']:6.0f} MB over baseline {r['base_mb']:4.0f})  "
        f"{r['seconds']:7.1f} s" + (f"  progress lines {r['progress_lines']}" if r["progress_lines"] else "")
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", type=int, nargs="*", default=[20, 200])
    ap.add_argument("--before", default="main", help="git ref of the tree to compare with, or none")
    ap.add_argument("--before-sizes-mb", type=int, nargs="*", default=[20])
    ap.add_argument(
        "--limit-mb",
        type=int,
        nargs="*",
        default=[20],
        help="sizes loaded with --rollout-max-prompt-len (the manager tokenises every row at start)",
    )
    ap.add_argument("--preflight-mb", type=int, nargs="*", default=[20])
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from slime.testing.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = build_tiny_model(tmp / "model")
        sizes = sorted(set(a.sizes_mb) | set(a.before_sizes_mb) | set(a.preflight_mb) | set(a.limit_mb))
        files = {}
        for mb in sizes:
            files[mb] = tmp / f"data_{mb}mb.jsonl"
            make_file(files[mb], mb)
        before = export_tree(a.before, tmp) if a.before != "none" else None
        print("manager start: DataSource.from_args + first get_samples(32 groups), --apply-chat-template", flush=True)
        for mb in sizes:
            if mb in a.sizes_mb:
                print(line("after (indexed)", mb, measure(ROOT, "manager", files[mb], model)), flush=True)
            if mb in a.limit_mb:  # the manager alone tokenises every row; after preflight it reuses its rows
                print(line("limit, manager alone", mb, measure(ROOT, "manager-limit", files[mb], model)), flush=True)
                print(
                    line("limit, after preflight", mb, measure(ROOT, "manager-limit-carried", files[mb], model)),
                    flush=True,
                )
            if before is not None and mb in a.before_sizes_mb:
                print(
                    line(f"before ({a.before}, whole file)", mb, measure(before, "manager", files[mb], model)),
                    flush=True,
                )
        if a.preflight_mb:
            print("preflight: every row rendered and tokenised, one at a time", flush=True)
        for mb in a.preflight_mb:
            print(line("preflight check", mb, measure(ROOT, "preflight", files[mb], model)), flush=True)


if __name__ == "__main__":
    main()
