"""The `Sample`: one trajectory, from prompt to reward, in slime's field layout.

Plugins written for slime import it as `from slime.utils.types import Sample`; every field, default,
nested dataclass (`SpecInfo`, `PrefixCacheInfo`), `Status` value and method (`append_response_tokens`,
`get_reward_value`, `effective_response_length`, `to_dict`/`from_dict`) follows slime's, so dumps and
plugins move between the two unchanged.

Differences that only add safety:
- `to_dict` returns builtins (tensors become lists), so a dump loads with `torch.load(weights_only=True)`.
- `from_dict` keeps fields it does not know (written by a newer slime, or set by a plugin) in
  `sample.extra_fields` with one warning, readable as attributes and written back by `to_dict`.

Our addition, used on every path: each engine answer is one *segment* (`append_segment`, or
`record_segment` after tokens appended by hand): `metadata["weight_versions"][i]` is its engine weight
version (None when the engine reports none), `metadata["segments"][i]` its response span and rollout
id; `sample.weight_versions` is slime's list, the same versions without the Nones. Partial rollout
(`slime.rollout.partial_rollout`) reads them to continue an aborted sample and mask off-policy spans.

torch is imported only on the paths that need tensors (top-p replay, routed experts), so importing this
module stays cheap.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable

logger = logging.getLogger(__name__)

_TOP_P_IDS_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_OFFSETS_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")


# ---------------------------------------------------------------- tensor-light helpers


def _flat_list(values: Any) -> list:
    """A flat Python list from a list, tuple, numpy array or torch tensor (any device)."""
    if values is None:
        return []
    if hasattr(values, "tolist") and hasattr(values, "reshape"):
        if hasattr(values, "detach"):
            values = values.detach().cpu()
        return values.reshape(-1).tolist()
    return list(values)


def _int_list(values: Any) -> list[int]:
    if type(values) is list or type(values) is tuple:  # an engine's answer: converted at C speed
        return list(map(int, values))
    return [int(v) for v in _flat_list(values)]


def _float_list(values: Any) -> list[float] | None:
    if type(values) is list or type(values) is tuple:
        return list(map(float, values))
    return None if values is None else [float(v) for v in _flat_list(values)]


def _flat_len(values: Any) -> int:
    if hasattr(values, "numel"):
        return int(values.numel())
    if hasattr(values, "size") and not callable(values.size):  # numpy
        return int(values.size)
    return len(_flat_list(values))


def decode_int32_meta_array(meta_info: dict[str, Any], keys: str | Iterable[str]):
    """The first of `keys` present in SGLang's `meta_info`, as a flat int32 torch tensor (or None).

    SGLang sends these arrays base64-encoded (native-endian int32); lists, bytes, numpy arrays and
    tensors are accepted too."""
    for key in (keys,) if isinstance(keys, str) else keys:
        if key in meta_info:
            value = meta_info[key]
            break
    else:
        return None
    if value is None:
        return None
    import torch

    if isinstance(value, str):
        try:
            import pybase64 as b64
        except ImportError:
            b64 = base64
        value = b64.b64decode(value.encode("ascii"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytearray(value)
        if len(raw) % 4:
            raise ValueError(f"meta_info[{key!r}]: {len(raw)} bytes is not a whole number of int32 values")
        return torch.frombuffer(raw, dtype=torch.int32) if raw else torch.zeros(0, dtype=torch.int32)
    if torch.is_tensor(value):
        return value.detach().to(device="cpu", dtype=torch.int32).reshape(-1)
    if hasattr(value, "flags") and not value.flags.writeable:  # read-only numpy view
        value = value.copy()
    return torch.as_tensor(value, dtype=torch.int32).reshape(-1)


def _extended(target: Any, items: list) -> list:
    """`target += items` in place when it is a list (as slime does: aliases see the append), else a new list."""
    if isinstance(target, list):
        target.extend(items)
        return target
    return _flat_list(target) + items


def _to_builtin(value: Any) -> Any:
    """Tensors and numpy arrays as (nested) lists; everything else unchanged."""
    if hasattr(value, "tolist") and hasattr(value, "reshape"):
        if hasattr(value, "detach"):
            value = value.detach().cpu()
        return value.tolist()
    return value


def _plain_images(multimodal: Any) -> Any:
    """`multimodal_inputs` with its PIL images as PNG data URIs (what `image_data` and our readers accept),
    so a sample's dict stays JSON- and `weights_only`-safe."""
    if not isinstance(multimodal, dict):
        return multimodal

    def plain(v: Any) -> Any:
        if type(v).__module__.startswith("PIL."):
            from slime.utils.images import encode_png_data_uri

            return encode_png_data_uri(v)
        return [plain(x) for x in v] if isinstance(v, list) else v

    return {k: plain(v) for k, v in multimodal.items()}


# ---------------------------------------------------------------- Sample


@dataclass
class Sample:
    """One prompt/response pair. `tokens` = prompt ids + response ids; per-response-token lists
    (`loss_mask`, `rollout_log_probs`) have length `response_length`."""

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        # Recoverable failure (tool error, external API error, parse error): the sample may still
        # hold partial valid output, unlike ABORTED.
        FAILED = "failed"

    @dataclass
    class SpecInfo:
        """Speculative-decoding counters summed over the turns of a sample."""

        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        @property
        def spec_accept_rate(self) -> float:
            return self.spec_accept_token_num / self.spec_draft_token_num if self.spec_draft_token_num > 0 else 0.0

        @property
        def spec_accept_length(self) -> float:
            return self.completion_token_num / self.spec_verify_ct if self.spec_verify_ct > 0 else 0.0

        def add(self, meta_info: dict) -> None:
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return dataclasses.asdict(self)

        @staticmethod
        def from_dict(data: dict | None) -> "Sample.SpecInfo":
            data = data or {}
            return Sample.SpecInfo(**{f.name: data.get(f.name, 0) for f in dataclasses.fields(Sample.SpecInfo)})

    @dataclass
    class PrefixCacheInfo:
        """Prompt tokens served from the engine's prefix cache, summed over the turns of a sample."""

        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        @property
        def prefix_cache_hit_rate(self) -> float:
            return self.cached_tokens / self.total_prompt_tokens if self.total_prompt_tokens > 0 else 0.0

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

        def to_dict(self) -> dict[str, int]:
            return dataclasses.asdict(self)

        @staticmethod
        def from_dict(data: dict | None) -> "Sample.PrefixCacheInfo":
            data = data or {}
            return Sample.PrefixCacheInfo(
                cached_tokens=data.get("cached_tokens", 0), total_prompt_tokens=data.get("total_prompt_tokens", 0)
            )

    group_index: int | None = None
    index: int | None = None
    # Rollout execution this sample came from; None means "same as index". Paths that split one
    # execution into several training samples give every sibling the same rollout_id.
    rollout_id: int | None = None
    # prompt
    prompt: str | list[dict[str, Any]] = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None  # raw data: {"images": [PIL images]} (data URIs in to_dict)
    multimodal_train_inputs: dict[str, Any] | None = None  # processed (pixel_values, image_grid_thw, ...)
    multimodal_train_input_id: str | None = None
    apply_chat_template_kwargs: dict = field(default_factory=dict)
    # response
    response: str = ""
    response_length: int = 0
    label: Any = None
    reward: float | dict[str, Any] | None = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None  # engine log-probs of the response tokens
    # Top-p replay (ragged): kept ids of response token i are ids[offsets[i]:offsets[i + 1]].
    rollout_top_p_token_ids: Any = None  # list[int] | torch.Tensor | None
    rollout_top_p_token_offsets: Any = None  # list[int] | torch.Tensor | None
    rollout_routed_experts: Any = None  # list[list[int]] | torch.Tensor | None (MoE routing replay)
    remove_sample: bool = False
    teacher_log_probs: list[float] | None = None  # on-policy distillation
    status: "Sample.Status" = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None  # per-sample --custom-generate-function-path
    custom_rm_path: str | None = None  # per-sample --custom-rm-path
    train_metadata: dict | None = None  # e.g. which loss the trainer uses for this sample
    session_id: str | None = None  # consistent-hashing routing key
    non_generation_time: float = 0.0  # seconds spent outside generation (tools, rewards)
    spec_info: "Sample.SpecInfo" = field(default_factory=SpecInfo)
    prefix_cache_info: "Sample.PrefixCacheInfo" = field(default_factory=PrefixCacheInfo)
    # Fields this version does not know (from a newer slime's dump); written back by to_dict.
    extra_fields: dict[str, Any] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------ derived values

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def effective_response_length(self) -> int:
        """Trainable response tokens (tool output excluded)."""
        return int(sum(self.loss_mask)) if self.loss_mask is not None else self.response_length

    def get_reward_value(self, args: Any = None) -> Any:
        """slime's: the reward as the reward function returned it, or its `--reward-key` entry. Not
        necessarily a number (a dict, a teacher's answer): the batch conversion checks that
        (`slime.rollout.reward_check`), after `--custom-reward-post-process-path` had its turn."""
        key = args.reward_key if args is not None else None
        return self.reward[key] if key else self.reward

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: unknown fields loaded by from_dict read as attributes.
        if not name.startswith("__") and name != "extra_fields":
            extras = self.__dict__.get("extra_fields")
            if extras and name in extras:
                return extras[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    # ------------------------------------------------------------ dict round trip

    @classmethod
    def _field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra_fields")

    def to_dict(self) -> dict[str, Any]:
        """slime's dict layout (status as its string, nested infos as dicts), builtins only, so it is safe
        for `torch.load(weights_only=True)`. Unknown fields and plugin-set attributes are kept."""
        names = self._field_names()
        d = {name: _to_builtin(getattr(self, name)) for name in names}
        d["status"] = Sample.Status(self.status).value
        d["multimodal_inputs"] = _plain_images(self.multimodal_inputs)
        d["spec_info"] = self.spec_info.to_dict()
        d["prefix_cache_info"] = self.prefix_cache_info.to_dict()
        for key, value in self.extra_fields.items():
            d.setdefault(key, _to_builtin(value))
        for key, value in vars(self).items():  # attributes a plugin set on the instance
            if key not in d and key != "extra_fields" and not key.startswith("_"):
                d[key] = _to_builtin(value)
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, warn_unknown: bool = True) -> "Sample":
        """Inverse of `to_dict`; also reads dicts written by slime (any version). Keys this version does not
        know go to `extra_fields` (one warning unless `warn_unknown=False`), never an error."""
        if not isinstance(data, dict):
            raise TypeError(f"Sample.from_dict expects a dict, got {type(data).__name__}")
        names = set(cls._field_names())
        kwargs = {k: v for k, v in data.items() if k in names}
        status = kwargs.get("status", cls.Status.PENDING)
        try:
            kwargs["status"] = cls.Status(status)
        except ValueError:
            raise ValueError(
                f"Sample.from_dict: field 'status' has unknown value {status!r} "
                f"(expected one of {[s.value for s in cls.Status]})"
            ) from None
        spec, cache = kwargs.get("spec_info"), kwargs.get("prefix_cache_info")
        kwargs["spec_info"] = spec if isinstance(spec, cls.SpecInfo) else cls.SpecInfo.from_dict(spec)
        kwargs["prefix_cache_info"] = (
            cache if isinstance(cache, cls.PrefixCacheInfo) else cls.PrefixCacheInfo.from_dict(cache)
        )
        extras = {k: v for k, v in data.items() if k not in names}
        if extras and warn_unknown:
            logger.warning(
                "Sample.from_dict: keeping unknown field(s) %s in sample.extra_fields (written by a newer slime?)",
                sorted(extras),
            )
        return cls(**kwargs, extra_fields=extras)

    # ------------------------------------------------------------ building a response

    @property
    def is_partial(self) -> bool:
        """ABORTED with part of a response: what `--partial-rollout` continues instead of starting over."""
        return self.status == Sample.Status.ABORTED and self.response_length > 0

    def start_response(self, prompt_ids: list[int]) -> "Sample":
        """An empty response on `prompt_ids`, no segments, no reward: a sample generated from scratch."""
        self.tokens, self.response, self.response_length = list(prompt_ids), "", 0
        self.reward = None
        self.loss_mask, self.rollout_log_probs = [], []
        self.clear_segments()
        return self

    def clear_segments(self) -> None:
        """Forget the segments (and partial-rollout counters) of an earlier attempt."""
        self.weight_versions = []
        for key in SEGMENT_KEYS:
            self.metadata.pop(key, None)

    def append_segment(
        self,
        token_ids: list[int],
        log_probs: list[float],
        *,
        finish_reason: str,
        text: str = "",
        weight_version: Any = None,
        rollout_id: int | None = None,
        continued: bool = False,
    ) -> "Sample":
        """Append one engine answer as one segment: ids, log-probs and loss mask 1 (through
        `append_response_tokens`, which keeps the lists aligned), the status its finish reason means
        (COMPLETED for one it does not know) and the segment's weight version and rollout id.
        `continued`: the answer continues an aborted response (counted in `metadata["continuations"]`)."""
        start = self.response_length
        self.append_response_tokens(
            tokens=token_ids, log_probs=log_probs, trainable=True, text=text, update_terminal_info=False
        )
        self.status = FINISH_REASON_STATUS.get(finish_reason, Sample.Status.COMPLETED)
        self.metadata["finish_reason"] = finish_reason
        if continued:
            self.metadata["continuations"] = int(self.metadata.get("continuations", 0)) + 1
        self.record_segment(start, self.response_length, weight_version, rollout_id)
        return self

    def record_segment(self, start: int, end: int, weight_version: Any, rollout_id: int | None) -> None:
        """One engine answer covering response positions [start, end), its tokens already appended."""
        version = None if weight_version is None else str(weight_version)
        self.metadata.setdefault("weight_versions", []).append(version)
        self.metadata.setdefault("segments", []).append({"start": start, "end": end, "rollout_id": rollout_id})
        if version is not None:
            self.weight_versions.append(version)

    def append_response_tokens(
        self,
        args: Any = None,
        *,
        tokens: Any = None,
        log_probs: Any = None,
        trainable: bool = True,
        meta_info: dict | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Append response-side tokens keeping every per-token list aligned.

        Sampled tokens: `trainable=True` with the engine's `log_probs` and `meta_info`. Tool or
        environment tokens: `trainable=False`, no log-probs; they get loss mask 0, log-prob 0.0 and empty
        top-p spans. With `update_terminal_info`, a `meta_info` carrying `finish_reason` also sets `status`
        (stop/length/abort), appends `weight_version` and adds prefix-cache (and speculative) counters.
        """
        tokens = _int_list(tokens)
        log_probs = _float_list(log_probs)
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError(f"log_probs length {len(log_probs)} != tokens length {len(tokens)}")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        if tokens and not trainable:
            if log_probs is not None:
                raise ValueError("non-trainable response tokens should not pass rollout log probabilities.")
            log_probs = [0.0] * len(tokens)

        if text is not None:
            self.response += text

        before = self.response_length
        if tokens:
            self.tokens = _extended(self.tokens, tokens)
            self.response_length = before + len(tokens)
            if self.loss_mask is None:  # earlier tokens were all sampled
                self.loss_mask = [1] * before
            self.loss_mask = _extended(self.loss_mask, [1 if trainable else 0] * len(tokens))

        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and before:
                    raise ValueError(
                        "Cannot append trainable rollout log probabilities to a sample with existing "
                        "response tokens but no existing rollout_log_probs."
                    )
                self.rollout_log_probs = [0.0] * before
            self.rollout_log_probs = _extended(self.rollout_log_probs, log_probs)

        pad_top_p = bool(tokens) and not trainable
        if meta_info is not None or pad_top_p:
            self._apply_meta_info(
                args,
                meta_info or {},
                new_token_count=len(tokens),
                pad_missing_top_p=pad_top_p,
                update_terminal_info=update_terminal_info,
            )
        self._validate_response_metadata_lengths()

    def _apply_meta_info(
        self,
        args: Any,
        meta_info: dict,
        *,
        new_token_count: int = 0,
        pad_missing_top_p: bool = False,
        update_terminal_info: bool = True,
    ) -> None:
        appended_top_p = new_token_count > 0 and self._append_top_p(meta_info, new_token_count)
        if (
            pad_missing_top_p
            and new_token_count
            and self.rollout_top_p_token_offsets is not None
            and not appended_top_p
        ):
            self._pad_top_p(new_token_count)
        self._apply_routed_experts(args, meta_info)

        if not update_terminal_info or "finish_reason" not in meta_info:
            return
        if getattr(args, "sglang_speculative_algorithm", False):
            self.spec_info.add(meta_info=meta_info)
        self.prefix_cache_info.add(meta_info=meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        finish = meta_info["finish_reason"]
        kind = finish.get("type") if isinstance(finish, dict) else finish
        status = FINISH_REASON_STATUS.get(kind)
        if status is not None:  # an unknown finish reason leaves the status as it was
            self.status = status

    def _append_top_p(self, meta_info: dict, new_token_count: int) -> bool:
        """Merge the top-p spans SGLang returned for `new_token_count` tokens; False if it sent none."""
        ids = decode_int32_meta_array(meta_info, _TOP_P_IDS_KEYS)
        offsets = decode_int32_meta_array(meta_info, _TOP_P_OFFSETS_KEYS)
        if ids is None and offsets is None:
            return False
        if ids is None or offsets is None:
            raise ValueError("SGLang top-p token replay must include both token ids and offsets.")
        if offsets.numel() == 0 or int(offsets[0]) != 0:
            raise ValueError(f"SGLang top-p token offsets must start with 0, got {offsets[:1].tolist()}.")
        if int(offsets[-1]) != ids.numel():
            raise ValueError(
                "SGLang top-p token ids/offsets mismatch: "
                f"offsets[-1]={int(offsets[-1])}, len(token_ids)={ids.numel()}."
            )
        if offsets.numel() != new_token_count + 1:
            raise ValueError(
                "SGLang top-p token offsets length must equal generated token count + 1: "
                f"len(offsets)={offsets.numel()}, generated={new_token_count}."
            )
        if self.rollout_top_p_token_ids is None and self.rollout_top_p_token_offsets is None:
            self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = ids, offsets
            return True
        import torch

        base_ids = torch.as_tensor(
            self.rollout_top_p_token_ids if self.rollout_top_p_token_ids is not None else [], dtype=torch.int32
        ).reshape(-1)
        base_offsets = torch.as_tensor(
            self.rollout_top_p_token_offsets if self.rollout_top_p_token_offsets is not None else [0], dtype=torch.int32
        ).reshape(-1)
        self.rollout_top_p_token_ids = torch.cat([base_ids, ids])
        self.rollout_top_p_token_offsets = torch.cat([base_offsets, offsets[1:] + int(base_offsets[-1])])
        return True

    def _pad_top_p(self, count: int) -> None:
        """Empty top-p spans for `count` tool tokens (they were not sampled)."""
        import torch

        if self.rollout_top_p_token_ids is None:
            raise ValueError("Cannot append empty top-p spans without existing token ids and offsets.")
        offsets = torch.as_tensor(self.rollout_top_p_token_offsets, dtype=torch.int32).reshape(-1)
        if offsets.numel() == 0:
            raise ValueError("Cannot append empty top-p spans to empty offsets.")
        self.rollout_top_p_token_ids = torch.as_tensor(self.rollout_top_p_token_ids, dtype=torch.int32).reshape(-1)
        self.rollout_top_p_token_offsets = torch.cat([offsets, offsets.new_full((count,), int(offsets[-1]))])

    def _apply_routed_experts(self, args: Any, meta_info: dict) -> None:
        """MoE routing replay: rows for tokens[start:-1] as a [rows, num_layers, moe_router_topk] tensor."""
        experts = decode_int32_meta_array(meta_info, "routed_experts")
        if experts is None:
            return
        if args is None:
            raise ValueError("args is required to decode routed experts metadata.")
        start = int(meta_info.get("routed_experts_start_len", 0) or 0)
        if start < 0:
            raise ValueError(f"SGLang routed_experts_start_len must be non-negative, got {start}.")
        rows = max(0, len(self.tokens) - 1 - start)
        layers, topk = args.num_layers, args.moe_router_topk
        if experts.numel() != rows * layers * topk:
            raise ValueError(
                "SGLang routed_experts element count does not match sample tokens: "
                f"got={experts.numel()}, expected={rows * layers * topk} (tokens={len(self.tokens)}, "
                f"routed_experts_start_len={start}, num_layers={layers}, moe_router_topk={topk})."
            )
        experts = experts.reshape(rows, layers, topk)
        if start == 0:
            self.rollout_routed_experts = experts
            return
        import torch

        existing = self.rollout_routed_experts
        if existing is None:
            raise ValueError(
                "Cannot append partial routed experts without existing routed experts "
                f"(routed_experts_start_len={start})."
            )
        existing = torch.as_tensor(existing, dtype=experts.dtype)
        if existing.shape[0] < start:
            raise ValueError(
                "Existing routed experts shorter than routed_experts_start_len: "
                f"existing_rows={existing.shape[0]}, routed_experts_start_len={start}."
            )
        self.rollout_routed_experts = torch.cat([existing[:start], experts], dim=0)

    def _validate_response_metadata_lengths(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(f"loss_mask length {len(self.loss_mask)} != response_length {self.response_length}")
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"rollout_log_probs length {len(self.rollout_log_probs)} != response_length {self.response_length}"
            )
        ids, offsets = self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets
        if ids is None and offsets is None:
            return
        if ids is None or offsets is None:
            raise ValueError("rollout top-p replay must include both token ids and offsets.")
        flat_offsets = _flat_list(offsets)
        if len(flat_offsets) != self.response_length + 1:
            raise ValueError(
                "rollout_top_p_token_offsets length must equal response_length + 1: "
                f"len(offsets)={len(flat_offsets)}, response_length={self.response_length}."
            )
        if int(flat_offsets[-1]) != _flat_len(ids):
            raise ValueError(
                "rollout top-p token ids/offsets mismatch: "
                f"offsets[-1]={int(flat_offsets[-1])}, len(token_ids)={_flat_len(ids)}."
            )


# The status an engine's finish reason means for the sample it answered.
FINISH_REASON_STATUS = {
    "length": Sample.Status.TRUNCATED,
    "abort": Sample.Status.ABORTED,
    "stop": Sample.Status.COMPLETED,
}
# `metadata` keys of the segments (and of partial rollout's counters), cleared when a sample starts over.
SEGMENT_KEYS = ("weight_versions", "segments", "continuations", "start_rollout_id")


# ---------------------------------------------------------------- other types slime exports here


@dataclass(frozen=True)
class ParamInfo:
    """One model parameter as the weight-update path describes it (dtype/shape are torch objects)."""

    name: str
    dtype: Any
    shape: Any
    attrs: dict
    size: int
    src_rank: int


# Batch handed from rollout to training: key -> per-sample list (tensors on the trainer side).
RolloutBatch = dict[str, list]


@dataclass
class MultimodalType:
    name: str  # type identifier used in message content, e.g. "image"
    placeholder: str  # placeholder in conversation messages, e.g. "<image>"


class MultimodalTypes:
    IMAGE = MultimodalType(name="image", placeholder="<image>")
    VIDEO = MultimodalType(name="video", placeholder="<video>")
    AUDIO = MultimodalType(name="audio", placeholder="<audio>")

    @classmethod
    def all(cls) -> list[MultimodalType]:
        return [cls.IMAGE, cls.VIDEO, cls.AUDIO]

    @classmethod
    def get(cls, name: str) -> MultimodalType | None:
        return next((m for m in cls.all() if m.name == name), None)
