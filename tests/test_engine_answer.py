"""`parse_generate_answer`: every `/generate` answer is a consistent output or a classified bad
answer (field named), never another exception, never a NaN, an invented log-prob or a dropped id."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slime.rollout.engine_answer import LOGPROB_TOLERANCE, BadAnswer, EngineOutput, parse_generate_answer, router_fault

VOCAB, MAX_NEW = 50, 6


def good(ids=(3, 4, 5), lps=(-0.5, -1.0, -0.25), finish="length", **top):
    return {
        "text": "abc",
        "output_ids": list(ids),
        **top,
        "meta_info": {
            "id": "r",
            "finish_reason": {"type": finish, "matched": None},
            "weight_version": "2",
            "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)],
        },
    }


def parse(body):
    return parse_generate_answer(body, vocab_size=VOCAB, max_new_tokens=MAX_NEW)


def field_of(body) -> str:
    with pytest.raises(BadAnswer) as e:
        parse(body)
    assert e.value.reason == f"engine_bad_answer:{e.value.field}"
    return e.value.field


def test_a_good_answer_is_read_as_sent():
    out = parse(json.dumps(good()).encode())
    assert (out.token_ids, out.log_probs, out.finish_type, out.weight_version, out.text) == (
        [3, 4, 5],
        [-0.5, -1.0, -0.25],
        "length",
        "2",
        "abc",
    )


def test_a_string_finish_reason_and_no_output_ids_are_sglang_shapes_too():
    body = good()
    del body["output_ids"]
    body["meta_info"]["finish_reason"] = "stop"
    out = parse(body)
    assert (out.token_ids, out.finish_type) == ([3, 4, 5], "stop")


@pytest.mark.parametrize(
    "raw, field",
    [
        (b'{"text": "abc", "meta_info": {"id": "r", "finish_re', "body"),  # truncated JSON
        (b"[1, 2, 3]", "body"),  # a JSON list
        (b"<html><body>502 Bad Gateway</body></html>", "body"),
        (b"\xff\xfe not utf-8", "body"),
        (b"", "body"),
    ],
)
def test_bodies_that_are_not_a_json_object(raw, field):
    assert field_of(raw) == field


def test_a_200_without_meta_info_is_refused_not_given_zero_log_probs():
    assert field_of({"text": "abc", "output_ids": [3, 4]}) == "meta_info"


@pytest.mark.parametrize("lp", [float("nan"), float("-inf"), float("inf"), 0.5, None, "-0.1", True])
def test_log_probs_must_be_finite_numbers_at_most_zero(lp):
    assert field_of(good(lps=(-0.5, lp, -0.25))) == "logprob"


def test_a_rounding_step_above_zero_is_kept_as_sent_and_more_is_refused():
    out = parse(good(lps=(-0.5, LOGPROB_TOLERANCE, 0.0)))
    assert out.log_probs == [-0.5, LOGPROB_TOLERANCE, 0.0]
    assert field_of(good(lps=(-0.5, LOGPROB_TOLERANCE * 2, 0.0))) == "logprob"


def test_nan_written_as_a_bare_json_token_is_refused():
    raw = json.dumps(good(lps=(-0.5, float("nan"), -0.25))).encode()
    assert b"NaN" in raw and field_of(raw) == "logprob"


@pytest.mark.parametrize("tid", [10**9, -5, VOCAB, 3.0, "3", None, False])
def test_token_ids_must_be_integers_inside_the_vocabulary(tid):
    assert field_of(good(ids=(3, tid, 5))) == "token_id"


def test_the_last_id_of_the_vocabulary_is_accepted():
    assert parse(good(ids=(0, VOCAB - 1, 5))).token_ids == [0, VOCAB - 1, 5]


def test_log_probs_shorter_than_the_ids_are_refused_not_dropped():
    body = good()
    body["output_ids"] = [3, 4, 5, 6]
    assert field_of(body) == "output_ids"


def test_more_tokens_than_max_new_tokens_are_refused():
    n = MAX_NEW + 5
    assert field_of(good(ids=[7] * n, lps=[-0.1] * n)) == "output_ids"
    assert len(parse(good(ids=[7] * MAX_NEW, lps=[-0.1] * MAX_NEW)).token_ids) == MAX_NEW


@pytest.mark.parametrize(
    "meta_change, field",
    [
        ({"finish_reason": {"type": "done"}}, "finish_reason"),
        ({"finish_reason": None}, "finish_reason"),
        ({"output_token_logprobs": None}, "output_token_logprobs"),
        ({"output_token_logprobs": [[-0.1]]}, "output_token_logprobs"),
        ({"output_token_logprobs": {"0": [-0.1, 3]}}, "output_token_logprobs"),
        ({"weight_version": 3}, "weight_version"),
    ],
)
def test_meta_info_fields(meta_change, field):
    body = good()
    body["meta_info"].update(meta_change)
    if field == "output_token_logprobs":
        del body["output_ids"]
    assert field_of(body) == field


def test_the_error_names_the_item_with_a_short_excerpt():
    with pytest.raises(BadAnswer) as e:
        parse(good(ids=(3, 10**9, 5)))
    assert (
        str(e.value) == f"bad engine answer (token_id): item 1: must be an integer in [0, {VOCAB}): "
        f"[-1.0, 1000000000, None]"
    )
    with pytest.raises(BadAnswer) as e:
        parse(b"<html>" + b"x" * 5000)
    assert len(str(e.value)) < 400 and str(e.value).endswith("...")


def test_the_routers_code_for_a_cut_answer_is_its_own_reason():
    cut = '{"error":{"type":"Internal Server Error","code":"read_response_body_failed","message":"..."}}'
    assert router_fault(500, cut) == "answer_cut"
    assert router_fault(503, '{"error":{"code":"no_available_workers"}}') is None
    assert router_fault(502, "<html>") is None and router_fault(500, "[1]") is None


# ---- property: malformed bodies ----

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def mutated_answers(draw):
    """A good answer with one part replaced by anything JSON can hold, or garbage bytes."""
    n = draw(st.integers(0, MAX_NEW + 2))
    body = good(
        ids=[draw(st.integers(-2, VOCAB + 2)) for _ in range(n)],
        lps=[draw(st.floats(allow_nan=True, allow_infinity=True)) for _ in range(n)],
        finish=draw(st.sampled_from(["stop", "length", "abort", "other"])),
    )
    where = draw(st.sampled_from(["none", "top", "meta", "pair", "pairs", "cut", "bytes"]))
    if where == "top":
        body[draw(st.sampled_from(["text", "output_ids", "meta_info"]))] = draw(json_values)
    elif where == "meta":
        body["meta_info"][draw(st.sampled_from(["finish_reason", "output_token_logprobs", "weight_version"]))] = draw(
            json_values
        )
    elif where == "pair" and n:
        body["meta_info"]["output_token_logprobs"][draw(st.integers(0, n - 1))] = draw(json_values)
    elif where == "pairs":
        body["meta_info"]["output_token_logprobs"] = draw(json_values)
    raw = json.dumps(body).encode()
    if where == "cut":
        return raw[: draw(st.integers(0, len(raw)))]
    if where == "bytes":
        return draw(st.binary(max_size=64))
    return raw if draw(st.booleans()) else body


@given(mutated_answers())
@settings(max_examples=400, deadline=None)
def test_any_answer_is_a_consistent_output_or_a_classified_bad_answer(body):
    try:
        out = parse(body)
    except BadAnswer as e:
        assert e.reason.startswith("engine_bad_answer:") and str(e)
        return
    assert isinstance(out, EngineOutput) and out.finish_type in {"stop", "length", "abort"}
    assert len(out.token_ids) == len(out.log_probs) <= MAX_NEW
    assert all(type(t) is int and 0 <= t < VOCAB for t in out.token_ids)
    assert all(math.isfinite(lp) and lp <= LOGPROB_TOLERANCE for lp in out.log_probs)
    sent = json.loads(body) if isinstance(body, bytes) else body
    assert out.token_ids == [p[1] for p in sent["meta_info"]["output_token_logprobs"]]  # nothing dropped
    assert out.log_probs == [p[0] for p in sent["meta_info"]["output_token_logprobs"]]  # nothing invented


def test_top_log_probs_asked_for_are_read_per_position_and_checked_like_the_sampled_ones():
    body = good()
    body["meta_info"]["output_top_logprobs"] = [
        [[-0.1, 9, None], [-0.5, 3, None]],
        [[-0.2, 4, "x"]],
        [[-0.25, 5, None], [-3.0, 1, None]],
    ]
    out = parse_generate_answer(body, vocab_size=VOCAB, top_logprobs_num=2)
    assert out.top_log_probs == [[(-0.1, 9), (-0.5, 3)], [(-0.2, 4)], [(-0.25, 5), (-3.0, 1)]]
    assert parse(body).top_log_probs == []  # not asked: not read
    for broken in ([[[-0.1, 9, None]]], [[[0.5, 9, None]], [], []], [[[-0.1, VOCAB, None]], [], []], None):
        body["meta_info"]["output_top_logprobs"] = broken
        with pytest.raises(BadAnswer):
            parse_generate_answer(body, vocab_size=VOCAB, top_logprobs_num=2)


pair_items = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-3, VOCAB + 3),
    st.booleans(),
    st.none(),
    st.just("x"),
)
pair_lists = st.lists(
    st.one_of(
        st.tuples(st.one_of(st.floats(max_value=0.5), st.just(math.nan)), st.integers(-1, VOCAB + 1), st.none()).map(
            list
        ),
        st.lists(pair_items, max_size=3),
        st.tuples(st.floats(max_value=0.0), st.integers(0, VOCAB - 1)),
        pair_items,
    ),
    max_size=6,
)


@given(pair_lists)
@settings(max_examples=300, deadline=None)
def test_the_whole_answer_check_agrees_with_the_per_item_check(pairs):
    """`_pairs` checks a JSON-shaped answer in whole-list passes; `_each_pair` (the per-item loop, which names
    the bad item) must give the same ids and log-probs, or the same refusal, for any list."""
    from slime.rollout.engine_answer import _each_pair, _pairs

    def outcome(fn):
        try:
            ids, lps = fn()
        except BadAnswer as e:
            return ("refused", e.field, str(e))
        return ("read", [(type(t), t) for t in ids], [(type(lp), lp) for lp in lps])

    whole = outcome(lambda: _pairs({"output_token_logprobs": pairs}, VOCAB))
    each = outcome(lambda: _each_pair(pairs, VOCAB, VOCAB))
    assert whole == each


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-32"])
def test_an_answer_as_bytes_reads_as_json_reads_them_in_any_json_encoding(encoding):
    # UTF-8 bytes are decoded before json.loads (the fast path); what does not parse so (a BOM, UTF-16/32)
    # still reads as json.loads reads bytes
    text = json.dumps(good(), ensure_ascii=False).replace('"abc"', '"abc é"')
    out = parse(text.encode(encoding))
    assert (out.token_ids, out.log_probs, out.text) == ([3, 4, 5], [-0.5, -1.0, -0.25], "abc é")


def test_bytes_that_are_not_utf8_are_a_bad_body():
    assert field_of(json.dumps(good()).encode()[:-1] + b"\xff}") == "body"
