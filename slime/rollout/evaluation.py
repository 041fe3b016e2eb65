"""Eval rollout of one dataset (`--eval-prompt-data` / `--eval-config`), with its own settings.

An `EvalDatasetConfig` may set its sampling parameters, keys, samples per prompt, generate and reward
functions; what it leaves unset comes from the flags. Its prompts are read once per runtime. The group
step is handed in (slime's `generate_and_rm_group`, at `slime.rollout.sglang_rollout`). The flags come as the
rollout's config, read once per eval set by the caller; `args` only goes on to slime's data source and group step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from slime.rollout.base_types import GroupStep
from slime.rollout.current_rollout import rollout_scope
from slime.rollout.data_source import DataSource
from slime.rollout.flags import RolloutRunConfig
from slime.rollout.prompt_index import PromptIndex, carried_filter
from slime.rollout.runtime import RolloutRuntime, current
from slime.rollout.sampling_params import sampling_params_from_args
from slime.utils.types import Sample


def _dataset_setting(dataset: Any, field: str, default: Any) -> Any:
    """A per-dataset setting of `--eval-config` (an `EvalDatasetConfig` attribute), else `default`."""
    value = getattr(dataset, field, None)
    return default if value is None else value


def eval_prompts(
    config: RolloutRunConfig, dataset: Any, runtime: RolloutRuntime, carried: dict | None = None
) -> list[Sample]:
    """An eval set's prompts, read once per runtime; keyed by everything that shapes them (name, path
    with its row slice, keys), so two files or two key choices never share an entry. `carried`: the rows
    preflight's length filter dropped (`prompt_index.carried_filter`)."""
    name, path = dataset[0], dataset[1]
    rollout = config.rollout
    input_key = _dataset_setting(dataset, "input_key", rollout.eval_input_key or rollout.input_key)
    label_key = _dataset_setting(dataset, "label_key", rollout.eval_label_key or rollout.label_key)

    keys = dataset_multimodal_keys(dataset, rollout.multimodal_keys)

    def read() -> list[Sample]:
        tok = runtime.tokenizer if config.hf_checkpoint else None
        reader = dataclasses.replace(config.prompt, multimodal_keys=keys)
        generate = getattr(dataset, "custom_generate_function_path", None)  # (its prompts are read by its generate)
        if generate is not None:
            reader = dataclasses.replace(reader, custom_generate_function_path=generate)
        prompts = PromptIndex(reader, path, input_key, label_key, tok, carried=carried).read_all()
        inject = getattr(dataset, "inject_metadata", None)
        if inject is not None:  # per-dataset rm_type / metadata_overrides
            for p in prompts:
                p.metadata = inject(p.metadata)
        return prompts

    return runtime.shared(f"eval_prompts:{(name, path, input_key, label_key, keys)!r}", read)


def dataset_multimodal_keys(dataset: Any, default: Any) -> Any:
    """An eval dataset's `multimodal_keys` (`--eval-config`, as slime's: a mapping or its JSON text), else the
    flag's: one eval set may read images under another key, or none."""
    keys = _dataset_setting(dataset, "multimodal_keys", default)
    if isinstance(keys, str):
        try:
            keys = json.loads(keys)
        except json.JSONDecodeError as e:
            raise ValueError(f"--eval-config: dataset {dataset[0]!r}: multimodal_keys is not JSON: {e}") from None
    if keys is not None and not isinstance(keys, dict):
        raise ValueError(
            f"--eval-config: dataset {dataset[0]!r}: multimodal_keys must be a mapping like "
            f'{{"image": "images"}}, got {keys!r}'
        )
    return keys


def eval_sampling_params(args: Any, dataset: Any) -> dict[str, Any]:
    params = sampling_params_from_args(args, evaluation=True)
    for field, key in (
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("max_response_len", "max_new_tokens"),
        ("stop", "stop"),
        ("stop_token_ids", "stop_token_ids"),
        ("min_new_tokens", "min_new_tokens"),
    ):
        value = getattr(dataset, field, None)
        if value is not None:
            params[key] = list(value) if isinstance(value, (list, tuple)) else value
    return params


def eval_reward(config: RolloutRunConfig, sample: Sample) -> Any:
    """slime's eval reward: the reward, or its `--eval-reward-key` entry when it is a dict."""
    key = config.eval_reward_key
    return sample.reward[key] if key and isinstance(sample.reward, dict) else sample.reward


async def evaluate_dataset(
    config: RolloutRunConfig, args: Any, rollout_id: int, dataset: Any, generate_group: GroupStep
) -> dict[str, dict[str, Any]]:
    """slime's: one eval dataset, `{name: {"rewards", "truncated", "samples"}}`. Its settings come
    from the `EvalDatasetConfig` (else the flags); its `custom_generate_function_path` and
    `custom_rm_path` are set on every sample, so they replace the flags' for this dataset only."""
    with rollout_scope(rollout_id):  # the groups' tasks know the eval's rollout id (current_rollout.py)
        return await _evaluate(config, args, dataset, generate_group)


async def _evaluate(
    config: RolloutRunConfig, args: Any, dataset: Any, generate_group: GroupStep
) -> dict[str, dict[str, Any]]:
    runtime = current(args)
    name = dataset[0]
    prompts = eval_prompts(config, dataset, runtime, carried_filter(args))
    n = int(_dataset_setting(dataset, "n_samples_per_eval_prompt", config.rollout.n_samples_per_eval_prompt))
    groups = DataSource(args, prompts, n).get_samples(len(prompts))
    for s in (s for g in groups for s in g):
        s.generate_function_path = getattr(dataset, "custom_generate_function_path", None) or s.generate_function_path
        s.custom_rm_path = getattr(dataset, "custom_rm_path", None) or s.custom_rm_path
    params = eval_sampling_params(args, dataset)
    runtime.progress.reset(len(prompts) * n, phase="eval")
    results = await asyncio.gather(*(generate_group(args, g, params, evaluation=True) for g in groups))
    samples = [s for g in results for s in g]
    return {
        name: {
            "rewards": [eval_reward(config, s) for s in samples],
            "truncated": [s.status == Sample.Status.TRUNCATED for s in samples],
            "samples": samples,
        }
    }
