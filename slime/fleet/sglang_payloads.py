"""The JSON bodies slime sends to an SGLang server, one pure function per endpoint.

Why a module of its own: these dicts are a contract with SGLang's request classes
(`sglang.srt.managers.io_struct`). SGLang's HTTP layer silently *ignores* a key it does not know, so a
misspelt or renamed key is not an error there, it is a setting that quietly never applies. Building
every body here lets `tests/test_sglang_contract.py` check each one against the pinned SGLang's
fields without a GPU, and lets the callers (engine actor, engine client, weight sync) share them.
Optional arguments left at None are omitted, so SGLang's own default applies.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from slime.utils.encoded_ids import EncodedIds

# endpoint function -> (HTTP method, path) on the SGLang server
ENDPOINTS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "generate": ("POST", "/generate"),
        "abort_request": ("POST", "/abort_request"),
        "flush_cache": ("POST", "/flush_cache"),
        "pause_generation": ("POST", "/pause_generation"),
        "continue_generation": ("POST", "/continue_generation"),
        "release_memory_occupation": ("POST", "/release_memory_occupation"),
        "resume_memory_occupation": ("POST", "/resume_memory_occupation"),
        "update_weights_from_disk": ("POST", "/update_weights_from_disk"),
        "update_weights_from_tensor": ("POST", "/update_weights_from_tensor"),
        "init_weights_update_group": ("POST", "/init_weights_update_group"),
        "update_weights_from_distributed": ("POST", "/update_weights_from_distributed"),
        "destroy_weights_update_group": ("POST", "/destroy_weights_update_group"),
        "check_weights": ("POST", "/weights_checker"),
    }
)

PAUSE_MODES = ("abort", "retract", "in_place")
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")  # sglang.srt.constants GPU_MEMORY_TYPE_*
CHECK_WEIGHTS_ACTIONS = ("snapshot", "reset_tensors", "compare", "checksum")


def _with_optional(body: dict[str, Any], **optional: Any) -> dict[str, Any]:
    body.update({k: v for k, v in optional.items() if v is not None})
    return body


def generate(
    input_ids: Iterable[int],
    sampling_params: Mapping[str, Any],
    *,
    rid: str,
    return_logprob: bool = True,
    top_logprobs_num: int = 0,
    image_data: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Token-in/token-out `/generate`: ids in, sampled ids with log-probs out (never text);
    `top_logprobs_num` > 0 also asks for the k most likely tokens at each position; `image_data`: a
    vision-language model's images for the `<|image_pad|>` placeholders of `input_ids`, in order, each a
    data URI, base64 text or a path the engine can read (SGLang's `MultimodalDataInputFormat`)."""
    ids = input_ids if isinstance(input_ids, EncodedIds) else list(map(int, input_ids))  # (already ints)
    body = {
        "input_ids": ids,
        "sampling_params": dict(sampling_params),
        "return_logprob": bool(return_logprob),
        "rid": rid,
    }
    if top_logprobs_num:
        body["top_logprobs_num"] = int(top_logprobs_num)
    if image_data:
        images = list(image_data)
        if not all(isinstance(i, str) for i in images):
            raise ValueError("generate: image_data items must be strings (data URIs, base64 or paths)")
        body["image_data"] = images
    return body


def abort_request(*, rid: str | None = None, abort_all: bool = False) -> dict[str, Any]:
    """Abort one request by `rid`, or every request on the engine with `abort_all=True`."""
    if (rid is None) == (not abort_all):
        raise ValueError("abort_request: give either rid or abort_all=True")
    return {"abort_all": True} if abort_all else {"rid": rid}


def flush_cache() -> dict[str, Any]:
    return {}


def pause_generation(mode: str | None = None) -> dict[str, Any]:
    if mode is not None and mode not in PAUSE_MODES:
        raise ValueError(f"pause_generation: mode must be one of {PAUSE_MODES}, got {mode!r}")
    return _with_optional({}, mode=mode)


def continue_generation() -> dict[str, Any]:
    return {}


def _tags(what: str, tags: Iterable[str] | None) -> dict[str, Any]:
    if not tags:
        return {}
    tags = list(tags)
    bad = [t for t in tags if t not in MEMORY_TAGS]
    if bad:
        raise ValueError(f"{what}: unknown tag(s) {bad}; SGLang knows {list(MEMORY_TAGS)}")
    return {"tags": tags}


def release_memory_occupation(tags: Iterable[str] | None = None) -> dict[str, Any]:
    """Release GPU memory (all of it, or only `weights` / `kv_cache`); needs `--enable-memory-saver`."""
    return _tags("release_memory_occupation", tags)


def resume_memory_occupation(tags: Iterable[str] | None = None) -> dict[str, Any]:
    return _tags("resume_memory_occupation", tags)


def update_weights_from_disk(
    model_path: str, *, weight_version: str | None = None, load_format: str | None = None
) -> dict[str, Any]:
    return _with_optional({"model_path": str(model_path)}, weight_version=weight_version, load_format=load_format)


def update_weights_from_tensor(
    serialized_named_tensors: Iterable[str],
    *,
    load_format: str | None = None,
    flush_cache: bool = False,
    weight_version: str | None = None,
) -> dict[str, Any]:
    """One serialized bucket per tensor-parallel rank (base64 strings: JSON has no bytes)."""
    return _with_optional(
        {"serialized_named_tensors": list(serialized_named_tensors), "flush_cache": bool(flush_cache)},
        load_format=load_format,
        weight_version=weight_version,
    )


def init_weights_update_group(
    master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str = "nccl"
) -> dict[str, Any]:
    return {
        "master_address": str(master_address),
        "master_port": int(master_port),
        "rank_offset": int(rank_offset),
        "world_size": int(world_size),
        "group_name": str(group_name),
        "backend": str(backend),
    }


def dtype_name(dtype: Any) -> str:
    """`torch.bfloat16` or "bfloat16" -> "bfloat16" (SGLang looks the name up on `torch`)."""
    return str(dtype).removeprefix("torch.")


def update_weights_from_distributed(
    names: Iterable[str],
    dtypes: Iterable[Any],
    shapes: Iterable[Iterable[int]],
    group_name: str,
    *,
    flush_cache: bool = False,
    weight_version: str | None = None,
    load_format: str | None = None,
) -> dict[str, Any]:
    """Metadata of one broadcast bucket; the tensors follow over the weight-update group."""
    names, dtypes, shapes = list(names), [dtype_name(d) for d in dtypes], [[int(n) for n in s] for s in shapes]
    if not len(names) == len(dtypes) == len(shapes):
        raise ValueError(
            f"update_weights_from_distributed: {len(names)} names, {len(dtypes)} dtypes, "
            f"{len(shapes)} shapes (must be equal)"
        )
    return _with_optional(
        {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": str(group_name),
            "flush_cache": bool(flush_cache),
        },
        weight_version=weight_version,
        load_format=load_format,
    )


def destroy_weights_update_group(group_name: str) -> dict[str, Any]:
    return {"group_name": str(group_name)}


def check_weights(action: str) -> dict[str, Any]:
    """SGLang's `/weights_checker` (slime's `check_weights`)."""
    if action not in CHECK_WEIGHTS_ACTIONS:
        raise ValueError(f"check_weights: action must be one of {CHECK_WEIGHTS_ACTIONS}, got {action!r}")
    return {"action": action}
