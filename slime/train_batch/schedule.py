"""Which data-parallel rank trains which samples, in which micro-batches (slime's DP schedule).

Pure Python (no Ray, no torch, no engine), so every invariant is unit-testable.

Steps. Samples are grouped by rollout id (first-occurrence order) and every training step takes
`global_batch_size` rollouts, so all samples of one rollout share a step (the per-rollout loss
denominator `rollout_mask_sums` is only exact within a step). Trailing rollouts that do not fill a
step are dropped and reported (`DPSchedule.dropped_samples`), as slime does.

Per step, with `align = dp_size * (microbatch_group_size_per_vp_stage if vpp_size > 1 else 1)`:

* static (`micro_batch_size`): the step's samples are split into `dp_size` equal-count sets balanced
  by tokens, and each rank cuts its set into micro-batches of exactly `micro_batch_size` samples. The
  step size must be a multiple of `dp_size * micro_batch_size` (else an error naming the numbers).
* dynamic (`max_tokens_per_gpu`, cap = `max_tokens_per_gpu * cp_size`): ranks first. The step's
  samples are split into `dp_size` sets of near-equal tokens, each rank packs its set into as few
  micro-batches of at most `cap` tokens as it can (a sample longer than the cap is alone), and every
  rank uses the largest count any rank needs (splitting its micro-batches to get there). Balancing
  samples rather than whole micro-batches keeps the ranks' token totals equal even when micro-batches
  are few and full. If a rank then has fewer samples than that count (a very long sample took a rank
  almost on its own), micro-batches first: the step is packed into a multiple of `dp_size`
  micro-batches, dealt out `K / dp_size` per rank by Karmarkar-Karp on their tokens.

Algorithms: Karmarkar-Karp (equal-cardinality) wherever every set must get the same number of items
(static samples per rank, micro-batches per rank); longest-first (LPT) where items are many per set
and a cap must be checked at each placement (see each function's docstring for why).

Invariants (tests/test_train_schedule.py checks each, also on random lengths): every rank runs the
same number of micro-batches per step; every kept sample is placed exactly once; a rollout's samples
stay in one step; in dynamic mode a micro-batch holds at most the cap unless it is a single sample;
each rank's micro-batch lists tile `range(len(partition))` in order; no rank and no micro-batch is
empty.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from slime.train_batch.flags import TrainBatchConfig


class ScheduleError(ValueError):
    """A rollout that cannot be scheduled with the given parallel config (the message names the numbers)."""


@dataclass
class DPSchedule:
    """slime's `(partitions, micro_batch_indices, num_microbatches, global_batch_sizes)` plus accounting.

    `partitions[r]`: global sample indices of rank r (all steps, in training order);
    `micro_batch_indices[r]`: rank r's micro-batches as local indices into `partitions[r]`;
    `num_microbatches[s]`: micro-batches per rank in step s; `global_batch_sizes[s]`: rollouts in step s;
    `step_rank_tokens[s][r]`: tokens rank r trains in step s; `dropped_samples`: trailing samples dropped.
    """

    partitions: list[list[int]]
    micro_batch_indices: list[list[list[int]]]
    num_microbatches: list[int]
    global_batch_sizes: list[int]
    step_rank_tokens: list[list[int]] = field(default_factory=list)
    dropped_samples: list[int] = field(default_factory=list)
    dropped_rollouts: int = 0

    @property
    def rank_token_spread(self) -> float:
        """Worst step's `(max - min) / max` of the ranks' token totals (0 = perfectly balanced)."""
        worst = 0.0
        for tokens in self.step_rank_tokens:
            if max(tokens) > 0:
                worst = max(worst, (max(tokens) - min(tokens)) / max(tokens))
        return worst


# ----------------------------------------------------------------------------- balancing


def karmarkar_karp(weights: Sequence[int], k: int, *, equal_size: bool) -> list[list[int]]:
    """Split item indices into `k` sets with near-equal weight sums (largest differencing method).

    Why this algorithm: Karmarkar-Karp keeps a heap of partial k-way partitions and always merges the
    two with the largest spread, pairing the heaviest set of one with the lightest of the other, so
    big differences cancel each other early instead of being patched by small items at the end. On
    random and long-tailed inputs its final spread is far smaller than greedy longest-first's (LPT),
    it runs in O(n log n + n k log k), is deterministic, and its equal-cardinality variant (seed
    states of k consecutive sorted items, one per set) gives every set the same number of items,
    which is what static batching (samples per rank) and dealing micro-batches to ranks need. slime
    and verl use it for the same job.

    Returns `k` lists of indices, heaviest first, each sorted ascending. `equal_size` requires
    `len(weights) % k == 0`; every set is non-empty when `len(weights) >= k`.
    """
    n = len(weights)
    if k < 1:
        raise ScheduleError(f"karmarkar_karp: k={k} partitions")
    if equal_size and n % k:
        raise ScheduleError(f"karmarkar_karp: {n} items do not split into {k} equal-size sets")
    if k == 1:
        return [list(range(n))]
    order = sorted(range(n), key=weights.__getitem__)
    heap: list[tuple[int, int, int, list[tuple[int, list[int]]]]] = []
    tick = 0

    def push(sets: list[tuple[int, list[int]]]) -> None:
        nonlocal tick
        sets.sort(key=lambda s: (s[0], len(s[1])), reverse=True)
        # largest spread first; ties: the state with the heaviest set, then first pushed
        heapq.heappush(heap, (sets[-1][0] - sets[0][0], -sets[0][0], tick, sets))
        tick += 1

    if equal_size:
        for off in range(0, n, k):
            push([(weights[i], [i]) for i in order[off : off + k]])
    else:
        for i in order:
            push([(weights[i], [i])] + [(0, []) for _ in range(k - 1)])
    while len(heap) > 1:
        a = heapq.heappop(heap)[3]
        b = heapq.heappop(heap)[3]
        merged = []
        for (wa, ia), (wb, ib) in zip(a, reversed(b)):
            if len(ia) < len(ib):  # extend the longer list: O(n log n) item moves overall
                ia, ib = ib, ia
            ia.extend(ib)
            merged.append((wa + wb, ia))
        push(merged)
    return [sorted(items) for _, items in heap[0][3]] if heap else [[] for _ in range(k)]


def balanced_equal_split(weights: Sequence[int], k: int) -> list[list[int]]:
    """`k` equal-count sets of near-equal weight: Karmarkar-Karp, then pairwise swaps between the
    heaviest and the lightest set while one narrows their gap (each swap keeps the counts and never
    widens the overall spread). The swaps matter when sets hold few long-tailed items, where KK's
    seed groups leave a few percent; they cost O(n log n) per swap and stop after `4 k` swaps."""
    parts = karmarkar_karp(weights, k, equal_size=True)
    if k == 1:
        return parts
    sums = [sum(weights[i] for i in p) for p in parts]
    for _ in range(4 * k):
        hi = max(range(k), key=sums.__getitem__)
        lo = min(range(k), key=sums.__getitem__)
        gap = sums[hi] - sums[lo]
        if gap <= 0:
            break
        light = sorted(parts[lo], key=weights.__getitem__)
        light_w = [weights[i] for i in light]
        best = None  # (new gap, a, b): move a (heavy) to lo and b (light) to hi
        for a in parts[hi]:
            want = weights[a] - gap / 2  # the light item that halves the gap
            pos = bisect.bisect_left(light_w, want)
            for j in (pos - 1, pos):
                if 0 <= j < len(light):
                    d = weights[a] - light_w[j]
                    if 0 < d < gap and (best is None or abs(gap - 2 * d) < best[0]):
                        best = (abs(gap - 2 * d), a, light[j])
        if best is None:
            break
        _, a, b = best
        parts[hi].remove(a)
        parts[lo].remove(b)
        parts[hi].append(b)
        parts[lo].append(a)
        d = weights[a] - weights[b]
        sums[hi] -= d
        sums[lo] += d
    return [sorted(p) for p in parts]


# ----------------------------------------------------------------------------- packing under a cap


def _pack_longest_first(lengths: Sequence[int], k: int, cap: int | None = None) -> list[list[int]] | None:
    """Longest item into the least-loaded of `k` bins (LPT). With a `cap`: None as soon as a bin would
    exceed it (an item longer than `cap` may only open an empty bin). Bins come out near-equal: the
    final spread is at most the size of the last (smallest) items placed."""
    heap = [(0, 0, b) for b in range(k)]  # (tokens, items, bin): empty bins first on ties
    bins: list[list[int]] = [[] for _ in range(k)]
    for i in sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True):
        tokens, count, b = heap[0]
        if cap is not None and count and tokens + lengths[i] > cap:
            return None
        bins[b].append(i)
        heapq.heapreplace(heap, (tokens + lengths[i], count + 1, b))
    return bins if all(bins) else None


def _pack_best_fit(lengths: Sequence[int], cap: int) -> list[list[int]]:
    """Best-fit decreasing: few bins (at most 11/9 of the optimum + 1), each within `cap` unless a
    single item is longer. Used when longest-first cannot meet the cap with the target count."""
    free: list[tuple[int, int]] = []  # (remaining capacity, bin) sorted
    bins: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True):
        n = lengths[i]
        pos = bisect.bisect_left(free, (n, -1))
        if pos < len(free):
            room, b = free.pop(pos)
            bins[b].append(i)
            bisect.insort(free, (room - n, b))
        else:
            bins.append([i])
            if n < cap:
                bisect.insort(free, (cap - n, len(bins) - 1))
    return bins


def _split_to(bins: list[list[int]], k: int, lengths: Sequence[int]) -> list[list[int]]:
    """Grow to `k` bins by halving (by tokens) the heaviest multi-item bin; halves never exceed the
    original, so the cap still holds. Needs `k <= number of items`."""
    bins = [list(b) for b in bins]
    heap = [(-sum(lengths[i] for i in b), j) for j, b in enumerate(bins) if len(b) > 1]
    heapq.heapify(heap)
    while len(bins) < k:
        _, j = heapq.heappop(heap)
        halves = _pack_longest_first([lengths[i] for i in bins[j]], 2)
        bins[j], new = ([bins[j][i] for i in h] for h in halves)
        bins.append(new)
        for idx in (j, len(bins) - 1):
            if len(bins[idx]) > 1:
                heapq.heappush(heap, (-sum(lengths[i] for i in bins[idx]), idx))
    return bins


def _round_up(x: int, m: int) -> int:
    return -(-x // m) * m


def _pack_under_cap(lengths: Sequence[int], cap: int, multiple: int) -> list[list[int]] | None:
    """Few micro-batches of at most `cap` tokens (a longer sample alone), their count the smallest
    multiple of `multiple` we find: longest-first from the lower bound
    `max(#longer than cap + ceil(rest / cap), #longer than cap / 2)`, else best-fit decreasing split
    up to the count. None when that count exceeds the number of samples."""
    m = len(lengths)
    rest = sum(n for n in lengths if n <= cap)  # longer samples are alone, one micro-batch each
    lower = max(1, sum(1 for n in lengths if n > cap) + -(-rest // cap), sum(1 for n in lengths if 2 * n > cap))
    k = _round_up(lower, multiple)
    bins = _pack_longest_first(lengths, k, cap) if k <= m else None
    if bins is None:
        best_fit = _pack_best_fit(lengths, cap)
        k2 = max(k, _round_up(len(best_fit), multiple))
        if k2 > m:
            return None
        bins = (_pack_longest_first(lengths, k2, cap) if k2 > k else None) or _split_to(best_fit, k2, lengths)
    return bins


def _dynamic_rank_sets(
    lengths: list[int], cap: int, dp_size: int, group: int, step: int, weights: list[int]
) -> list[list[list[int]]]:
    """Micro-batches of one step for each rank (step-local indices), every rank the same count.

    Ranks first: the samples are split into `dp_size` sets of near-equal tokens (longest-first over
    many samples per rank leaves a spread no larger than its smallest samples), then every rank packs
    its own set, and all ranks use the largest count any rank needs. That keeps the ranks' token
    totals equal even when micro-batches are few and full. When a rank has fewer samples than that
    count (a very long sample took a rank on its own), fall back to micro-batches first: pack the
    step into a multiple of `dp_size` micro-batches and deal them out by Karmarkar-Karp. Ranks are
    balanced by `weights` (tokens, or FLOPs with --balance-data); the cap is always on tokens."""
    if dp_size > 1:
        rank_sets = _pack_longest_first(weights, dp_size) or []  # never empty: len(lengths) >= dp_size
        local = [[lengths[i] for i in s] for s in rank_sets]
        packed = [_pack_under_cap(ls, cap, group) for ls in local]
        if rank_sets and all(p is not None for p in packed):
            count = max(len(p) for p in packed)
            if all(len(s) >= count for s in rank_sets):
                out = []
                for s, ls, p in zip(rank_sets, local, packed):
                    if len(p) < count:
                        p = _pack_longest_first(ls, count, cap) or _split_to(p, count, ls)
                    out.append([[s[i] for i in mb] for mb in p])
                return out
    align = dp_size * group
    bins = _pack_under_cap(lengths, cap, align)
    if bins is None:
        best = len(_pack_best_fit(lengths, cap))
        raise ScheduleError(
            f"step {step}: {len(lengths)} samples ({sum(lengths)} tokens) need {best} micro-batches of at most "
            f"{cap} tokens, and the count must be a multiple of {align} (dp_size={dp_size}); "
            f"{_round_up(best, align)} micro-batches need at least as many samples. Lower dp_size or raise "
            "--max-tokens-per-gpu"
        )
    bin_weights = [sum(weights[i] for i in b) for b in bins]
    return [[bins[j] for j in part] for part in balanced_equal_split(bin_weights, dp_size)]


# ----------------------------------------------------------------------------- the schedule


def build_dp_schedule(
    total_lengths: Sequence[int],
    rollout_ids: Sequence[int],
    *,
    dp_size: int,
    global_batch_size: int,
    micro_batch_size: int | None = None,
    use_dynamic_batch_size: bool = False,
    max_tokens_per_gpu: int | None = None,
    cp_size: int = 1,
    vpp_size: int = 1,
    microbatch_group_size_per_vp_stage: int = 1,
    balance_weights: Sequence[int] | None = None,
) -> DPSchedule:
    """The per-rank partitions and micro-batches of one rollout (see the module docstring).

    `total_lengths[i]`: tokens of sample i (prompt + response); `rollout_ids[i]`: its rollout;
    `global_batch_size`: rollouts (not samples) per training step; `balance_weights[i]`: what ranks
    are balanced by (default: tokens; --balance-data: forward FLOPs, `slime.train_batch.flops`)."""
    n = len(total_lengths)
    if len(rollout_ids) != n:
        raise ScheduleError(f"{n} total_lengths but {len(rollout_ids)} rollout_ids")
    if not isinstance(dp_size, int) or dp_size < 1:
        raise ScheduleError(f"dp_size must be a positive integer, got {dp_size!r}")
    if not global_batch_size or global_batch_size < 1:
        raise ScheduleError(f"--global-batch-size must be a positive integer, got {global_batch_size!r}")
    for name, v in (
        ("cp_size", cp_size),
        ("vpp_size", vpp_size),
        ("microbatch_group_size_per_vp_stage", microbatch_group_size_per_vp_stage),
    ):
        if v < 1:
            raise ScheduleError(f"{name} must be >= 1, got {v}")
    if use_dynamic_batch_size:
        if not max_tokens_per_gpu or max_tokens_per_gpu < 1:
            raise ScheduleError(
                f"--use-dynamic-batch-size needs --max-tokens-per-gpu N (N >= 1), got {max_tokens_per_gpu!r}"
            )
    elif not micro_batch_size or micro_batch_size < 1:
        raise ScheduleError(
            f"--micro-batch-size must be >= 1 without --use-dynamic-batch-size, got {micro_batch_size!r}"
        )
    for i, length in enumerate(total_lengths):
        if length < 1:
            raise ScheduleError(f"sample at position {i} has total length {length}; every sample needs a token")

    by_rollout: dict[int, list[int]] = {}
    for pos, rid in enumerate(rollout_ids):
        by_rollout.setdefault(rid, []).append(pos)
    rollouts = list(by_rollout.values())
    num_steps = len(rollouts) // global_batch_size
    if num_steps == 0:
        raise ScheduleError(
            f"the rollout has {len(rollouts)} rollouts ({n} samples), fewer than "
            f"--global-batch-size {global_batch_size}: not one training step "
            "(num_rollouts < global_batch_size)"
        )
    if balance_weights is not None and len(balance_weights) != n:
        raise ScheduleError(f"{n} total_lengths but {len(balance_weights)} balance_weights")
    balance = list(total_lengths) if balance_weights is None else [int(w) for w in balance_weights]
    kept = num_steps * global_batch_size
    dropped = sorted(pos for group in rollouts[kept:] for pos in group)

    align = dp_size * (microbatch_group_size_per_vp_stage if vpp_size > 1 else 1)
    cap = (max_tokens_per_gpu or 0) * cp_size
    sched = DPSchedule(
        [[] for _ in range(dp_size)],
        [[] for _ in range(dp_size)],
        [],
        [],
        dropped_samples=dropped,
        dropped_rollouts=len(rollouts) - kept,
    )
    cumulative = [0] * dp_size
    for step in range(num_steps):
        positions = [
            pos for group in rollouts[step * global_batch_size : (step + 1) * global_batch_size] for pos in group
        ]
        lengths = [total_lengths[p] for p in positions]
        weights = [balance[p] for p in positions]
        m = len(positions)
        if m < align:
            raise ScheduleError(
                f"step {step} has {m} samples but dp_size={dp_size} needs at least {align} "
                f"(one micro-batch per rank{'' if align == dp_size else ' and VPP group'})"
            )
        if use_dynamic_batch_size:
            rank_sets = _dynamic_rank_sets(lengths, cap, dp_size, align // dp_size, step, weights)
        else:
            per_step = dp_size * micro_batch_size * (microbatch_group_size_per_vp_stage if vpp_size > 1 else 1)
            if m % per_step:
                raise ScheduleError(
                    f"step {step} has {m} samples, not a multiple of dp_size={dp_size} x "
                    f"--micro-batch-size {micro_batch_size}"
                    + (
                        f" x microbatch_group_size_per_vp_stage {microbatch_group_size_per_vp_stage}"
                        if vpp_size > 1
                        else ""
                    )
                    + f" = {per_step}; adjust --global-batch-size or use --use-dynamic-batch-size"
                )
            parts = balanced_equal_split(weights, dp_size)
            rank_sets = [
                [part[i : i + micro_batch_size] for i in range(0, len(part), micro_batch_size)] for part in parts
            ]
        # heaviest set to the rank that is lightest so far: balance also holds over the whole rollout
        set_tokens = [sum(lengths[i] for mb in s for i in mb) for s in rank_sets]
        set_weights = [sum(weights[i] for mb in s for i in mb) for s in rank_sets]
        by_weight = sorted(range(dp_size), key=lambda j: -set_weights[j])
        by_load = sorted(range(dp_size), key=lambda r: (cumulative[r], r))
        step_tokens = [0] * dp_size
        for j, r in zip(by_weight, by_load):
            cumulative[r] += set_weights[j]
            step_tokens[r] = set_tokens[j]
            part, mbs = sched.partitions[r], sched.micro_batch_indices[r]
            for mb in sorted((sorted(b) for b in rank_sets[j]), key=lambda b: b[0]):
                start = len(part)
                part.extend(positions[i] for i in mb)
                mbs.append(list(range(start, len(part))))
        sched.num_microbatches.append(len(rank_sets[0]))
        sched.global_batch_sizes.append(global_batch_size)
        sched.step_rank_tokens.append(step_tokens)
    return sched


def schedule_from_flags(
    config: TrainBatchConfig,
    total_lengths: Sequence[int],
    rollout_ids: Sequence[int],
    *,
    global_batch_size: int,
    parallel_config: dict,
) -> DPSchedule:
    """`build_dp_schedule` under the flags of `config` (micro-batching, `--balance-data`'s FLOPs weights) and
    slime's `parallel_config` (`dp_size`, `cp_size`, `vpp_size`, `microbatch_group_size_per_vp_stage`): the one
    call behind our split (`rank_batches.schedule_for`) and slime's `build_dp_schedule(args, ...)`."""
    weights = None
    if config.balance_data:  # slime: ranks balanced by forward FLOPs, not tokens
        from slime.train_batch.flops import FlopsModel

        flops = FlopsModel.of(config.model)
        weights = [round(flops(length)) for length in total_lengths]
    return build_dp_schedule(
        total_lengths,
        rollout_ids,
        dp_size=parallel_config["dp_size"],
        global_batch_size=global_batch_size,
        micro_batch_size=config.micro_batch_size,
        use_dynamic_batch_size=bool(config.use_dynamic_batch_size),
        max_tokens_per_gpu=config.max_tokens_per_gpu,
        cp_size=parallel_config.get("cp_size") or 1,
        vpp_size=parallel_config.get("vpp_size") or 1,
        microbatch_group_size_per_vp_stage=parallel_config.get("microbatch_group_size_per_vp_stage") or 1,
        balance_weights=weights,
    )
