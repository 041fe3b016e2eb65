"""`EncodedIds`: a prompt carries its JSON text, built turn by turn from the deltas, and a request
body written from it is exactly the JSON of the plain body (so the engine reads the same ids)."""

from __future__ import annotations

import json

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from slime.fleet import sglang_payloads as payloads
from slime.utils import encoded_ids
from slime.utils.encoded_ids import EncodedIds, dumps

ids = st.lists(st.integers(0, 200_000), max_size=20)


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


def test_encoded_ids_refuse_a_change_in_place_that_would_leave_their_text_stale():
    ids = EncodedIds([1, 2, 3])
    for change in (
        lambda: ids.append(4),
        lambda: ids.extend([4]),
        lambda: ids.__setitem__(0, 9),
        lambda: ids.__delitem__(0),
        lambda: ids.pop(),
        lambda: ids.__iadd__([4]),
        lambda: ids.sort(),
    ):
        with pytest.raises(TypeError, match="cannot change in place"):
            change()
    assert list(ids) == [1, 2, 3] and json.loads(f"[{ids.text}]") == [1, 2, 3]
    longer = ids.extended([4, 5])
    assert list(longer) == [1, 2, 3, 4, 5] and json.loads(f"[{longer.text}]") == [1, 2, 3, 4, 5]
    assert ids + [4] == [1, 2, 3, 4]  # a new plain list: nothing stale
