"""Trainer batches: what a rollout of 1,024 samples x 2,048 tokens costs to convert, schedule,
tensorise and `ray.put` (one put per DP rank), for dp_size 1, 2 and 8, side by side with one plain
`ray.put` of the same tensors (the floor any object-store transport pays).

    python -m bench.bench_train_batch [--samples 1024] [--tokens 2048] [--rounds 5]

Phases: convert = `convert_samples_to_train_data` (group-normalised rewards, rollout ids, mask sums);
schedule = `schedule_for` (dynamic batching, --max-tokens-per-gpu 16384, --global-batch-size 256:
4 steps); tensorise = the rest of `split_for_data_parallel` (per-rank dicts, per-sample CPU tensors);
put = one `ray.put` per rank. Rounds alternate (plain put, ours) and medians are reported.
Goals (issue 12): schedule < 5 ms per 1,000 samples; convert+schedule+tensorise+put <= 2x plain put.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray  # noqa: E402

from slime.rollout.controller import convert_samples_to_train_data  # noqa: E402
from slime.train_batch.flags import TrainBatchConfig  # noqa: E402
from slime.train_batch.rank_batches import schedule_for, split_for_data_parallel  # noqa: E402
from slime.utils.plugin_args import completed  # noqa: E402
from slime.utils.types import Sample  # noqa: E402


def make_samples(n: int, tokens: int, n_per_prompt: int = 8) -> list[Sample]:
    rng = random.Random(0)
    prompt = tokens // 8
    resp = tokens - prompt
    out = []
    for i in range(n):
        out.append(
            Sample(
                group_index=i // n_per_prompt,
                index=i,
                tokens=[rng.randrange(150_000) for _ in range(tokens)],
                response_length=resp,
                reward=float(rng.random() < 0.5),
                loss_mask=[1] * resp,
                rollout_log_probs=[-rng.random() for _ in range(resp)],
                status=Sample.Status.COMPLETED,
            )
        )
    return out


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    n = a.samples
    args = completed(
        SimpleNamespace(
            advantage_estimator="grpo",
            disable_rewards_normalization=False,
            disable_grpo_std_normalization=False,
            reward_key=None,
            global_batch_size=256,
            use_dynamic_batch_size=True,
            max_tokens_per_gpu=16384,
            micro_batch_size=1,
        )
    )
    config = TrainBatchConfig.from_args(args)  # as the controller reads it, once
    samples = make_samples(n, a.tokens)
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        # the plain put: the same per-sample tensors, already made, in one dict
        ranks, _ = split_for_data_parallel(config, convert_samples_to_train_data(args, samples), {"dp_size": 1})
        plain = {k: ranks[0][k] for k in ("tokens", "loss_masks", "rollout_log_probs", "rollout_mask_sums")}
        ray.get(ray.put(plain))  # warm-up
        print(
            f"samples={n} tokens/sample={a.tokens} rounds={a.rounds} (medians); dynamic batching, "
            f"max_tokens_per_gpu=16384, global_batch_size=256; load average {os.getloadavg()[0]:.1f} "
            f"on {os.cpu_count()} cores"
        )
        print(
            "| dp | convert ms | schedule ms (per 1k samples) | tensorise ms | put ms | total ms | "
            "us/sample | plain put ms | total / plain put |"
        )
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for dp in (1, 2, 8):
            phases: dict[str, list[float]] = {k: [] for k in ("convert", "schedule", "tensorise", "put", "plain")}
            for _ in range(a.rounds):
                ref, t = timed(lambda: ray.put(plain))
                phases["plain"].append(t)
                del ref
                batch, t_convert = timed(lambda: convert_samples_to_train_data(args, samples))
                _, t_sched = timed(lambda b=batch: schedule_for(config, b, {"dp_size": dp}))
                (per_rank, _), t_split = timed(lambda b=batch: split_for_data_parallel(config, b, {"dp_size": dp}))
                refs, t_put = timed(lambda ranks=per_rank: [ray.put(r) for r in ranks])
                phases["convert"].append(t_convert)
                phases["schedule"].append(t_sched)
                phases["tensorise"].append(max(0.0, t_split - t_sched))
                phases["put"].append(t_put)
                del refs, per_rank, batch
            med = {k: statistics.median(v) * 1000 for k, v in phases.items()}
            total = med["convert"] + med["schedule"] + med["tensorise"] + med["put"]
            print(
                f"| {dp} | {med['convert']:.1f} | {med['schedule']:.2f} ({med['schedule'] * 1000 / n:.2f}) | "
                f"{med['tensorise']:.1f} | {med['put']:.1f} | {total:.1f} | {total * 1000 / n:.0f} | "
                f"{med['plain']:.1f} | {total / med['plain']:.2f}x |"
            )
        print("targets: schedule < 5 ms per 1,000 samples; total / plain put <= 2x")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
