"""`clone_sample`: one of a group's samples, copied from its prompt's template as `copy.deepcopy` would.

Why not `copy.deepcopy` itself: a group is `n_samples_per_prompt` copies of one template, and deepcopy
walks every token id one call at a time and rebuilds the nested dataclasses through `__reduce_ex__`:
a quarter of the default rollout path's CPU in `bench_rollout_overhead` (profiled with a CPU-time
clock). Here values that cannot change (str, numbers, None, Enum members) are shared, a list of ints
(token ids) is copied at C speed, empty dicts and lists and the flat counters (`SpecInfo`,
`PrefixCacheInfo`) are made anew, and anything else goes to `copy.deepcopy` with one memo for the
whole sample, so objects shared between fields stay shared in the copy, as deepcopy keeps them.
A subclass of Sample (its own copy hooks, slots) is copied by `copy.deepcopy` unchanged.

`clone_group(template, n)` makes a group's `n` copies from one look at the template: which fields hold
values that cannot change (shared, through one C-speed copy of the attribute dict) and how each other
field is copied are decided once, not for each copy (the per-field checks were most of a clone's CPU).
"""

from __future__ import annotations

import copy
from enum import Enum
from typing import Any

from slime.utils.types import Sample

_IMMUTABLE = frozenset({str, int, float, bool, bytes, complex, type(None)})
_FLAT_COUNTERS = frozenset({Sample.SpecInfo, Sample.PrefixCacheInfo})


def _copy(value: Any, memo: dict[int, Any]) -> Any:
    kind = type(value)
    if kind in _IMMUTABLE or isinstance(value, Enum):
        return value
    done = memo.get(id(value))
    if done is not None:
        return done
    if kind is list and all(type(x) is int for x in value):  # token ids (also the empty list)
        new: Any = value.copy()
    elif kind is dict and not value:
        new = {}
    elif kind in _FLAT_COUNTERS and all(type(v) is int for v in value.__dict__.values()):
        new = object.__new__(kind)
        new.__dict__.update(value.__dict__)
    else:
        return copy.deepcopy(value, memo)
    memo[id(value)] = new
    return new


def _is_immutable(value: Any) -> bool:
    return type(value) in _IMMUTABLE or isinstance(value, Enum)


def _copier(value: Any) -> Any:
    """How a field's value is copied for every clone of a group (decided once per template), or None
    when only `copy.deepcopy` (with the clone's memo) copies it right."""
    kind = type(value)
    if kind is list and all(type(x) is int for x in value):  # token ids (also the empty list)
        return list.copy
    if kind is dict and not value:
        return lambda _: {}
    if kind in _FLAT_COUNTERS and all(type(v) is int for v in value.__dict__.values()):

        def counter(v: Any) -> Any:
            new = object.__new__(kind)
            new.__dict__.update(v.__dict__)
            return new

        return counter
    return None


def clone_group(template: Sample, n: int) -> list[Sample]:
    """`n` copies of `template`, each what `clone_sample(template)` gives; the template must not change
    while they are made."""
    if type(template) is not Sample:
        return [copy.deepcopy(template) for _ in range(n)]
    fields = template.__dict__
    # (field, value, copier; None: copy.deepcopy), in field order, for the fields whose values may change
    plan = [(name, value, _copier(value)) for name, value in fields.items() if not _is_immutable(value)]
    simple = all(c is not None for _, _, c in plan) and len({id(v) for _, v, _ in plan}) == len(plan)
    out = []
    for _ in range(n):
        new = object.__new__(Sample)
        attrs = new.__dict__
        attrs.update(fields)  # the immutable values, shared, in the template's field order
        if simple:  # no field aliases another, none needs deepcopy
            for name, value, copier in plan:
                attrs[name] = copier(value)
        else:  # one memo for the whole clone, filled in field order, as `clone_sample` does
            memo: dict[int, Any] = {id(template): new}
            for name, value, copier in plan:
                done = memo.get(id(value))
                if done is None:
                    if copier is None:
                        done = copy.deepcopy(value, memo)
                    else:
                        done = memo[id(value)] = copier(value)
                attrs[name] = done
        out.append(new)
    return out


def clone_sample(template: Sample) -> Sample:
    """A copy of `template` sharing no mutable object with it (what `copy.deepcopy(template)` gives)."""
    if type(template) is not Sample:
        return copy.deepcopy(template)
    memo: dict[int, Any] = {}
    new = object.__new__(Sample)
    memo[id(template)] = new
    new.__dict__.update({name: _copy(value, memo) for name, value in template.__dict__.items()})
    return new
