"""`clone_sample` (a group's copies of its prompt's template) gives what `copy.deepcopy` gives."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from slime.rollout.data_source import DataSource
from slime.rollout.sample_clone import clone_group, clone_sample
from slime.utils.types import Sample

scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=4))
nested = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=8,
)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": st.text(max_size=5)}), max_size=3
)


@st.composite
def templates(draw) -> Sample:
    s = Sample(
        prompt=draw(st.one_of(st.text(max_size=5), messages)),
        tokens=draw(st.lists(st.integers(0, 50_000), max_size=40)),
        label=draw(nested),
        metadata=draw(st.dictionaries(st.text(max_size=3), nested, max_size=3)),
        status=draw(st.sampled_from(list(Sample.Status))),
        train_metadata=draw(st.none() | st.just({"k": [1]})),
    )
    s.spec_info.spec_verify_ct = draw(st.integers(0, 3))
    if draw(st.booleans()):  # one object under two fields: deepcopy keeps it shared in the copy
        s.multimodal_inputs = s.metadata
    return s


def _containers(value, seen=None) -> dict[int, object]:
    """Every mutable object reachable from `value` (by id)."""
    seen = {} if seen is None else seen
    if isinstance(value, (str, int, float, bool, type(None), Sample.Status)) or id(value) in seen:
        return seen
    seen[id(value)] = value
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else vars(value).values()
    for v in items:
        _containers(v, seen)
    return seen


@settings(max_examples=30)
@given(templates())
def test_a_clone_equals_deepcopy_and_shares_nothing_mutable(template: Sample) -> None:
    clone, reference = clone_sample(template), copy.deepcopy(template)
    assert type(clone) is Sample
    assert clone.to_dict() == reference.to_dict()
    assert not set(_containers(clone)) & set(_containers(template))
    assert (clone.multimodal_inputs is clone.metadata) == (reference.multimodal_inputs is reference.metadata)
    clone.tokens.append(1)
    clone.metadata["new"] = 1
    clone.spec_info.spec_verify_ct += 1
    assert template.to_dict() == reference.to_dict()  # the template is untouched


@settings(max_examples=30, deadline=None)
@given(templates(), st.integers(1, 4))
def test_a_group_of_clones_equals_deepcopies_sharing_nothing_mutable(template: Sample, n: int) -> None:
    reference = copy.deepcopy(template)
    group = clone_group(template, n)
    assert len(group) == n and all(type(c) is Sample for c in group)
    owned = [set(_containers(c)) - {id(c)} for c in group]
    for i, clone in enumerate(group):
        assert clone.to_dict() == reference.to_dict()
        assert list(vars(clone)) == list(vars(template))  # same fields, same order
        assert (clone.multimodal_inputs is clone.metadata) == (reference.multimodal_inputs is reference.metadata)
        assert not owned[i] & set(_containers(template))
        assert all(not owned[i] & owned[j] for j in range(n) if j != i)  # the clones share nothing mutable
    group[0].tokens.append(1)
    group[0].metadata["new"] = 1
    group[0].spec_info.spec_verify_ct += 1
    assert template.to_dict() == reference.to_dict()
    assert all(c.to_dict() == reference.to_dict() for c in group[1:])


def test_a_subclass_is_deep_copied_with_its_own_hooks() -> None:
    class Tagged(Sample):
        def __deepcopy__(self, memo):
            out = Tagged(tokens=list(self.tokens))
            out.metadata["copied_by"] = "hook"
            return out

    clone = clone_sample(Tagged(tokens=[1, 2]))
    assert type(clone) is Tagged and clone.metadata == {"copied_by": "hook"}


def test_the_data_source_hands_out_independent_copies(tmp_path) -> None:
    import argparse

    args = argparse.Namespace(rollout_seed=0, buffer_filter_path=None)
    template = Sample(prompt=[{"role": "user", "content": "hi"}], tokens=[1, 2, 3], label="x", metadata={"m": [1]})
    source = DataSource(args, [template], 3)
    (group,) = source.get_samples(1)
    assert [s.index for s in group] == [0, 1, 2] and {s.group_index for s in group} == {0}
    group[0].prompt[0]["content"] = "changed"
    group[0].metadata["m"].append(2)
    assert [s.prompt[0]["content"] for s in group[1:]] == ["hi", "hi"] and template.metadata == {"m": [1]}
