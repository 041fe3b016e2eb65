"""The asynchronous-rollout benchmark in its short mode, and the paced engine it runs on.

Correctness only, never speed: every rollout returns exactly its batch, no group is trained
twice, every prompt handed out is trained or back in the buffer, every trained sample holds
exactly the ids an uninterrupted run would have produced (continued ones included), and the
staleness bound holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import statistics

import pytest

from bench.bench_async_rollout import MODES, ModeResult, Workload, merge, per_round_ratios, run_all, short_workload
from slime.testing.paced_engine import LENGTH_BASE, LongTail, PacedScript, response_ids, split_input, total_length
from slime.utils.types import Sample

PROMPT = list(range(1000, 1016))


def body(input_ids, max_new):
    return {"input_ids": list(input_ids), "sampling_params": {"max_new_tokens": max_new}}


# ---- the paced engine alone --------------------------------------------------------------------
def test_long_tail_lengths_are_bounded_and_match_their_mean():
    tail = LongTail(short_len=32, long_fraction=0.2, long_max_factor=16.0)
    rng = random.Random(7)
    draws = [tail.draw(rng) for _ in range(20000)]
    assert min(draws) == 16 and max(draws) <= tail.max_len == 512
    assert abs(statistics.fmean(draws) / tail.mean() - 1) < 0.03
    assert sum(d > 32 for d in draws) / len(draws) == pytest.approx(0.2, abs=0.01)


def test_continuation_generates_only_the_rest_and_ends_like_an_uninterrupted_run():
    engine = PacedScript(LongTail(8, 1.0, 8.0), slots=2, tokens_per_s=1e6, seed=3)

    async def go():
        whole = await engine(body(PROMPT, 64), asyncio.Event())
        length = total_length(whole["output_ids"])
        assert whole["finish_type"] == "stop" and whole["output_ids"] == response_ids(PROMPT, length)
        for k in (1, 5, length - 1):
            head = whole["output_ids"][:k]
            assert split_input(PROMPT + head) == (PROMPT, head)
            rest = await engine(body(PROMPT + head, 64 - k), asyncio.Event())
            assert rest["finish_type"] == "stop" and head + rest["output_ids"] == whole["output_ids"]
        cut = await engine(body(PROMPT + whole["output_ids"][:2], 3), asyncio.Event())  # budget below the rest
        assert cut["finish_type"] == "length" and cut["output_ids"] == whole["output_ids"][2:5]
        return length

    length = asyncio.run(go())
    snap = engine.snapshot()
    assert snap["requests"] == 5 and snap["continuations"] == 4
    assert snap["generated_tokens"] == length + (length - 1) + (length - 5) + 1 + 3


def test_slots_bound_decoding_and_aborts_answer_with_what_was_decoded():
    engine = PacedScript(LongTail(8, 1.0, 8.0), slots=1, tokens_per_s=50.0, seed=1)

    async def go():
        stop_a, stop_b = asyncio.Event(), asyncio.Event()
        a = asyncio.ensure_future(engine(body(PROMPT, 64), stop_a))
        await asyncio.sleep(0)  # a takes the only slot
        b = asyncio.ensure_future(engine(body([7] + PROMPT, 64), stop_b))
        await asyncio.sleep(0)  # b waits for it
        assert engine.snapshot()["decoding"] == 1
        stop_b.set()
        assert await b == {"output_ids": [], "finish_type": "abort", "text": ""}  # never got a slot
        stop_a.set()
        out = await a
        assert out["finish_type"] == "abort"
        ids = out["output_ids"]
        if ids:  # a prefix of the response it would have given
            assert ids == response_ids(PROMPT, total_length(ids))[: len(ids)]
        c = await engine(body(PROMPT, 4), asyncio.Event())  # the slot was released
        assert c["finish_type"] == "length" and len(c["output_ids"]) == 4

    asyncio.run(go())
    assert engine.peak_decoding == 1 and engine.snapshot()["decoding"] == 0
    assert engine.snapshot()["aborts"] == 2


def test_prompt_ids_in_the_response_range_are_refused():
    with pytest.raises(ValueError, match="prompt ids must be below"):
        split_input([1, 2, 125_000])


# ---- the benchmark, short mode -----------------------------------------------------------------
@pytest.fixture(scope="module")
def results():
    w = short_workload(Workload())
    return w, {r.mode.key: r for r in run_all(w, list(MODES), keep_samples=True)}


@pytest.mark.parametrize("key", list(MODES))
def test_every_rollout_returns_exactly_its_batch(results, key):
    w, by_mode = results
    r = by_mode[key]
    assert r.error is None, r.error
    assert len(r.rollouts) == w.rollouts
    for groups in r.rollouts:
        assert [len(g) for g in groups] == [w.n_samples] * w.groups
        assert all(len({s.group_index for s in g}) == 1 for g in groups)
    assert r.trained_samples == w.rollouts * w.batch_samples == len(r.staleness)


@pytest.mark.parametrize("key", list(MODES))
def test_every_prompt_is_trained_once_or_back_in_the_buffer(results, key):
    _, by_mode = results
    r = by_mode[key]
    trained = [g[0].group_index for groups in r.rollouts for g in groups]
    buffered = [g[0].group_index for g in r.buffer]
    assert len(set(trained)) == len(trained), "a group was trained twice"
    assert len(set(buffered)) == len(buffered), "a group is twice in the buffer"
    assert not set(trained) & set(buffered)
    assert set(trained) | set(buffered) == set(range(r.prompts_handed_out))
    samples = [s.index for groups in r.rollouts for g in groups for s in g]
    assert len(set(samples)) == len(samples)


def assert_trained_samples_are_uninterrupted_responses(r: ModeResult) -> None:
    for groups in r.rollouts:
        for s in (s for g in groups for s in g):
            prompt, response = split_input(s.tokens)
            length = total_length(response)
            assert response == response_ids(prompt, length) and s.response_length == length
            assert s.status == Sample.Status.COMPLETED
            assert len(s.rollout_log_probs) == len(s.loss_mask) == length
            segments = s.metadata.get("segments") or [{"start": 0, "end": length}]
            assert segments[0]["start"] == 0 and segments[-1]["end"] == length
            assert all(a["end"] == b["start"] for a, b in zip(segments, segments[1:]))
            assert len(s.weight_versions) == len(segments)


@pytest.mark.parametrize("key", list(MODES))
def test_trained_samples_hold_exactly_the_uninterrupted_response(results, key):
    _, by_mode = results
    assert_trained_samples_are_uninterrupted_responses(by_mode[key])


def continued_samples(r: ModeResult) -> list[Sample]:
    return [s for groups in r.rollouts for g in groups for s in g if s.metadata.get("continuations")]


@pytest.mark.parametrize("key", ["c", "e"])
def test_partial_rollout_modes_continue_samples(results, key):
    """Whether an aborted sample is continued and then trained within three rollouts is a race
    (its long rest against fresh short groups): most runs train one to five. So that the checks
    below always have samples to check, a run that trained none is followed by runs of this
    mode alone on other seeds (each held to the same exactness) until one does."""
    w, by_mode = results
    r = by_mode[key]
    continued = continued_samples(r)
    for seed in range(w.seed + 1, w.seed + 6):
        if continued:
            break
        (r,) = run_all(dataclasses.replace(w, seed=seed), [key], keep_samples=True)
        assert r.error is None, r.error
        assert_trained_samples_are_uninterrupted_responses(r)
        continued = continued_samples(r)
    assert continued, f"mode {key}: no trained sample was continued in six runs"
    assert r.engine["continuations"] > 0
    for s in continued:
        assert len(s.metadata["segments"]) == s.metadata["continuations"] + 1
        assert s.tokens[len(s.tokens) - s.response_length] >= LENGTH_BASE


def test_staleness_and_token_accounting(results):
    _, by_mode = results
    for key in ("a", "b"):  # regenerated from scratch: always on the current weights
        assert set(by_mode[key].staleness) == {0}
    assert max(by_mode["d"].staleness) <= 1  # --max-staleness 1, no partial rollout: stale groups dropped
    assert by_mode["a"].aborted_tokens == by_mode["a"].wasted_tokens == 0
    for r in by_mode.values():
        assert r.wasted_tokens >= 0 and r.generated_tokens >= r.trained_tokens


# ---- rounds interleaved (--rounds): summed, and each mode against sync of its own round -------------
def test_rounds_are_summed_with_busy_fractions_weighted_by_their_time():
    a1 = ModeResult(
        MODES["d"],
        trained_samples=10,
        trained_tokens=600,
        wall=10.0,
        rollout_time=4.0,
        busy_whole=0.5,
        busy_rollout=0.25,
        staleness=[0, 1],
        metrics={"perf/abort_time": 1.0},
    )
    a2 = ModeResult(
        MODES["d"],
        trained_samples=20,
        trained_tokens=900,
        wall=30.0,
        rollout_time=12.0,
        busy_whole=0.9,
        busy_rollout=0.5,
        staleness=[1],
        metrics={"perf/abort_time": 2.0},
    )
    m = merge([a1, a2])
    assert (m.trained_samples, m.trained_tokens, m.wall, m.rollout_time) == (30, 1500, 40.0, 16.0)
    assert m.tokens_per_s == 37.5 and m.staleness == [0, 1, 1] and m.metrics == {"perf/abort_time": 3.0}
    assert m.busy_whole == pytest.approx((0.5 * 10 + 0.9 * 30) / 40)
    assert m.busy_rollout == pytest.approx((0.25 * 4 + 0.5 * 12) / 16)
    broken = ModeResult(MODES["d"], error="boom")
    assert merge([a1, broken]) is broken


def test_per_round_ratios_compare_each_mode_with_sync_of_the_same_round():
    def res(key, tokens, wall):
        return ModeResult(MODES[key], trained_tokens=tokens, wall=wall)

    rounds = [[res("a", 100, 10.0), res("d", 300, 10.0)], [res("a", 100, 20.0), res("d", 200, 10.0)]]
    assert per_round_ratios(rounds) == ["(d) trained tokens/s vs sync, per round: 3.00x, 4.00x"]
