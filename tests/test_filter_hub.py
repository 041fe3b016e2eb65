"""slime.rollout.filter_hub: the DAPO filters loaded by their documented hub paths, the
DynamicFilterOutput contract (keep_when_insufficient) and the helpers the rollout loop uses."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from slime.rollout.filter_hub.base_types import (
    DynamicFilterOutput,
    MetricGatherer,
    apply_filter,
    call_dynamic_filter,
    should_drop_dynamic_filter_output,
)
from slime.utils.misc import load_function
from slime.utils.types import Sample

HUB = "slime.rollout.filter_hub.dynamic_sampling_filters"
ARGS = SimpleNamespace(reward_key=None)


def group(*rewards):
    return [Sample(index=i, reward=r) for i, r in enumerate(rewards)]


def test_check_reward_nonzero_std_by_its_hub_path():
    fn = load_function(f"{HUB}.check_reward_nonzero_std", "--dynamic-sampling-filter-path")
    assert fn(ARGS, group(1.0, 0.0, 1.0)) == DynamicFilterOutput(keep=True, reason=None)
    assert fn(ARGS, group(1.0, 1.0, 1.0)) == DynamicFilterOutput(keep=False, reason="zero_std_1.0")
    assert fn(ARGS, group(0.0, 0.0)) == DynamicFilterOutput(keep=False, reason="zero_std_0.0")
    assert fn(ARGS, group(0.26, 0.26)).reason == "zero_std_0.3"
    assert fn(ARGS, group(0.5, 0.5 + 1e-9)).keep is False  # within 1e-6
    assert fn(ARGS, group(1.0)) == DynamicFilterOutput(keep=False, reason="zero_std_1.0")  # one sample: no std


def test_dict_rewards_are_read_at_the_reward_key():
    fn = load_function(f"{HUB}.check_reward_nonzero_std")
    dapo_like = [Sample(reward={"score": s, "acc": s > 0}) for s in (1.0, -1.0)]
    assert fn(SimpleNamespace(reward_key="score"), dapo_like).keep is True
    assert fn(SimpleNamespace(reward_key="score"), [Sample(reward={"score": -1.0})] * 2).reason == "zero_std_-1.0"


def test_fallback_variant_keeps_a_group_only_when_the_batch_would_be_short():
    fn = load_function(f"{HUB}.check_reward_nonzero_std_with_fallback")
    out = call_dynamic_filter(fn, ARGS, group(1.0, 1.0))
    assert (out.keep, out.reason, out.keep_when_insufficient) == (False, "zero_std_1.0", True)
    assert should_drop_dynamic_filter_output(out, remaining_batch_size=3, target_data_size=2) is True
    assert should_drop_dynamic_filter_output(out, remaining_batch_size=2, target_data_size=2) is False
    assert should_drop_dynamic_filter_output(out, remaining_batch_size=1, target_data_size=2) is False
    strict = call_dynamic_filter(load_function(f"{HUB}.check_reward_nonzero_std"), ARGS, group(1.0, 1.0))
    assert strict.keep_when_insufficient is False
    assert should_drop_dynamic_filter_output(strict, remaining_batch_size=1, target_data_size=2) is True
    kept = call_dynamic_filter(fn, ARGS, group(0.0, 1.0))
    assert should_drop_dynamic_filter_output(kept, remaining_batch_size=100, target_data_size=2) is False


def test_call_dynamic_filter_accepts_older_bool_filters_and_none():
    assert call_dynamic_filter(None, ARGS, group(1.0)) == DynamicFilterOutput(keep=True)
    assert call_dynamic_filter(lambda a, g: True, ARGS, group(1.0)) == DynamicFilterOutput(keep=True)
    assert call_dynamic_filter(lambda a, g: False, ARGS, group(1.0)) == DynamicFilterOutput(
        keep=False, reason="filtered"
    )
    assert call_dynamic_filter(lambda a, g: np.bool_(False), ARGS, group(1.0)).keep is False
    out = call_dynamic_filter(lambda a, g: DynamicFilterOutput(keep=np.bool_(True)), ARGS, group(1.0))
    assert out.keep is True  # normalized to a Python bool
    with pytest.raises(TypeError, match="returned None: expected DynamicFilterOutput or bool"):
        call_dynamic_filter(lambda a, g: None, ARGS, group(1.0))


def test_apply_filter_is_one_group_through_call_dynamic_filter():
    fn = load_function(f"{HUB}.check_reward_nonzero_std")
    assert apply_filter(fn, ARGS, group(0.0, 1.0)).keep is True
    assert apply_filter(lambda a, g: len(g) > 2, ARGS, group(0.0, 1.0)) == DynamicFilterOutput(False, "filtered")


def test_metric_gatherer_counts_drops_by_reason_under_slime_names():
    m = MetricGatherer()
    for reason in ("zero_std_1.0", "zero_std_0.0", "zero_std_1.0", None, ""):
        m.on_dynamic_filter_drop(reason)
    assert m.collect() == {"rollout/dynamic_filter/drop_zero_std_1.0": 2, "rollout/dynamic_filter/drop_zero_std_0.0": 1}


def test_dynamic_filter_output_is_one_class_at_both_paths():
    from slime.rollout import base_types

    assert base_types.DynamicFilterOutput is DynamicFilterOutput
    assert DynamicFilterOutput(keep=True) == DynamicFilterOutput(True, None, False)
