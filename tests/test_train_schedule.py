"""The DP / micro-batch schedule: every invariant (static and dynamic, dp 1/2/4/8, random lengths with
hypothesis), balance on long-tail lengths, errors naming the numbers, and the per-rank batches."""

from __future__ import annotations

import logging
import math
import pickle
import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime.train_batch.flags import TrainBatchConfig
from slime.train_batch.rank_batches import split_for_data_parallel
from slime.train_batch.schedule import (
    DPSchedule,
    ScheduleError,
    balanced_equal_split,
    build_dp_schedule,
    karmarkar_karp,
)
from slime.utils.plugin_args import completed


def batch_config(**flags) -> TrainBatchConfig:
    """The split's config of a namespace with these flags and the parser's defaults."""
    return TrainBatchConfig.from_args(completed(SimpleNamespace(**flags)))


def check_invariants(s: DPSchedule, lengths, rollout_ids, *, dp, gbs, mbs=None, cap=None, mb_group=1):
    """Asserts every invariant of the schedule (see slime/train_batch/schedule.py)."""
    order = list(dict.fromkeys(rollout_ids))
    steps = len(order) // gbs
    kept_rollouts = set(order[: steps * gbs])
    kept = sorted(i for i, r in enumerate(rollout_ids) if r in kept_rollouts)
    assert s.dropped_samples == sorted(set(range(len(lengths))) - set(kept))
    assert s.dropped_rollouts == len(order) - steps * gbs
    assert s.global_batch_sizes == [gbs] * steps and len(s.num_microbatches) == steps
    assert len(s.partitions) == dp and len(s.micro_batch_indices) == dp
    # every kept sample exactly once
    placed = [i for p in s.partitions for i in p]
    assert sorted(placed) == kept
    step_of_rollout: dict = {}
    for r in range(dp):
        mbs_r = s.micro_batch_indices[r]
        # same number of micro-batches on every rank, per step
        assert len(mbs_r) == sum(s.num_microbatches)
        # the micro-batch lists tile the rank's samples exactly, in order
        assert [i for mb in mbs_r for i in mb] == list(range(len(s.partitions[r])))
        assert s.partitions[r], f"rank {r} is empty"
        k = 0
        for step, count in enumerate(s.num_microbatches):
            assert count >= 1 and count % mb_group == 0
            for mb in mbs_r[k : k + count]:
                assert mb, "empty micro-batch"
                samples = [s.partitions[r][i] for i in mb]
                if mbs is not None:
                    assert len(mb) == mbs
                if cap is not None:
                    assert sum(lengths[i] for i in samples) <= cap or len(mb) == 1
                for i in samples:  # a rollout's samples stay in one step
                    assert step_of_rollout.setdefault(rollout_ids[i], step) == step
            k += count
    for step, tokens in enumerate(s.step_rank_tokens):
        assert len(tokens) == dp
    assert sum(map(sum, s.step_rank_tokens)) == sum(lengths[i] for i in kept)


def long_tail_lengths(n, seed, max_response=16384):
    """Prompt 64..1024 tokens + lognormal response (median 1500, heavy right tail), capped like a
    real --rollout-max-response-len."""
    rng = random.Random(seed)
    return [rng.randint(64, 1024) + min(max_response, int(rng.lognormvariate(math.log(1500), 0.9))) for _ in range(n)]


# ----------------------------------------------------------------------------- Karmarkar-Karp


def test_karmarkar_karp_hand_examples():
    assert karmarkar_karp([1, 2, 3, 4, 5, 6, 7, 8], 2, equal_size=True) == [[1, 2, 4, 7], [0, 3, 5, 6]]  # 18/18
    assert karmarkar_karp([10, 1, 1, 1, 1, 1, 1, 1], 4, equal_size=False)[0] == [0]
    assert karmarkar_karp([5, 1, 2], 1, equal_size=True) == [[0, 1, 2]]
    with pytest.raises(ScheduleError, match="5 items do not split into 2 equal-size sets"):
        karmarkar_karp([1] * 5, 2, equal_size=True)


@given(st.lists(st.integers(1, 10_000), min_size=8, max_size=200), st.sampled_from([2, 4, 8]))
@settings(max_examples=60, deadline=None)
def test_karmarkar_karp_equal_size_property(weights, k):
    weights = weights[: len(weights) // k * k]
    parts = karmarkar_karp(weights, k, equal_size=True)
    assert sorted(i for p in parts for i in p) == list(range(len(weights)))
    assert all(len(p) == len(weights) // k for p in parts)
    sums = [sum(weights[i] for i in p) for p in parts]
    assert sums == sorted(sums, reverse=True)
    # never worse than the trivial bound: spread at most the largest item
    assert sums[0] - sums[-1] <= max(weights)
    refined = balanced_equal_split(weights, k)  # the swaps keep counts and never widen the spread
    assert sorted(i for p in refined for i in p) == list(range(len(weights)))
    assert all(len(p) == len(weights) // k for p in refined)
    rs = [sum(weights[i] for i in p) for p in refined]
    assert max(rs) - min(rs) <= sums[0] - sums[-1]


# ----------------------------------------------------------------------------- invariants, fixed cases


@pytest.mark.parametrize("dp", [1, 2, 4, 8])
@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_invariants_dp_sizes(dp, mode):
    lengths = long_tail_lengths(512, seed=dp)
    ids = list(range(512))
    if mode == "static":
        s = build_dp_schedule(lengths, ids, dp_size=dp, global_batch_size=128, micro_batch_size=2)
        check_invariants(s, lengths, ids, dp=dp, gbs=128, mbs=2)
        assert s.num_microbatches == [128 // dp // 2] * 4
    else:
        s = build_dp_schedule(
            lengths, ids, dp_size=dp, global_batch_size=128, use_dynamic_batch_size=True, max_tokens_per_gpu=12_000
        )
        check_invariants(s, lengths, ids, dp=dp, gbs=128, cap=12_000)
        for step in range(4):  # K: near the smallest aligned count the cap allows
            step_lengths = lengths[step * 128 : (step + 1) * 128]
            giants = sum(1 for n in step_lengths if n > 12_000)  # alone, one micro-batch each
            lower = giants + -(-sum(n for n in step_lengths if n <= 12_000) // 12_000)
            assert lower <= s.num_microbatches[step] * dp <= -(-lower // dp) * dp + 2 * dp


def test_rollouts_with_several_samples_stay_in_one_step_and_trailing_are_dropped():
    # 11 rollouts of 1-3 samples, interleaved; 4 rollouts per step -> 2 steps, 3 rollouts dropped
    rng = random.Random(3)
    ids = [r for r in range(11) for _ in range(rng.randint(1, 3))]
    rng.shuffle(ids)
    lengths = [rng.randint(10, 500) for _ in ids]
    s = build_dp_schedule(
        lengths, ids, dp_size=2, global_batch_size=4, use_dynamic_batch_size=True, max_tokens_per_gpu=600
    )
    check_invariants(s, lengths, ids, dp=2, gbs=4, cap=600)
    order = list(dict.fromkeys(ids))
    assert s.dropped_rollouts == 3
    assert s.dropped_samples == sorted(i for i, r in enumerate(ids) if r in order[8:])


def test_one_giant_sample_is_alone_and_everything_else_is_kept():
    lengths = [100] * 15 + [100_000]
    ids = list(range(16))
    s = build_dp_schedule(
        lengths, ids, dp_size=2, global_batch_size=16, use_dynamic_batch_size=True, max_tokens_per_gpu=1000
    )
    check_invariants(s, lengths, ids, dp=2, gbs=16, cap=1000)
    giant_mbs = [mb for r in range(2) for mb in s.micro_batch_indices[r] if 15 in [s.partitions[r][i] for i in mb]]
    assert len(giant_mbs) == 1 and len(giant_mbs[0]) == 1
    # 4 micro-batches: the giant and three of 500 tokens; the giant's rank takes the lightest other one
    assert s.num_microbatches == [2] and sorted(s.step_rank_tokens[0]) == [1000, 100_500]
    static = build_dp_schedule(lengths, ids, dp_size=2, global_batch_size=16, micro_batch_size=1)
    check_invariants(static, lengths, ids, dp=2, gbs=16, mbs=1)


def test_vpp_and_cp_alignment():
    lengths = long_tail_lengths(64, seed=9)
    ids = list(range(64))
    s = build_dp_schedule(
        lengths,
        ids,
        dp_size=2,
        global_batch_size=64,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=4000,
        cp_size=2,
        vpp_size=2,
        microbatch_group_size_per_vp_stage=3,
    )
    check_invariants(s, lengths, ids, dp=2, gbs=64, cap=8000, mb_group=3)
    s = build_dp_schedule(
        lengths,
        ids,
        dp_size=2,
        global_batch_size=64,
        micro_batch_size=4,
        vpp_size=2,
        microbatch_group_size_per_vp_stage=2,
    )
    check_invariants(s, lengths, ids, dp=2, gbs=64, mbs=4, mb_group=2)
    assert s.num_microbatches == [8]


def test_cumulative_balance_over_steps():
    lengths = long_tail_lengths(1024, seed=1)
    s = build_dp_schedule(lengths, list(range(1024)), dp_size=4, global_batch_size=64, micro_batch_size=1)
    totals = [sum(lengths[i] for i in p) for p in s.partitions]
    assert (max(totals) - min(totals)) / max(totals) < 0.01


# ----------------------------------------------------------------------------- errors


def test_errors_name_the_numbers():
    with pytest.raises(ScheduleError, match="step 0 has 3 samples but dp_size=4 needs at least 4"):
        build_dp_schedule([10] * 3, [0, 1, 2], dp_size=4, global_batch_size=3, micro_batch_size=1)
    with pytest.raises(ScheduleError, match="step 0 has 3 samples but dp_size=4 needs at least 4"):
        build_dp_schedule(
            [10] * 3, [0, 1, 2], dp_size=4, global_batch_size=3, use_dynamic_batch_size=True, max_tokens_per_gpu=100
        )
    with pytest.raises(
        ScheduleError, match="step 0 has 6 samples, not a multiple of dp_size=4 x --micro-batch-size 1 = 4"
    ):
        build_dp_schedule([10] * 6, list(range(6)), dp_size=4, global_batch_size=6, micro_batch_size=1)
    with pytest.raises(ScheduleError, match="3 rollouts \\(3 samples\\), fewer than --global-batch-size 4"):
        build_dp_schedule([10] * 3, [0, 1, 2], dp_size=1, global_batch_size=4, micro_batch_size=1)
    with pytest.raises(ScheduleError, match="--max-tokens-per-gpu"):
        build_dp_schedule([10] * 4, [0, 1, 2, 3], dp_size=1, global_batch_size=4, use_dynamic_batch_size=True)
    with pytest.raises(ScheduleError, match="position 1 has total length 0"):
        build_dp_schedule([10, 0], [0, 1], dp_size=1, global_batch_size=2, micro_batch_size=1)
    # 9 samples of 60 tokens under a cap of 100 need 9 micro-batches; with dp 8 that means 16 > 9 samples
    with pytest.raises(
        ScheduleError,
        match=r"step 0: 9 samples \(540 tokens\) need 9 micro-batches of at most "
        r"100 tokens.*multiple of 8 \(dp_size=8\)",
    ):
        build_dp_schedule(
            [60] * 9,
            list(range(9)),
            dp_size=8,
            global_batch_size=9,
            use_dynamic_batch_size=True,
            max_tokens_per_gpu=100,
        )


# ----------------------------------------------------------------------------- property-based


@st.composite
def rollouts(draw):
    dp = draw(st.sampled_from([1, 2, 4, 8]))
    per_rollout = draw(st.lists(st.integers(1, 3), min_size=dp, max_size=120))
    ids = [r for r, k in enumerate(per_rollout) for _ in range(k)]
    ids = draw(st.permutations(ids))
    lengths = draw(st.lists(st.integers(1, 6000), min_size=len(ids), max_size=len(ids)))
    return dp, ids, lengths


@given(rollouts(), st.integers(1, 60), st.integers(1, 20_000))
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_property_dynamic(case, gbs, max_tokens):
    dp, ids, lengths = case
    try:
        s = build_dp_schedule(
            lengths, ids, dp_size=dp, global_batch_size=gbs, use_dynamic_batch_size=True, max_tokens_per_gpu=max_tokens
        )
    except ScheduleError as e:
        # only legitimate refusals: too few rollouts, too few samples for the ranks, or a cap that needs
        # more aligned micro-batches than there are samples
        assert (
            "fewer than --global-batch-size" in str(e)
            or f"dp_size={dp} needs at least" in str(e)
            or f"(dp_size={dp})" in str(e)
        ), str(e)
        return
    check_invariants(s, lengths, ids, dp=dp, gbs=gbs, cap=max_tokens)


@given(
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 3]),
    st.integers(1, 4),
    st.integers(0, 7),
    st.randoms(use_true_random=False),
)
@settings(max_examples=150, deadline=None)
def test_property_static(dp, mbs, mbs_per_rank, extra, rnd):
    gbs = dp * mbs * mbs_per_rank
    n = gbs * rnd.randint(1, 4) + extra  # `extra` trailing rollouts are dropped
    ids = list(range(n))
    lengths = [rnd.randint(1, 8000) for _ in ids]
    s = build_dp_schedule(lengths, ids, dp_size=dp, global_batch_size=gbs, micro_batch_size=mbs)
    check_invariants(s, lengths, ids, dp=dp, gbs=gbs, mbs=mbs)
    assert s.num_microbatches == [mbs_per_rank] * (n // gbs)


@given(st.sampled_from([1, 2, 4, 8]), st.integers(1, 40), st.randoms(use_true_random=False))
@settings(max_examples=150, deadline=None)
def test_property_dynamic_feasible_is_never_refused(dp, per_rank, rnd):
    """A step whose sample count is a multiple of dp can always be scheduled (one sample per
    micro-batch at worst), whatever the lengths and the cap."""
    n = dp * per_rank
    lengths = [rnd.choice([rnd.randint(1, 300), rnd.randint(1, 30_000)]) for _ in range(n)]
    cap = rnd.randint(1, 20_000)
    s = build_dp_schedule(
        lengths, list(range(n)), dp_size=dp, global_batch_size=n, use_dynamic_batch_size=True, max_tokens_per_gpu=cap
    )
    check_invariants(s, lengths, list(range(n)), dp=dp, gbs=n, cap=cap)


# ----------------------------------------------------------------------------- balance


@pytest.mark.parametrize("dp", [2, 4, 8])
def test_balance_within_10_percent_on_long_tail_lengths(dp, capsys):
    spreads = {}
    for seed in range(5):
        lengths = long_tail_lengths(1024, seed=100 + seed)
        ids = list(range(1024))
        for mode, kw in (
            ("static", dict(micro_batch_size=1)),
            ("dynamic-16k", dict(use_dynamic_batch_size=True, max_tokens_per_gpu=16384)),
            ("dynamic-32k", dict(use_dynamic_batch_size=True, max_tokens_per_gpu=32768)),
        ):
            s = build_dp_schedule(lengths, ids, dp_size=dp, global_batch_size=256, **kw)
            spreads.setdefault(mode, []).append(s.rank_token_spread)
    with capsys.disabled():
        print(
            f"\n dp={dp} worst-step rank token spread over 5 rollouts x 4 steps: "
            + ", ".join(f"{m} max {max(v):.2%}" for m, v in spreads.items())
        )
    for mode, values in spreads.items():
        assert max(values) <= 0.10, (mode, values)


# ----------------------------------------------------------------------------- per-rank batches


def _batch(n=16, seed=0):
    rng = random.Random(seed)
    batch = {
        k: []
        for k in (
            "tokens",
            "response_lengths",
            "total_lengths",
            "rewards",
            "raw_reward",
            "truncated",
            "sample_indices",
            "rollout_ids",
            "loss_masks",
            "rollout_log_probs",
            "rollout_mask_sums",
            "weight_versions",
        )
    }
    for i in range(n):
        prompt, resp = rng.randint(1, 20), rng.randint(1, 30)
        batch["tokens"].append([rng.randrange(1000) for _ in range(prompt + resp)])
        batch["response_lengths"].append(resp)
        batch["total_lengths"].append(prompt + resp)
        batch["rewards"].append(float(i))
        batch["raw_reward"].append(float(i) / 2)
        batch["truncated"].append(i % 2)
        batch["sample_indices"].append(i)
        batch["rollout_ids"].append(i // 2)
        batch["loss_masks"].append([rng.randint(0, 1) for _ in range(resp)])
        batch["rollout_log_probs"].append([-rng.random() for _ in range(resp)])
        batch["weight_versions"].append(["1"])
    sums: dict = {}
    for rid, m in zip(batch["rollout_ids"], batch["loss_masks"]):
        sums[rid] = sums.get(rid, 0) + sum(m)
    batch["rollout_mask_sums"] = [sums[r] for r in batch["rollout_ids"]]
    return batch


def test_split_for_data_parallel_layout_and_dtypes():
    batch = _batch(16)
    config = batch_config(global_batch_size=4, micro_batch_size=1)  # 4 rollouts (8 samples) per step
    ranks, metrics = split_for_data_parallel(config, batch, {"dp_size": 2})
    assert len(ranks) == 2
    assert sorted(i for r in ranks for i in r["partition"]) == list(range(16))
    for r in ranks:
        part = r["partition"]
        assert r["num_microbatches"] == [4, 4] and r["global_batch_sizes"] == [4, 4]
        assert [i for mb in r["micro_batch_indices"] for i in mb] == list(range(len(part)))
        assert r["raw_reward"] == batch["raw_reward"] and r["total_lengths"] == batch["total_lengths"]
        for key in ("rewards", "truncated", "sample_indices", "rollout_ids", "response_lengths", "weight_versions"):
            assert r[key] == [batch[key][i] for i in part]
        for key, dtype in (("tokens", torch.int64), ("loss_masks", torch.int32), ("rollout_log_probs", torch.float32)):
            assert all(
                isinstance(t, torch.Tensor) and t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()
                for t in r[key]
            )
            for t, i in zip(r[key], part):
                assert t.tolist() == pytest.approx(batch[key][i])
        assert r["rollout_mask_sums"].dtype == torch.float32
        assert r["rollout_mask_sums"].tolist() == [batch["rollout_mask_sums"][i] for i in part]
        back = pickle.loads(pickle.dumps(r))  # what ray.put does
        assert torch.equal(back["tokens"][0], r["tokens"][0])
    assert metrics["rollout/train_steps"] == 2 and metrics["rollout/train_dropped_samples"] == 0


def test_split_drops_trailing_rollouts_with_a_warning(caplog):
    batch = _batch(14)  # 7 rollouts, 3 per step -> 2 steps, rollout 6 (samples 12, 13) dropped
    with caplog.at_level(logging.WARNING):
        ranks, metrics = split_for_data_parallel(batch_config(global_batch_size=3), batch, {"dp_size": 2})
    assert metrics["rollout/train_dropped_rollouts"] == 1 and metrics["rollout/train_dropped_samples"] == 2
    assert "dropping the trailing 1 rollouts (2 samples)" in caplog.text
    assert sorted(i for r in ranks for i in r["partition"]) == list(range(12))
    assert len(ranks[0]["raw_reward"]) == 14  # whole-rollout keys stay whole


def test_split_errors_name_the_numbers():
    batch = _batch(6)
    config = batch_config(global_batch_size=3, micro_batch_size=1)
    with pytest.raises(ScheduleError, match="needs a dict with 'dp_size'"):
        split_for_data_parallel(config, batch, {"tp_size": 2})
    with pytest.raises(ScheduleError, match="dp_size must be a positive integer, got 0"):
        split_for_data_parallel(config, batch, {"dp_size": 0})
    with pytest.raises(ScheduleError, match="step 0 has 6 samples but dp_size=8 needs at least 8"):
        split_for_data_parallel(config, batch, {"dp_size": 8})


def test_split_dynamic_and_defaults():
    batch = _batch(16)
    batch.pop("rollout_ids")  # no ids: every sample is a rollout; no --global-batch-size: one step
    batch["loss_masks"][0] = [1] * len(batch["loss_masks"][0])  # the all-ones / all-zeros fast path
    batch["loss_masks"][1] = [0] * len(batch["loss_masks"][1])
    ranks, metrics = split_for_data_parallel(
        batch_config(use_dynamic_batch_size=True, max_tokens_per_gpu=60),
        batch,
        {"dp_size": 4, "cp_size": 1},
    )
    assert metrics["rollout/train_steps"] == 1 and metrics["rollout/train_dp_token_spread"] < 1
    for r in ranks:
        for mb in r["micro_batch_indices"]:
            assert sum(r["total_lengths"][r["partition"][i]] for i in mb) <= 60 or len(mb) == 1
        for t, i in zip(r["loss_masks"], r["partition"]):
            assert t.dtype == torch.int32 and t.tolist() == batch["loss_masks"][i]
