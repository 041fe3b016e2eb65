"""Encoding a prompt's text to ids: the Rust tokenizer on the whole text against `SegmentEncoder` (the long pieces
between added tokens met before kept), side by side in one process, on the Qwen3 tokenizer.

    python -m bench.bench_prompt_encode [--tasks 200] [--turns 32]

Cases, CPU microseconds per encode (the thread's CPU clock, medians of 5 rounds):
- `first prompt`: an agent's first prompt, rendered by the chat template: a ~1,000-token system message and six tool
  schemas every task of the run shares, then the task's own ~150 tokens; each encode a new task.
- `whole history`: a conversation of `--turns` turns with 4 kB tool results rendered whole again, one turn longer each
  time (what a gateway does when a client edits or compacts its history, and `FullRender` every turn).
- `tool result turn`: what a turn appends after a tool call: the template's delta around a 4 kB tool result, each
  a different 4 kB of this repository's Python source (as an agent reading files gets; met once, so nothing is
  kept for it: encoded word by word, `WordEncoder`).
- `short prompt`: a one-line first prompt (no piece long enough to keep: the encoder's cost of looking).
Each case also checks the ids are the library's own.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("SLIME_BENCH_TREE", str(ROOT)))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from bench.bench_agent_gateway import AGENT_TOOLS, agent_task, tool_result  # noqa: E402
from slime.tools.chat_format import ChatDelta  # noqa: E402
from slime.tools.segment_encoder import SegmentEncoder  # noqa: E402


def history(turns: int) -> list[dict]:
    msgs = agent_task("hist", 0)
    for k in range(turns):
        call = {"type": "function", "function": {"name": "read_file", "arguments": {"path": f"src/m{k}.py"}}}
        msgs += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": tool_result(k)},
        ]
    return msgs


def source_chunks(n: int, size: int = 4096) -> list[str]:
    """`n` distinct 4 kB stretches of this repository's Python source, plain ASCII as most tool results are."""
    chunks = []
    for path in sorted((ROOT / "slime").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if not text.isascii():
            continue
        chunks += [text[i : i + size] for i in range(0, len(text) - size + 1, size)]
        if len(chunks) >= n:
            return chunks[:n]
    return chunks


def per_encode(encode, texts: list[str]) -> float:
    """CPU us per text, each text encoded once, in order (short texts: the list ten times over)."""
    repeat = 10 if len(texts[0]) < 1000 else 1
    t = time.thread_time()
    for _ in range(repeat):
        for text in texts:
            encode(text)
    return (time.thread_time() - t) / (len(texts) * repeat) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--turns", type=int, default=32)
    a = ap.parse_args()
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    delta = ChatDelta(tok)
    backend = tok._tokenizer
    cases = {
        "first prompt": [delta.render(agent_task("enc", i), AGENT_TOOLS, True) for i in range(a.tasks)],
        "whole history": [delta.render(history(k), AGENT_TOOLS, True) for k in range(1, a.turns + 1)],
        "tool result turn": [
            "<|im_end|>\n<|im_start|>user\n<tool_response>\n" + chunk + "\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n"
            for chunk in source_chunks(a.tasks)
        ],
        "short prompt": [delta.render([{"role": "user", "content": f"hello {i}"}], None, True) for i in range(a.tasks)],
    }
    print(
        f"prompt encoding, Qwen3 tokenizer: CPU us per encode (median of 5 rounds, "
        f"alternating; each round a fresh encoder, whose first text of a kind is a miss); {a.tasks} tasks, histories of 1..{a.turns} turns with 4 kB tool results"
    )
    print("| case | tokens (mean) | whole text (Rust tokenizer) | SegmentEncoder | ratio |")
    print("|---|---:|---:|---:|---:|")
    for name, texts in cases.items():
        whole_times, kept_times = [], []
        for _ in range(5):  # rounds alternate, so both see the box's load alike
            whole_times.append(per_encode(lambda t: backend.encode(t, add_special_tokens=False).ids, texts))
            fresh = SegmentEncoder.of(backend)  # (its start-up probes are not timed)
            kept_times.append(per_encode(fresh.encode, texts))
        whole, kept = statistics.median(whole_times), statistics.median(kept_times)
        encoder = SegmentEncoder.of(backend)
        for text in texts:
            if encoder.encode(text) != backend.encode(text, add_special_tokens=False).ids:
                raise SystemExit(f"{name}: SegmentEncoder's ids differ from the library's")
        tokens = statistics.mean(len(backend.encode(t, add_special_tokens=False).ids) for t in texts)
        print(f"| {name} | {tokens:.0f} | {whole:.1f} | {kept:.1f} | {whole / kept:.2f}x |")


if __name__ == "__main__":
    main()
