"""`EncodedIds`: a prompt carries its JSON text, built turn by turn from the deltas, and a request
body written from it is exactly the JSON of the plain body (so the engine reads the same ids)."""

from __future__ import annotations

import json
import pickle

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from slime.fleet import sglang_payloads as payloads
from slime.utils import encoded_ids
from slime.utils.encoded_ids import EncodedIds, body_pieces

ids = st.lists(st.integers(0, 200_000), max_size=20)


def dumps(body: dict) -> str:
    """The body as the connection writes it."""
    return b"".join(body_pieces(body)).decode()


@settings(max_examples=100, deadline=None)
@given(first=ids, parts=st.lists(ids, max_size=4), rid=st.text(max_size=5))
def test_a_body_written_from_encoded_ids_is_the_json_of_the_plain_body(first, parts, rid):
    encoded = EncodedIds(first).extended(*parts)
    plain = first + [i for p in parts for i in p]
    assert encoded == plain
    body = payloads.generate(encoded, {"max_new_tokens": 4}, rid=rid)
    assert body["input_ids"] is encoded  # not copied id by id
    assert json.loads(dumps(body)) == json.loads(json.dumps({**body, "input_ids": plain}))


def test_extending_a_prompt_encodes_only_the_new_ids(monkeypatch):
    encoded_lengths = []
    real = encoded_ids.ids_text
    monkeypatch.setattr(encoded_ids, "ids_text", lambda x: encoded_lengths.append(len(x)) or real(x))
    prompt = EncodedIds(list(range(10_000)))
    for turn in range(5):
        prompt = prompt.extended([1, 2, 3], [4, 5])
    assert encoded_lengths == [10_000] + [3, 2] * 5
    assert json.loads(dumps({"input_ids": prompt})) == {"input_ids": list(range(10_000)) + [1, 2, 3, 4, 5] * 5}


def test_encoded_ids_cannot_change_so_their_text_is_always_their_ids():
    ids = EncodedIds([1, 2, 3])
    for change in (
        lambda: ids.__setitem__(0, 9),
        lambda: ids.__delitem__(0),
        lambda: ids.append(4),
        lambda: setattr(ids, "other", 1),
    ):
        with pytest.raises((TypeError, AttributeError)):
            change()
    given = [1, 2, 3]
    copied = EncodedIds(given)
    given.append(4)  # the caller's list is not the one kept
    assert list(copied) == [1, 2, 3] and json.loads(f"[{copied.text}]") == [1, 2, 3]
    longer = ids.extended([4, 5])
    assert list(longer) == [1, 2, 3, 4, 5] and json.loads(f"[{longer.text}]") == [1, 2, 3, 4, 5]
    assert ids + [4] == [1, 2, 3, 4] and type(ids + [4]) is list  # a new plain list: nothing stale
    assert [0] + ids == [0, 1, 2, 3] and type([0] + ids) is list


def test_an_extended_prompt_shares_the_prompt_it_extends_instead_of_copying_it():
    """Turn k+1's prompt holds turn k's parts themselves: a turn costs its delta, not its history."""
    prompt = EncodedIds(list(range(10_000)))
    first = prompt.parts[0]
    for turn in range(50):
        prompt = prompt.extended([1, 2, 3], [turn])
    assert prompt.parts[0] is first and len(prompt) == 10_000 + 50 * 4
    assert prompt[-1] == 49 and prompt[10_000:10_004] == [1, 2, 3, 0]


@settings(max_examples=150, deadline=None)
@given(first=ids, parts=st.lists(st.tuples(ids, st.booleans()), max_size=6), data=st.data())
def test_encoded_ids_read_as_the_plain_list_of_their_ids(first, parts, data):
    """Parts given as lists, or as `EncodedIds` (their parts and text taken as they are)."""
    encoded = EncodedIds(first).extended(*(EncodedIds(p) if whole else p for p, whole in parts))
    plain = first + [i for p, _ in parts for i in p]
    n = len(plain)
    assert len(encoded) == n and list(encoded) == plain and encoded == plain and plain == encoded
    assert encoded != tuple(plain) and encoded == EncodedIds(plain) and encoded != plain + [0]  # as a list compares
    assert json.loads(f"[{encoded.text}]") == plain
    index = data.draw(st.integers(-n - 2, n + 2))
    if -n <= index < n:
        assert encoded[index] == plain[index]
    else:
        with pytest.raises(IndexError):
            encoded[index]
    cut = slice(
        data.draw(st.none() | st.integers(-n - 3, n + 3)),
        data.draw(st.none() | st.integers(-n - 3, n + 3)),
        data.draw(st.none() | st.sampled_from([1, 2, -1, -3])),
    )
    assert encoded[cut] == plain[cut] and type(encoded[cut]) is list
    assert pickle.loads(pickle.dumps(encoded)) == plain
    assert json.loads(f"[{pickle.loads(pickle.dumps(encoded)).text}]") == plain
