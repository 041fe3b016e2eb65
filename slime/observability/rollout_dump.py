"""Rollout dumps: `{rollout_data_dir}/{rollout_id}.jsonl`, one line per sample.

Lines carry verl's viewer fields (`input`, `output`, `score`, `step`) so verl tooling reads
them, plus what debugging multi-turn RL needs (token ids, loss-mask spans, reward details, and
for tool rollouts the sample's `TrajectoryRecord`: turns, spans, tool messages, error records).
`DumpRecord` is the schema; bump `SCHEMA_VERSION` on any incompatible change. Eval rollouts go
to `{rollout_data_dir}/eval/{dataset}/{rollout_id}.jsonl`. Files are written to a temp name and
renamed, so a reader never sees a half-written dump (the viewer still tolerates torn files from
other writers).
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from slime.observability.flags import ReportConfig
from slime.observability.metrics import flatten_samples, reward_value
from slime.utils.trajectory import TrajectoryRecord
from slime.utils.types import Sample

SCHEMA_VERSION = 2  # 2: multi-turn fields moved into `trajectory`, errors as records (1 held counts)
IMAGES_DIR = "images"  # beside a dump: its samples' pictures, one PNG per distinct image (named by content)


class Span(BaseModel):
    """Half-open `[start, end)` range of response-token offsets."""

    start: int
    end: int


class MaskSpan(Span):
    mask: int = Field(description="loss-mask value on the span: 1 trained, 0 masked")


class DumpRecord(BaseModel):
    """One sample of a rollout dump (one JSONL line)."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    # verl-compatible fields
    input: str = Field(description="the prompt as text (chat messages rendered role: content)")
    output: str = Field(description="the response text")
    score: float | None = Field(description="scalar reward (dict rewards: the --reward-key entry)")
    step: int = Field(description="rollout id")
    # slime fields
    evaluation: bool = False
    dataset: str | None = None
    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, Any]] = Field(description="the raw prompt: text or chat messages")
    label: Any = None
    status: str
    reward: Any = Field(None, description="the raw reward (float or dict of components)")
    tokens: list[int] = Field(default_factory=list, description="prompt + response token ids")
    prompt_length: int = 0
    response_length: int = 0
    loss_mask_spans: list[MaskSpan] = Field(
        default_factory=list, description="run-length loss mask over response tokens"
    )
    trajectory: TrajectoryRecord | None = Field(None, description="the tool loop's record; None for single-turn")
    weight_versions: list[str] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict, description="the rest of sample.metadata, JSON-safe")
    tokenizer: str | None = Field(None, description="tokenizer path the ids belong to (--hf-checkpoint)")
    images: list[str] = Field(
        default_factory=list,
        description="the sample's pictures (a VLM's), as PNG files relative to the dump's directory",
    )


def json_safe(v: Any, depth: int = 0) -> Any:
    """Builtins only: NaN/inf become None, tensors/arrays become lists, the rest `str()`."""
    if depth > 20:
        return str(v)
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): json_safe(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple, set)):
        return [json_safe(x, depth + 1) for x in v]
    if hasattr(v, "tolist"):
        return json_safe(v.tolist(), depth + 1)
    if hasattr(v, "value") and type(v).__module__ != "builtins":  # enums
        return json_safe(v.value, depth + 1)
    return str(v)


def mask_spans(mask: list[int] | None) -> list[dict[str, int]]:
    """Run-length encode a loss mask: `[{"start", "end", "mask"}]`."""
    spans: list[dict[str, int]] = []
    for i, m in enumerate(mask or []):
        m = int(m)
        if spans and spans[-1]["mask"] == m and spans[-1]["end"] == i:
            spans[-1]["end"] = i + 1
        else:
            spans.append({"start": i, "end": i + 1, "mask": m})
    return spans


def render_prompt(prompt: Any) -> str:
    if isinstance(prompt, list):
        return "\n".join(
            f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in prompt
        )
    return "" if prompt is None else str(prompt)


def sample_to_record(
    config: ReportConfig | None,
    step: int,
    sample: Sample,
    *,
    evaluation: bool = False,
    dataset: str | None = None,
    images_dir: Path | None = None,
) -> dict[str, Any]:
    """The dump line for one sample, as a plain dict validated against `DumpRecord` (`config` None: a sample
    read back from a `.pt` dump, whose run's flags are not known); with `images_dir` (beside the dump file)
    the sample's pictures are written there and named in `images`."""
    meta = dict(sample.metadata or {})
    score = reward_value(config, sample) if sample.reward is not None else None
    trajectory = TrajectoryRecord.of(sample)
    if trajectory is not None:
        meta = {k: v for k, v in meta.items() if k not in TrajectoryRecord.keys()}
    rec = {
        "schema_version": SCHEMA_VERSION,
        "input": render_prompt(sample.prompt),
        "output": sample.response or "",
        "score": score if score is None or math.isfinite(score) else None,
        "step": int(step),
        "evaluation": evaluation,
        "dataset": dataset or _str_or_none(meta.get("dataset") or meta.get("data_source")),
        "group_index": sample.group_index,
        "index": sample.index,
        "prompt": json_safe(sample.prompt),
        "label": json_safe(sample.label),
        "status": sample.status.value if isinstance(sample.status, Sample.Status) else str(sample.status),
        "reward": json_safe(sample.reward),
        "tokens": [int(t) for t in sample.tokens or []],
        "prompt_length": sample.prompt_length,
        "response_length": sample.response_length,
        "loss_mask_spans": mask_spans(sample.loss_mask),
        "trajectory": trajectory,
        "weight_versions": [str(v) for v in sample.weight_versions or []],
        "metadata": json_safe(meta),
        "tokenizer": None if config is None else config.hf_checkpoint,
        "images": save_images(sample, images_dir) if images_dir is not None else [],
    }
    return DumpRecord.model_validate(rec).model_dump(mode="json")


def save_images(sample: Sample, images_dir: Path) -> list[str]:
    """The sample's pictures (`multimodal_inputs["images"]`: PIL or data URIs) as PNG files named by their
    content (a GRPO group's samples share one file), paths relative to the dump's directory."""
    values = (
        list((sample.multimodal_inputs or {}).get("images") or []) if isinstance(sample.multimodal_inputs, dict) else []
    )
    if not values:
        return []
    import hashlib

    from slime.utils.images import ImageError, open_image

    names = []
    for value in values:
        try:
            image = open_image(value)
        except ImageError:
            continue  # a dump never fails a rollout
        png = io.BytesIO()
        image.save(png, format="PNG")
        data = png.getvalue()
        name = f"{IMAGES_DIR}/{hashlib.sha256(data).hexdigest()[:16]}.png"
        path = images_dir.parent / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        names.append(name)
    return names


def _str_or_none(v: Any) -> str | None:
    return None if v is None else str(v)


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "_"


def dump_path(
    config: ReportConfig, rollout_id: int, evaluation: bool = False, dataset: str | None = None
) -> Path | None:
    root = config.observability.rollout_data_dir
    if not root:
        return None
    if evaluation:
        return Path(root) / "eval" / _safe_name(dataset or "default") / f"{rollout_id}.jsonl"
    return Path(root) / f"{rollout_id}.jsonl"


def dump_rollout(
    config: ReportConfig, rollout_id: int, samples: list, evaluation: bool = False, dataset: str | None = None
) -> Path | None:
    """Write the dump for one rollout (or one eval dataset); a no-op without --rollout-data-dir."""
    path = dump_path(config, rollout_id, evaluation, dataset)
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for s in flatten_samples(samples):
            rec = sample_to_record(
                config, rollout_id, s, evaluation=evaluation, dataset=dataset, images_dir=path.parent / IMAGES_DIR
            )
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, path)
    return path


def dump_eval(config: ReportConfig, rollout_id: int, eval_data: dict) -> list[Path]:
    """Dump every dataset of slime's eval dict to its own file."""
    out = []
    for name, data in (eval_data or {}).items():
        p = dump_rollout(config, rollout_id, (data or {}).get("samples") or [], evaluation=True, dataset=name)
        if p:
            out.append(p)
    return out


def validate_line(line: str) -> DumpRecord:
    """Parse and validate one dump line (raises on malformed or schema-violating input)."""
    return DumpRecord.model_validate_json(line)


def json_schema() -> dict[str, Any]:
    return DumpRecord.model_json_schema()
