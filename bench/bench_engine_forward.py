"""The embedded engine's model: its own forward (slime.engine.decoder_lm) against transformers' class, side by side.

Both load the same checkpoint in one process and run what the engine's decode thread runs: each prompt's solo
prefill, then decode steps of the left-padded running batch (`RunningBatch`). Rounds alternate the two models.
Printed: ms per decode step (median of rounds, and each round), ms per prefill, and the load time of each, with
one torch thread as the engine uses by default. The logits of the two agree (tests/test_decoder_lm.py); this says
what the forward costs.

    python -m bench.bench_engine_forward [--model default|PATH] [--rows 1,8] [--steps 32] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def decode_ms(model, rows: int, steps: int, prompt_len: int, vocab: int) -> tuple[float, float]:
    """(ms per decode step of `rows` rows, ms per prefill): a running batch as the decode thread runs it."""
    import torch

    from slime.engine.running_batch import RunningBatch

    g = torch.Generator().manual_seed(0)
    batch, prefill = RunningBatch(), 0.0
    with torch.no_grad():
        for r in range(rows):
            ids = torch.randint(0, vocab, (1, prompt_len + 7 * r), generator=g)
            t = time.perf_counter()
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            prefill += time.perf_counter() - t
            req = SimpleNamespace(done=False, position_delta=0)
            batch.add(req, out.past_key_values, ids.shape[1], int(out.logits[0, -1].argmax()))
        t = time.perf_counter()
        for _ in range(steps):
            batch.pending = batch.forward(model).argmax(-1)
        return (time.perf_counter() - t) / steps * 1e3, prefill / rows * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="default", help="a checkpoint directory, or `default` (SmolLM2-135M)")
    ap.add_argument("--rows", default="1,8", type=lambda v: [int(x) for x in v.split(",")])
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from slime.engine.decoder_lm import load_decoder_lm
    from slime.engine.default_model import ensure_default_model

    torch.set_num_threads(1)
    path = str(ensure_default_model()) if a.model == "default" else a.model
    t = time.perf_counter()
    ours, why = load_decoder_lm(path, torch.float32)
    load_ours = time.perf_counter() - t
    if ours is None:
        raise SystemExit(f"{path}: not served by the engine's own forward ({why})")
    t = time.perf_counter()
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    load_theirs = time.perf_counter() - t
    vocab = ours.cfg.vocab_size
    print(f"{path}: one torch thread, {a.steps} decode steps after each row's prefill ({a.prompt_len}+ tokens)")
    print(
        f"load: own forward {load_ours:.2f} s, transformers {load_theirs:.2f} s "
        "(each first in this process: its imports included)"
    )
    for rows in a.rows:
        runs: dict[str, list[tuple[float, float]]] = {"own forward": [], "transformers": []}
        for _ in range(a.rounds):
            for name, model in (("own forward", ours), ("transformers", theirs)):
                runs[name].append(decode_ms(model, rows, a.steps, a.prompt_len, vocab))
        med = {k: statistics.median(s for s, _ in v) for k, v in runs.items()}
        for name, v in runs.items():
            rounds = ", ".join(f"{s:.1f}" for s, _ in v)
            prefill = statistics.median(p for _, p in v)
            print(f"  {rows} row(s), {name:12s}: {med[name]:7.1f} ms/step (rounds {rounds}); prefill {prefill:.1f} ms")
        print(f"  {rows} row(s), own / transformers: {med['own forward'] / med['transformers']:.2f}x")


if __name__ == "__main__":
    main()
