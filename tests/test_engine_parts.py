"""The embedded engine's parts on their own, without a model or a server: finish rules, sampling, the
running batch's padded KV cache. (The whole engine is tested over HTTP in test_hf_engine.py.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.engine.finish_rules import finish_reason, stop_ids
from slime.engine.request import Request
from slime.engine.running_batch import RunningBatch
from slime.engine.sampling import SamplingParams, sample_token, sampled_logprob, seeded_generator, top_p_threshold


class CharTokenizer:
    """Token id i decodes to chr(i): stop strings can be matched exactly."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids)


def make_request(output_ids: list[int], rid: str = "r", **params) -> Request:
    loop = asyncio.new_event_loop()
    try:
        req = Request(
            rid=rid,
            input_ids=[1, 2],
            params=SamplingParams(**params),
            return_logprob=False,
            loop=loop,
            future=loop.create_future(),
            stream=None,
        )
    finally:
        loop.close()
    req.output_ids = list(output_ids)
    req.stop_ids = stop_ids(req.params.stop_token_ids, req.params.ignore_eos, frozenset({0}))
    return req


def test_a_stop_token_on_the_last_allowed_token_is_reported_as_stop_not_length():
    req = make_request([ord("a"), 7], max_new_tokens=2, stop_token_ids=[7])
    assert finish_reason(req, CharTokenizer()) == {"type": "stop", "matched": 7}


def test_stop_tokens_and_strings_count_only_once_min_new_tokens_exist():
    tok = CharTokenizer()
    assert finish_reason(make_request([0], max_new_tokens=5, min_new_tokens=2), tok) is None
    assert finish_reason(make_request([ord("x"), 0], max_new_tokens=5, min_new_tokens=2), tok) == {
        "type": "stop",
        "matched": 0,
    }
    assert (
        finish_reason(make_request([ord("a"), ord("b")], max_new_tokens=5, min_new_tokens=3, stop=["ab"]), tok) is None
    )
    assert finish_reason(make_request([ord("a"), ord("b")], max_new_tokens=5, stop=["zz", "ab"]), tok) == {
        "type": "stop",
        "matched": "ab",
    }


def test_ignore_eos_drops_the_models_eos_but_keeps_the_requests_stop_ids():
    assert stop_ids([5], ignore_eos=True, eos_ids=frozenset({0})) == frozenset({5})
    assert stop_ids([5], ignore_eos=False, eos_ids=frozenset({0})) == frozenset({0, 5})
    req = make_request([0], max_new_tokens=1, ignore_eos=True)
    assert finish_reason(req, CharTokenizer()) == {"type": "length", "length": 1}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=1500), st.floats(0.01, 1.0))
def test_the_top_p_threshold_is_the_smallest_probability_of_the_nucleus(weights, top_p):
    probs = torch.tensor(weights, dtype=torch.float32) + 1e-3
    probs = probs / probs.sum()
    ordered = torch.sort(probs, descending=True).values
    n = min(int(torch.searchsorted(torch.cumsum(ordered, 0), torch.tensor([top_p]))), len(ordered) - 1)
    assert float(top_p_threshold(probs, top_p)) == float(ordered[n])


def test_a_seeded_draw_repeats_and_banned_ids_never_win():
    logits = torch.tensor([0.0, 5.0, 1.0, 4.9, -2.0])
    params = SamplingParams(temperature=0.7, top_k=2)
    gen_a, gen_b = seeded_generator(11), seeded_generator(11)
    first = [sample_token(logits, params, gen_a) for _ in range(20)]
    again = [sample_token(logits, params, gen_b) for _ in range(20)]
    assert first == again and set(first) == {1, 3}  # the two best
    gen = seeded_generator(3)
    assert {sample_token(logits, params, gen, banned={1, 3}) for _ in range(50)} == {0, 2}  # the best two left
    assert sample_token(logits, SamplingParams(temperature=0), None, banned={1}) == 3


def test_the_reported_log_prob_is_taken_before_truncation_at_the_requests_temperature():
    logits = torch.tensor([2.0, 1.0, 0.0])
    hot = SamplingParams(temperature=2.0, top_k=1)
    assert sampled_logprob(logits, hot, 0) == float(torch.log_softmax(logits / 2.0, dim=-1)[0])
    greedy = SamplingParams(temperature=0)
    assert sampled_logprob(logits, greedy, 0) == float(torch.log_softmax(logits, dim=-1)[0])


def layer_cache(rows: int, length: int, fill: float) -> SimpleNamespace:
    kv = torch.full((rows, 1, length, 2), fill)
    return SimpleNamespace(layers=[SimpleNamespace(keys=kv.clone(), values=kv.clone())])


def test_a_joining_request_is_left_padded_and_padding_is_trimmed_when_the_long_row_leaves():
    batch = RunningBatch()
    long_req, short_req = make_request([], rid="long"), make_request([], rid="short")
    batch.add(long_req, layer_cache(1, 4, 1.0), 4, token=9)
    batch.add(short_req, layer_cache(1, 2, 2.0), 2, token=8)
    assert batch.mask.tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert batch.next_pos.tolist() == [4, 2] and batch.pending.tolist() == [9, 8]
    assert batch.cache.layers[0].keys[1, 0, :, 0].tolist() == [0.0, 0.0, 2.0, 2.0]
    long_req.done = True
    batch.drop_finished()
    assert batch.rows == [short_req]
    assert batch.mask.tolist() == [[1, 1]]
    assert batch.cache.layers[0].values[:, 0, :, 0].tolist() == [[2.0, 2.0]]
    short_req.done = True
    batch.drop_finished()
    assert batch.rows == [] and batch.cache is None and batch.mask is None
