"""Evaluation datasets from `--eval-prompt-data NAME PATH ...` or `--eval-config FILE`, as upstream slime.

`--eval-config` takes upstream's YAML/JSON format:

    eval:                      # optional wrapper; the root mapping itself works too
      defaults: {max_response_len: 1024, top_p: 0.7}
      datasets:                # a list of {name, path, ...} or a mapping name -> {path, ...}
        - name: aime
          path: /data/aime.jsonl@[0:30]
          rm_type: deepscaler
          n_samples_per_eval_prompt: 16

Each dataset field is resolved as: the dataset's own value, else `defaults`, else the matching flag
(`eval_*` first, then the rollout flag), exactly as upstream's `build_eval_dataset_configs`.

`EvalDatasetConfig` is a `(name, path)` tuple with attributes: code that unpacks pairs keeps working and
code written for upstream reads `.name`, `.path`, `.temperature`, ... . `path` keeps an `@[start:end]`
row slice; `file_path` / `row_slice` are its two parts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from slime.utils.data import _parse_generalized_path as parse_path_slice

# field -> flags consulted (in order) when neither the dataset nor `defaults` sets it (upstream's specs)
ARG_FALLBACKS: dict[str, tuple[str, ...]] = {
    "n_samples_per_eval_prompt": ("n_samples_per_eval_prompt", "n_samples_per_prompt"),
    "temperature": ("eval_temperature", "rollout_temperature"),
    "top_p": ("eval_top_p", "rollout_top_p"),
    "top_k": ("eval_top_k", "rollout_top_k"),
    "max_response_len": ("eval_max_response_len", "rollout_max_response_len"),
    "min_eval_samples": (),
    "stop": ("rollout_stop",),
    "stop_token_ids": ("rollout_stop_token_ids",),
    "min_new_tokens": ("eval_min_new_tokens",),
    "input_key": ("eval_input_key", "input_key"),
    "label_key": ("eval_label_key", "label_key"),
    "tool_key": ("eval_tool_key", "tool_key"),
    "metadata_key": ("metadata_key",),
    "multimodal_keys": ("multimodal_keys",),
    "apply_chat_template": ("apply_chat_template",),
    "apply_chat_template_kwargs": ("apply_chat_template_kwargs",),
    "custom_rm_path": ("eval_custom_rm_path", "custom_rm_path"),
}

# every field of upstream's EvalDatasetConfig besides name/path, with its default
FIELDS: dict[str, Any] = {
    "rm_type": None,
    "custom_rm_path": None,
    "input_key": None,
    "label_key": None,
    "tool_key": None,
    "metadata_key": None,
    "multimodal_keys": None,
    "apply_chat_template": None,
    "apply_chat_template_kwargs": None,
    "n_samples_per_eval_prompt": None,
    "temperature": None,
    "top_p": None,
    "top_k": None,
    "max_response_len": None,
    "stop": None,
    "stop_token_ids": None,
    "min_new_tokens": None,
    "repetition_penalty": None,
    "skip_special_tokens": None,
    "no_stop_trim": None,
    "custom_generate_function_path": None,
    "app_service": None,
    "eval_task_timeout": None,
    "min_eval_samples": None,
    "eval_early_stop_remaining": None,
    "eval_early_stop_idle_timeout": None,
    "message_processor": None,
    "reward_model": None,
    "remote_environment": None,
    "metadata_overrides": None,
}


class EvalConfigError(ValueError):
    """A bad eval dataset definition; the message names the flag, the file and the key."""


class EvalDatasetConfig(tuple):
    """One eval dataset: a `(name, path)` pair carrying upstream's per-dataset settings as attributes."""

    def __new__(cls, name: str, path: str, **fields: Any):
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise EvalConfigError(f"eval dataset {name!r}: unknown field(s) {unknown}; valid: {sorted(FIELDS)}")
        self = super().__new__(cls, (str(name), str(path)))
        self.__dict__.update(FIELDS)
        self.__dict__.update(fields)
        if self.metadata_overrides is None:
            self.metadata_overrides = {}
        if not isinstance(self.metadata_overrides, dict):
            raise EvalConfigError(f"eval dataset {name!r}: metadata_overrides must be a mapping")
        if self.min_eval_samples is not None and self.min_eval_samples <= 0:
            raise EvalConfigError(f"eval dataset {name!r}: min_eval_samples must be positive")
        return self

    def __getnewargs__(self):  # pickling (Ray): rebuild the pair, attributes come back from __dict__
        return (self[0], self[1])

    @property
    def name(self) -> str:
        return self[0]

    @property
    def path(self) -> str:
        return self[1]

    @property
    def file_path(self) -> str:
        return parse_path_slice(self[1])[0]

    @property
    def row_slice(self) -> slice | None:
        return parse_path_slice(self[1])[1]

    @property
    def cache_key(self) -> tuple[Any, ...]:
        return (self.name, self.path, self.input_key, self.label_key, self.tool_key, self.metadata_key)

    def inject_metadata(self, sample_metadata: Any) -> dict[str, Any]:
        """A sample's metadata with this dataset's rm_type and metadata_overrides applied (as upstream)."""
        metadata = dict(sample_metadata) if isinstance(sample_metadata, dict) else {}
        if self.rm_type is not None:
            metadata["rm_type"] = self.rm_type
        metadata.update(self.metadata_overrides)
        return metadata

    def __repr__(self) -> str:
        extra = {k: v for k, v in self.__dict__.items() if FIELDS.get(k, object()) != v and v != {}}
        fields = "".join(f", {k}={v!r}" for k, v in extra.items())
        return f"EvalDatasetConfig(name={self.name!r}, path={self.path!r}{fields})"


def _from_args(args: Any, attrs: tuple[str, ...]) -> Any:
    for attr in attrs:
        value = getattr(args, attr, None)
        if value is not None:
            return value
    return None


def dataset_list(config: Any, where: str) -> list[dict[str, Any]]:
    """Upstream's `ensure_dataset_list`: a list of entries with `name`, or a mapping name -> entry."""
    if config is None:
        return []
    if isinstance(config, dict):
        return [{**dict(cfg or {}), "name": dict(cfg or {}).get("name", name)} for name, cfg in config.items()]
    if isinstance(config, (list, tuple)):
        out = []
        for i, item in enumerate(config):
            if not isinstance(item, dict) or "name" not in item:
                raise EvalConfigError(f"{where}: datasets[{i}] must be a mapping with a `name` field")
            out.append(dict(item))
        return out
    raise EvalConfigError(f"{where}: `datasets` must be a list or a mapping, got {type(config).__name__}")


def build_eval_datasets(
    args: Any, raw: Iterable[dict[str, Any]], defaults: dict[str, Any], where: str
) -> list[EvalDatasetConfig]:
    valid_defaults = set(FIELDS) | set(ARG_FALLBACKS)
    unknown = sorted(set(defaults) - valid_defaults)
    if unknown:
        raise EvalConfigError(f"{where}: unknown key(s) in eval.defaults: {unknown}; valid: {sorted(valid_defaults)}")
    out = []
    for entry in raw:
        cfg = dict(entry)
        name = cfg.pop("name", None)
        path = cfg.pop("path", None)
        if not name or not path:
            raise EvalConfigError(f"{where}: dataset {name or '?'!r} needs both `name` and `path`")
        for key, attrs in ARG_FALLBACKS.items():
            if key not in cfg:
                cfg[key] = defaults[key] if key in defaults else _from_args(args, attrs)
        for key, value in defaults.items():
            cfg.setdefault(key, value)
        try:
            out.append(EvalDatasetConfig(name, path, **cfg))
        except EvalConfigError as e:
            raise EvalConfigError(f"{where}: {e}") from None
    return out


def build_eval_dataset_configs(
    args: Any, dataset_cfgs: Iterable[dict[str, Any]], defaults: dict[str, Any] | None = None
) -> list[EvalDatasetConfig]:
    """slime's name: each field from the dataset entry, else `defaults`, else the flags; an unknown
    key in `defaults` is an error naming it."""
    return build_eval_datasets(args, dataset_cfgs, dict(defaults or {}), "eval config")


def load_eval_config(path: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(dataset entries, defaults) of an --eval-config file (YAML or JSON; OmegaConf interpolation if installed)."""
    where = f"--eval-config {path}"
    p = Path(path)
    if not p.is_file():
        raise EvalConfigError(f"{where}: file not found")
    try:
        from omegaconf import OmegaConf  # upstream's loader: resolves ${...} interpolations
    except ImportError:
        OmegaConf = None  # noqa: N806
    try:
        if OmegaConf is not None:
            data = OmegaConf.to_container(OmegaConf.load(p), resolve=True)
        elif p.suffix == ".json":
            data = json.loads(p.read_text())
        else:
            import yaml

            data = yaml.safe_load(p.read_text())
    except Exception as e:  # noqa: BLE001 - any parse error is reported with the file
        raise EvalConfigError(f"{where}: cannot parse: {e}") from None
    if not isinstance(data, dict):
        raise EvalConfigError(f"{where}: the root must be a mapping")
    section = data.get("eval", data)
    if not isinstance(section, dict):
        raise EvalConfigError(f"{where}: `eval` must be a mapping")
    defaults = section.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise EvalConfigError(f"{where}: `defaults` must be a mapping")
    datasets = dataset_list(section.get("datasets"), where)
    if not datasets:
        raise EvalConfigError(f"{where}: no datasets under `eval.datasets`")
    return datasets, dict(defaults)


def resolve_eval_datasets(args: Any) -> list[EvalDatasetConfig]:
    """Upstream's `_resolve_eval_datasets`: --eval-config wins over --eval-prompt-data."""
    if args.eval_config:
        raw, defaults = load_eval_config(args.eval_config)
        return build_eval_datasets(args, raw, defaults, f"--eval-config {args.eval_config}")
    values = list(args.eval_prompt_data or [])
    if not values:
        return []
    if len(values) == 1:  # upstream's legacy form: one path is the "aime" set
        values = ["aime", values[0]]
    if len(values) % 2:
        raise EvalConfigError(f"--eval-prompt-data takes NAME PATH pairs, got {len(values)} value(s): {values}")
    raw = [{"name": values[i], "path": values[i + 1]} for i in range(0, len(values), 2)]
    return build_eval_datasets(args, raw, {}, "--eval-prompt-data")
