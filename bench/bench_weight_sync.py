"""Weight sync: time of one push of SmolLM2-135M (float32) from a trainer process to 2 embedded
engines, through each path side by side in one run (rounds interleaved):

- tensor (shm):    update_weights_from_tensor, buckets packed once into /dev/shm, engines map and copy
- tensor (inline): the same by value (base64 in the HTTP body), 64 MB buckets
- distributed (shm ring): update_weights_from_distributed over a gloo group whose bytes travel through the
                   shared-memory ring (rank 0 copies each chunk once into a slot, each engine copies it once
                   into its parameters; gloo carries only per-chunk handshakes). Group set up once.
- distributed (broadcast): the same group forced to gloo broadcasts over loopback TCP, one per tensor
                   straight into the engines' parameters (SGLang's default layout, slime's path across hosts);
                   "(flat)": 512 MB flattened buckets
- disk:            trainer save_pretrained (safetensors) + update_weights_from_disk on both engines

Every push is bracketed by pause/continue (slime's order) and verified afterwards by
check_weights("compare", checksums) on both engines (not timed). A memcpy of the model's bytes (the floor of
one copy) is timed in the same rounds.

    python -m bench.bench_weight_sync [--rounds 3] [--model default|tiny] [--ring-slots 4] [--ring-slot-mb 64]
        [--paths "disk,tensor (shm),..."]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", choices=["default", "tiny"], default="default")
    ap.add_argument("--ring-slots", type=int, default=None, help="slots of the shared-memory ring (default 4)")
    ap.add_argument("--ring-slot-mb", type=int, default=None, help="MiB per ring slot (default 64)")
    ap.add_argument("--paths", default="", help="comma-separated subset of the rows (default: all)")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from slime.weights.ring import DEFAULT_SLOT_BYTES, DEFAULT_SLOTS
    from slime.weights.push import (
        WeightUpdateGroup,
        model_checksums,
        on_all_engines,
        paused,
        push_tensors,
        trainer_named_tensors,
    )
    from slime.cli.finalize import complete_namespace
    from slime.fleet.engine_actor import EngineActor
    from slime.fleet.flags import EngineConfig

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
    args = SimpleNamespace(
        engine_host="127.0.0.1",
        rollout_backend="hf",
        hf_checkpoint=str(model_dir),
        engine_max_batch_size=8,
        engine_threads=1,
        engine_startup_timeout=300,
        log_dir=str(work),
    )
    engines = [EngineActor(EngineConfig.from_args(complete_namespace(args)), rank=i) for i in range(2)]
    ring = {
        "ring_slots": a.ring_slots or DEFAULT_SLOTS,
        "ring_slot_bytes": (a.ring_slot_mb << 20) if a.ring_slot_mb else DEFAULT_SLOT_BYTES,
    }
    rows = [
        "memcpy (floor: one copy)",
        "tensor (shm)",
        "tensor (inline)",
        "distributed (shm ring)",
        "distributed (broadcast)",
        "distributed (broadcast flat)",
        "disk",
    ]
    wanted = [p.strip() for p in a.paths.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in rows]
    if unknown:
        ap.error(f"--paths: unknown {unknown}; rows are {rows}")
    times: dict[str, list[float]] = {p: [] for p in rows if not wanted or p in wanted}
    flat_src = torch.cat([t.reshape(-1).view(torch.uint8) for _, t in named])
    flat_dst = torch.empty_like(flat_src)
    split: dict[str, list[dict]] = {}  # where each distributed push's time went
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        for e in engines:
            stack.callback(e.stop)
            e.start()
        t = time.perf_counter()
        ring_group = stack.enter_context(WeightUpdateGroup(engines, group_name="bench-ring", timeout=300, **ring))
        connect_s = time.perf_counter() - t
        assert ring_group.transport == "shm_ring", ring_group.transport_reason
        bcast_group = stack.enter_context(
            WeightUpdateGroup(engines, group_name="bench-bcast", timeout=300, transport="broadcast")
        )
        version = 0
        for _ in range(a.rounds):
            for path in times:
                version += 1
                with torch.no_grad():  # a real change every push: the trainer took a step
                    trainer.model.norm.weight.add_(1e-3)
                t = time.perf_counter()
                if path.startswith("memcpy"):
                    flat_dst.copy_(flat_src)
                    times[path].append(time.perf_counter() - t)
                    continue
                if path == "disk":
                    ckpt = work / f"ckpt-{version}"
                    trainer.save_pretrained(str(ckpt))
                    on_all_engines(
                        engines, "update_weights_from_disk", model_path=str(ckpt), weight_version=str(version)
                    )
                else:
                    with paused(engines):
                        if path.startswith("distributed"):
                            group = ring_group if "ring" in path else bcast_group
                            group.push(
                                named,
                                weight_version=str(version),
                                load_format="flattened_bucket" if "flat" in path else None,
                            )
                        else:
                            inline = path == "tensor (inline)"
                            push_tensors(
                                engines,
                                named,
                                weight_version=str(version),
                                transport="inline" if inline else "shm",
                                **({"bucket_bytes": 64 << 20} if inline else {}),
                            )
                times[path].append(time.perf_counter() - t)
                if path.startswith("distributed"):
                    split.setdefault(path, []).append({**group.last_push_seconds, "push": times[path][-1]})
                expected = model_checksums(trainer)
                for answer in on_all_engines(engines, "check_weights", action="compare", checksums=expected):
                    assert answer["equal"], f"{path}: {answer['message']}"
                assert {e.get_weight_version() for e in engines} == {str(version)}
                if path == "disk":
                    shutil.rmtree(work / f"ckpt-{version}")

    name = "SmolLM2-135M-Instruct" if a.model == "default" else "tiny"
    print(
        f"model={name} float32 {nbytes / 1e9:.3f} GB ({len(named)} tensors), engines=2, rounds={a.rounds}, "
        f"interleaved; median of rounds; GB/s = model bytes / push time (each engine receives all of them)"
    )
    print("| path | push s (median) | GB/s | rounds s |")
    print("|---|---:|---:|---|")
    med = {p: statistics.median(v) for p, v in times.items()}
    for p, v in times.items():
        print(f"| {p} | {med[p]:.2f} | {nbytes / 1e9 / med[p]:.2f} | {', '.join(f'{x:.2f}' for x in v)} |")
    print(
        f"ring: {ring['ring_slots']} slots x {ring['ring_slot_bytes'] >> 20} MiB; distributed group set-up "
        f"(once per trainer/engine set, ring included): {connect_s:.2f} s"
    )
    for path, parts in split.items():
        part = {k: statistics.median(d[k] for d in parts) for k in ("push", "collectives", "copy", "answers")}
        print(
            f"{path}, where the time goes (median): rank 0 waiting on collectives {part['collectives']:.3f} s, "
            f"rank 0 copying into the ring {part['copy']:.3f} s, last answers {part['answers']:.3f} s, "
            f"pause + continue + rest {part['push'] - part['collectives'] - part['copy'] - part['answers']:.3f} s"
        )
    if "disk" in med:
        ratios = ", ".join(
            f"{p} {med['disk'] / med[p]:.1f}x" for p in med if p not in ("disk",) and not p.startswith("memcpy")
        )
        print(
            f"speed-up vs disk: {ratios} (goal: distributed >= 3x); every push verified equal by checksum "
            "on both engines"
        )


if __name__ == "__main__":
    main()
