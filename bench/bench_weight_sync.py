"""Weight sync: time of one push of SmolLM2-135M (float32) from a trainer process to 2 embedded
engines, through each path side by side in one run (rounds interleaved):

- tensor (shm):    update_weights_from_tensor, buckets packed once into /dev/shm, engines map and copy
- tensor (inline): the same by value (base64 in the HTTP body), 64 MB buckets
- distributed:     update_weights_from_distributed, gloo broadcast per tensor straight into the engines'
                   parameters (SGLang's default layout); "(flat)": 512 MB flattened buckets. Group set up once.
- distributed (before: 2 gloo threads): the same push to a second pair of engines whose weight-update
                   groups use gloo's default 2 worker threads per process (the setting before 8 became the default)
- disk:            trainer save_pretrained (safetensors) + update_weights_from_disk on both engines

Every push is bracketed by pause/continue (slime's order) and verified afterwards by
check_weights("compare", checksums) on both engines (not timed).

    python -m bench.bench_weight_sync [--rounds 3] [--model default|tiny] [--before-gloo-threads 2]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@contextlib.contextmanager
def _env(name: str, value: str):
    """`name=value` in this process's environment for the block (engines copy it when built)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", choices=["default", "tiny"], default="default")
    ap.add_argument("--before-gloo-threads", type=int, default=2,
                    help="gloo threads of the 'before' distributed row (gloo's default, what slime used before)")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from slime.engine.weight_sync import (
        WeightUpdateGroup, model_checksums, on_all_engines, paused, push_tensors, trainer_named_tensors,
    )
    from slime.engine.weight_updates import GLOO_THREADS_ENV, gloo_threads
    from slime.fleet.engine_actor import EngineActor

    if a.model == "default":
        from slime.engine.default_model import ensure_default_model

        model_dir = ensure_default_model()
    else:
        from slime.testing.tiny_model import build_tiny_model

        model_dir = build_tiny_model(Path(tempfile.gettempdir()) / "slime-bench-tiny")
    work = Path(tempfile.mkdtemp(prefix="slime-bench-weights-"))
    trainer = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    named = trainer_named_tensors(trainer)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    args = SimpleNamespace(engine_host="127.0.0.1", rollout_backend="hf", hf_checkpoint=str(model_dir),
                           engine_max_batch_size=8, engine_threads=1, engine_startup_timeout=300, log_dir=str(work))
    engines = [EngineActor(args, rank=i) for i in range(2)]
    before = f"distributed (before: {a.before_gloo_threads} gloo threads)"
    with _env(GLOO_THREADS_ENV, str(a.before_gloo_threads)):  # a second pair of engines, as before the change
        engines_before = [EngineActor(args, rank=2 + i) for i in range(2)]
    times: dict[str, list[float]] = {"tensor (shm)": [], "tensor (inline)": [], "distributed": [], before: [],
                                     "distributed (flat)": [], "disk": []}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        for e in engines + engines_before:
            stack.callback(e.stop)
            e.start()
        t = time.perf_counter()
        group = stack.enter_context(WeightUpdateGroup(engines, group_name="bench", timeout=300))
        connect_s = time.perf_counter() - t
        with _env(GLOO_THREADS_ENV, str(a.before_gloo_threads)):
            group_before = stack.enter_context(WeightUpdateGroup(engines_before, group_name="bench", timeout=300))
        version = 0
        split: list[dict] = []  # where each distributed push's time went
        for _ in range(a.rounds):
            for path in times:
                version += 1
                with torch.no_grad():  # a real change every push: the trainer took a step
                    trainer.model.norm.weight.add_(1e-3)
                t = time.perf_counter()
                if path == "disk":
                    ckpt = work / f"ckpt-{version}"
                    trainer.save_pretrained(str(ckpt))
                    on_all_engines(engines, "update_weights_from_disk", model_path=str(ckpt), weight_version=str(version))
                elif path == before:
                    with paused(engines_before):
                        group_before.push(named, weight_version=str(version))
                else:
                    with paused(engines):
                        if path.startswith("distributed"):
                            group.push(named, weight_version=str(version),
                                       load_format="flattened_bucket" if "flat" in path else None)
                        else:
                            inline = path == "tensor (inline)"
                            push_tensors(engines, named, weight_version=str(version),
                                         transport="inline" if inline else "shm",
                                         **({"bucket_bytes": 64 << 20} if inline else {}))
                times[path].append(time.perf_counter() - t)
                if path == "distributed":
                    split.append({**group.last_push_seconds, "push": times[path][-1]})
                expected = model_checksums(trainer)
                pushed_to = engines_before if path == before else engines
                for answer in on_all_engines(pushed_to, "check_weights", action="compare", checksums=expected):
                    assert answer["equal"], f"{path}: {answer['message']}"
                assert {e.get_weight_version() for e in pushed_to} == {str(version)}
                if path == "disk":
                    shutil.rmtree(work / f"ckpt-{version}")

    name = "SmolLM2-135M-Instruct" if a.model == "default" else "tiny"
    print(f"model={name} float32 {nbytes / 1e9:.3f} GB ({len(named)} tensors), engines=2, rounds={a.rounds}, "
          f"interleaved; median of rounds; GB/s = model bytes / push time (each engine receives all of them)")
    print("| path | push s (median) | GB/s | rounds s |")
    print("|---|---:|---:|---|")
    med = {p: statistics.median(v) for p, v in times.items()}
    for p, v in times.items():
        print(f"| {p} | {med[p]:.2f} | {nbytes / 1e9 / med[p]:.2f} | {', '.join(f'{x:.2f}' for x in v)} |")
    print(f"distributed group set-up (once per trainer/engine set): {connect_s:.2f} s")
    part = {k: statistics.median(d[k] for d in split) for k in ("push", "broadcast", "answers", "total")}
    print(f"distributed push, where the time goes (median): rank 0's gloo broadcasts {part['broadcast']:.3f} s "
          f"({100 * part['broadcast'] / part['push']:.0f}%), engines' answers after the last byte "
          f"{part['answers']:.3f} s, pause + continue + bucketing {part['push'] - part['broadcast'] - part['answers']:.3f} s")
    ratio = med["disk"] / med["distributed"]
    print(f"gloo threads per process: {gloo_threads()} (${GLOO_THREADS_ENV}); '{before}' pushes the same weights "
          f"to a second pair of engines whose groups use {a.before_gloo_threads} (gloo's default): "
          f"{med['disk'] / med[before]:.1f}x vs disk")
    print(f"speed-up vs disk: distributed {ratio:.1f}x (goal >= 3x), tensor (shm) "
          f"{med['disk'] / med['tensor (shm)']:.1f}x; every push verified equal by checksum on both engines")


if __name__ == "__main__":
    main()
