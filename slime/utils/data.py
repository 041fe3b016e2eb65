"""slime's data helpers at `slime.utils.data`: row reading with the `path@[start:end]` slice,
the prompt-length filter, slime's `Dataset` (a prompt file as Samples, shuffled per epoch), and the
trainer's view of one rank's rollout data.

`read_file` streams rows (a negative slice bound needs the row count, so only then are the rows
listed first). A malformed JSON line is an error naming the file and line, not a skipped row.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import re
from typing import Any, Iterator

from slime.utils.types import Sample

logger = logging.getLogger(__name__)

_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")


def _parse_generalized_path(s: str) -> tuple[str, slice | None]:
    """`"f.jsonl@[3:-1]"` -> `("f.jsonl", slice(3, -1))`; a plain path -> `(path, None)`."""
    m = _SLICE.match(s)
    if m is None:
        return s, None
    bound = [int(x) if x else None for x in (m.group("start"), m.group("end"))]
    return m.group("path"), slice(*bound)


def _jsonl_rows(path: str) -> Iterator[Any]:
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None


def _parquet_rows(path: str) -> Iterator[Any]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches():
        yield from batch.to_pylist(maps_as_pydicts="lossy")  # a map<k,v> column is a dict, as in JSON


def read_file(path: str) -> Iterator[Any]:
    """The rows of a `.jsonl` or `.parquet` file, sliced by an optional `@[start:end]` suffix with
    Python's semantics (negative bounds count from the end)."""
    real_path, row_slice = _parse_generalized_path(path)
    if not os.path.exists(real_path):
        raise FileNotFoundError(f"Prompt dataset path '{real_path}' does not exist.")
    if real_path.endswith(".jsonl"):
        rows = _jsonl_rows(real_path)
    elif real_path.endswith(".parquet"):
        rows = _parquet_rows(real_path)
    else:
        raise ValueError(f"Unsupported file format: {real_path}. Supported formats are .jsonl and .parquet.")
    if row_slice is None:
        yield from rows
    elif (row_slice.start or 0) < 0 or (row_slice.stop or 0) < 0:
        yield from list(rows)[row_slice]
    else:
        yield from itertools.islice(rows, row_slice.start, row_slice.stop)


def _has_multimodal(sample: Sample) -> bool:
    return bool(sample.multimodal_inputs) and any(v is not None for v in sample.multimodal_inputs.values())


def _prompt_length(sample: Sample, processor: Any) -> int:
    from slime.utils.processing_utils import process_vision_info

    inputs = process_vision_info(sample.prompt, processor)
    return len(processor(text=sample.prompt, **inputs)["input_ids"][0])


def filter_long_prompt(
    origin_samples: list[Sample], tokenizer: Any, processor: Any, max_length: int | None
) -> list[Sample]:
    """The samples whose prompt is at most `max_length` tokens, in their original order. Text prompts
    are tokenised in one batch; with a processor, multimodal ones one at a time through it. Message
    lists (no chat template applied) cannot be measured and are all kept."""
    if max_length is None or not origin_samples:
        return origin_samples
    if not isinstance(origin_samples[0].prompt, str):
        logger.warning(
            "Skipping max_length check for list prompt. Set apply_chat_template=True to enable length filtering."
        )
        return origin_samples
    text = [i for i, s in enumerate(origin_samples) if not (processor and _has_multimodal(s))]
    lengths: dict[int, int] = {}
    if text:
        ids = tokenizer([origin_samples[i].prompt for i in text], add_special_tokens=False)["input_ids"]
        lengths.update(zip(text, map(len, ids)))
    for i, s in enumerate(origin_samples):
        if i not in lengths:
            lengths[i] = _prompt_length(s, processor)
    kept = [s for i, s in enumerate(origin_samples) if lengths[i] <= max_length]
    logger.info("Filtered %d samples longer than max_length=%d.", len(origin_samples) - len(kept), max_length)
    return kept


def process_rollout_data(args: Any, rollout_data_ref: list[Any], dp_rank: int, dp_size: int) -> dict[str, Any]:
    """This rank's rollout data from its `Box(ray.put(...))`: `total_lengths` narrowed to the rank's
    samples (`partition`), `raw_reward` kept whole (pass-rate metrics reshape it by group) and
    `local_raw_reward` aligned with the rank's per-sample fields."""
    import ray

    if len(rollout_data_ref) != dp_size:
        raise ValueError(f"process_rollout_data: {len(rollout_data_ref)} rank batches for dp_size={dp_size}")
    data = ray.get(rollout_data_ref[dp_rank].inner)
    partition = data["partition"]
    data["total_lengths"] = [data["total_lengths"][i] for i in partition]
    if "raw_reward" in data:
        data["local_raw_reward"] = [data["raw_reward"][i] for i in partition]
    return data


def get_source(sample: Sample) -> str:
    """The dataset a sample came from: `sample.source`, else `metadata['source_name']`, else 'unknown'."""
    if getattr(sample, "source", None):
        return sample.source
    metadata = sample.metadata if isinstance(sample.metadata, dict) else {}
    return metadata.get("source_name") or "unknown"


class Dataset:
    """slime's `Dataset(path, tokenizer, processor, max_length, *, prompt_key, ...)`: every row of a
    prompt file as a `Sample` (prompt as text, or as messages / the chat template's text with
    `apply_chat_template`; `label`, `metadata` with `tools`), prompts longer than `max_length` tokens
    dropped, `shuffle(epoch)` a seeded permutation of the whole set. What plugins written against
    slime's data source build; our own rollout reads prompts through `slime.rollout.data_source`."""

    def __init__(
        self,
        path: str,
        tokenizer: Any,
        processor: Any,
        max_length: int | None,
        *,
        prompt_key: str = "text",
        multimodal_keys: dict | None = None,
        label_key: str | None = None,
        tool_key: str | None = None,
        metadata_key: str = "metadata",
        seed: int = 42,
        apply_chat_template: bool = False,
        apply_chat_template_kwargs: dict | None = None,
    ):
        samples = []
        for row in read_file(path):
            messages = _messages(row, prompt_key, apply_chat_template or multimodal_keys is not None, multimodal_keys)
            metadata = dict(row.get(metadata_key) or {})
            tools = row.get(tool_key) if tool_key is not None else None
            if isinstance(tools, str):
                tools = json.loads(tools)
            if tools is not None:
                tools = list(tools)
                metadata["tools"] = tools
            prompt = messages
            if apply_chat_template:
                prompt = tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
                    tokenize=False,
                    add_generation_prompt=True,
                    **(apply_chat_template_kwargs or {}),
                )
            multimodal = None
            if processor:
                from slime.utils.processing_utils import process_vision_info

                multimodal = process_vision_info(messages, processor)
            samples.append(
                Sample(
                    prompt=prompt,
                    label=row[label_key] if label_key is not None else None,
                    metadata=metadata,
                    multimodal_inputs=multimodal,
                )
            )
        self.origin_samples = filter_long_prompt(samples, tokenizer, processor, max_length)
        self.samples = self.origin_samples
        self.epoch_id, self.seed = -1, seed

    def shuffle(self, new_epoch_id: int) -> None:
        if self.epoch_id == new_epoch_id:
            return
        order = list(range(len(self.origin_samples)))
        random.Random(self.seed + new_epoch_id).shuffle(order)
        self.samples = [self.origin_samples[i] for i in order]
        self.epoch_id = new_epoch_id

    def __getitem__(self, idx: int) -> Sample:
        return self.samples[idx]

    def __len__(self) -> int:
        return len(self.samples)


def _messages(row: dict[str, Any], prompt_key: str, as_conversation: bool, multimodal_keys: dict | None) -> Any:
    """The row's prompt: as it is, or as a message list (a string becomes one user message; with
    `multimodal_keys`, the row's images/videos are appended to that message's content)."""
    prompt = row.get(prompt_key)
    if not as_conversation:
        return prompt
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if multimodal_keys:
        parts = (
            [{"type": "text", "text": prompt[-1]["content"]}]
            if isinstance(prompt[-1]["content"], str)
            else list(prompt[-1]["content"])
        )
        for kind, key in multimodal_keys.items():
            values = row.get(key) or []
            for value in values if isinstance(values, list) else [values]:
                parts.append({"type": kind, kind: value})
        prompt = [*prompt[:-1], {**prompt[-1], "content": parts}]
    return prompt
