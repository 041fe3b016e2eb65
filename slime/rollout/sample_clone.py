"""`clone_sample`: one of a group's samples, copied from its prompt's template as `copy.deepcopy` would.

Why not `copy.deepcopy` itself: a group is `n_samples_per_prompt` copies of one template, and deepcopy
walks every token id one call at a time and rebuilds the nested dataclasses through `__reduce_ex__`:
a quarter of the default rollout path's CPU in `bench_rollout_overhead` (profiled with a CPU-time
clock). Here values that cannot change (str, numbers, None, Enum members) are shared, a list of ints
(token ids) is copied at C speed, empty dicts and lists and the flat counters (`SpecInfo`,
`PrefixCacheInfo`) are made anew, and anything else goes to `copy.deepcopy` with one memo for the
whole sample, so objects shared between fields stay shared in the copy, as deepcopy keeps them.
A subclass of Sample (its own copy hooks, slots) is copied by `copy.deepcopy` unchanged.
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


def clone_sample(template: Sample) -> Sample:
    """A copy of `template` sharing no mutable object with it (what `copy.deepcopy(template)` gives)."""
    if type(template) is not Sample:
        return copy.deepcopy(template)
    memo: dict[int, Any] = {}
    new = object.__new__(Sample)
    memo[id(template)] = new
    new.__dict__.update({name: _copy(value, memo) for name, value in template.__dict__.items()})
    return new
