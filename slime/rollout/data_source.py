"""Prompt data and the sample buffer.

The data source hands out *groups*: `n_samples_per_prompt` copies of one prompt sharing a
`group_index`, each with a unique `index`. Recycled groups (aborted partial rollouts, groups a
filter dropped for later) wait in a buffer and are served first. Its whole state, buffer
included, is saved and restored, so a resumed run neither repeats nor skips prompts.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import re
from pathlib import Path
from typing import Any

from slime.tools.registry import decode_tools_value
from slime.utils.misc import get_by_path, load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


class DataError(ValueError):
    """Bad prompt data; the message names the file, the line (row) and the key."""


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL or parquet file, as dicts."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"prompt data file not found: {path}")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as e:  # noqa: BLE001
            raise DataError(f"{path}: cannot read parquet: {e}") from e
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid JSON: {e}") from e
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            rows.append(row)
    return rows


def _line(path: Path, i: int) -> str:
    return f"{path}:{i + 1}" if path.suffix != ".parquet" else f"{path} row {i}"


_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")


def parse_path_slice(path: str | Path) -> tuple[str, slice | None]:
    """slime's `FILE@[start:end]` syntax: the file and the row slice (Python semantics, negatives allowed)."""
    m = _SLICE.match(str(path))
    if m is None:
        return str(path), None
    start, stop = m.group("start"), m.group("stop")
    return m.group("path"), slice(int(start) if start else None, int(stop) if stop else None)


def _prompt_limit(args: Any) -> tuple[int | None, str]:
    """Longest prompt kept (tokens) and the flag that sets it; slime keeps len <= max_prompt_len."""
    if getattr(args, "rollout_max_prompt_len", None) is not None:
        return args.rollout_max_prompt_len, "--rollout-max-prompt-len"
    if getattr(args, "rollout_max_context_len", None) is not None:
        return args.rollout_max_context_len - 1, "--rollout-max-context-len"
    return None, ""


def _row_tools(value: Any, where: str) -> Any:
    """A `--tool-key` value: a tool-schema list (slime; a JSON string of one too) or verl's tools_kwargs dict."""
    try:
        return decode_tools_value(value)
    except ValueError as e:
        raise DataError(f"{where}: --tool-key: {e}") from None


def build_prompt_samples(args: Any, path: str | Path, input_key: str, label_key: str | None,
                         tokenizer: Any = None) -> tuple[list[Sample], int]:
    """One template Sample per usable row, and how many rows were filtered as too long.

    `path` may end in slime's `@[start:end]` row slice. With --apply-chat-template, the template gets
    the row's tools (a list under --tool-key) and --apply-chat-template-kwargs, as slime passes them.
    """
    file_path, row_slice = parse_path_slice(path)
    path = Path(file_path)
    rows = read_rows(path)
    if not rows:
        raise DataError(f"{path}: no prompts in file")
    numbered = list(enumerate(rows))
    if row_slice is not None:
        numbered = numbered[row_slice]
        if not numbered:
            raise DataError(f"{path}: the row slice @[{row_slice.start}:{row_slice.stop}] selects no rows "
                            f"(the file has {len(rows)})")
    max_len, limit_flag = _prompt_limit(args)
    template_kwargs = getattr(args, "apply_chat_template_kwargs", None) or {}
    if not isinstance(template_kwargs, dict):
        raise DataError(f"--apply-chat-template-kwargs must be a JSON object, got {template_kwargs!r}")
    samples, filtered = [], 0
    for i, row in numbered:
        try:
            prompt = get_by_path(row, input_key)
        except KeyError as e:
            raise DataError(f"{_line(path, i)}: missing input key {input_key!r} (no field {e.args[0]!r}); "
                            f"set --input-key") from None
        label = None
        if label_key:
            try:
                label = get_by_path(row, label_key)
            except KeyError as e:
                raise DataError(f"{_line(path, i)}: missing label key {label_key!r} (no field {e.args[0]!r}); "
                                f"set --label-key") from None
        metadata: dict[str, Any] = {}
        mkey = getattr(args, "metadata_key", None)
        if mkey:
            try:
                meta = get_by_path(row, mkey)
                metadata.update(meta if isinstance(meta, dict) else {"metadata": meta})
            except KeyError:
                pass
        tkey = getattr(args, "tool_key", None)
        tools = None
        if tkey:
            try:
                value = _row_tools(get_by_path(row, tkey), _line(path, i))
            except KeyError:
                value = None
            if isinstance(value, list):
                tools = metadata["tools"] = value
            elif value is not None:
                metadata["tools_kwargs"] = value
        if isinstance(prompt, list):
            if not all(isinstance(m, dict) and "role" in m for m in prompt):
                raise DataError(f"{_line(path, i)}: key {input_key!r} is a list but not of chat messages")
            metadata["messages"] = prompt
            if getattr(args, "apply_chat_template", False):
                if tokenizer is None:
                    raise DataError("--apply-chat-template needs a tokenizer (--hf-checkpoint)")
                prompt = tokenizer.apply_chat_template(prompt, tools=tools, tokenize=False, add_generation_prompt=True,
                                                       **template_kwargs)
        elif not isinstance(prompt, str) and getattr(args, "apply_chat_template", False):
            raise DataError(f"{_line(path, i)}: key {input_key!r} is {type(prompt).__name__}; --apply-chat-template "
                            "needs a string or a message list")
        # any other prompt (tau-bench's `"index": 3`) goes to the generate function as it is, as in slime
        sample = Sample(prompt=prompt, label=label, metadata=metadata)
        if tokenizer is not None and isinstance(prompt, str):
            sample.tokens = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            if max_len is not None and len(sample.tokens) > max_len:
                if getattr(args, "over_long_prompt", "filter") == "error":
                    raise DataError(f"{_line(path, i)}: prompt has {len(sample.tokens)} tokens, over the limit "
                                    f"{max_len} ({limit_flag}); use --over-long-prompt filter")
                filtered += 1
                continue
        samples.append(sample)
    if filtered:
        logger.warning("%s: filtered %d prompt(s) longer than %d tokens", path, filtered, max_len)
    if not samples:
        raise DataError(f"{path}: every prompt was filtered as too long ({filtered} rows)")
    return samples, filtered


def pop_first(args: Any, rollout_id: Any, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    """slime's default buffer filter: the oldest `num_samples` groups (slime's name for the count of
    groups), removed from the buffer."""
    taken = buffer[:num_samples]
    del buffer[:num_samples]
    return taken


class DataSource:
    """Serves groups of samples, epoch after epoch, recycled groups first."""

    def __init__(self, args: Any, prompts: list[Sample], n_samples_per_prompt: int, shuffle: bool = False,
                 filtered: int = 0):
        self.args = args
        self.prompts = prompts
        self.n = n_samples_per_prompt
        self.shuffle = shuffle
        self.seed = int(getattr(args, "rollout_seed", 42))
        self.filtered_prompts = filtered
        self.epoch_id = 0
        self.offset = 0
        self.group_counter = 0
        self.sample_counter = 0
        self.buffer: list[list[Sample]] = []
        path = getattr(args, "buffer_filter_path", None)
        # --buffer-filter-path: slime's `fn(args, rollout_id, buffer, num_groups) -> groups` (it removes them)
        self.buffer_filter = load_function(path, "--buffer-filter-path") if path else pop_first
        self._order = self._epoch_order()

    @classmethod
    def from_args(cls, args: Any, tokenizer: Any = None) -> "DataSource":
        if not args.prompt_data:
            raise DataError("--prompt-data is required (a JSONL or parquet file)")
        prompts, filtered = build_prompt_samples(args, args.prompt_data, args.input_key, args.label_key, tokenizer)
        return cls(args, prompts, args.n_samples_per_prompt, args.rollout_shuffle, filtered)

    def _epoch_order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed + self.epoch_id).shuffle(order)
        return order

    def __len__(self) -> int:
        return len(self.prompts)

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """`num_groups` groups: from the buffer first, then fresh prompts."""
        groups = list(self.buffer_filter(self.args, None, self.buffer, num_groups)) if self.buffer and num_groups else []
        if len(groups) > num_groups:
            raise ValueError(f"--buffer-filter-path returned {len(groups)} groups, asked for {num_groups}")
        while len(groups) < num_groups:
            if self.offset >= len(self._order):
                self.epoch_id += 1
                self.offset = 0
                self._order = self._epoch_order()
            template = self.prompts[self._order[self.offset]]
            self.offset += 1
            groups.append(self._make_group(template))
        return groups

    def _make_group(self, template: Sample) -> list[Sample]:
        group = []
        for _ in range(self.n):
            s = copy.deepcopy(template)
            s.group_index = self.group_counter
            s.index = self.sample_counter
            self.sample_counter += 1
            group.append(s)
        self.group_counter += 1
        return group

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """Return groups to the buffer (served before fresh prompts)."""
        for g in groups:
            if not isinstance(g, list) or not all(isinstance(s, Sample) for s in g):
                raise TypeError("add_samples expects a list of groups (lists of Sample)")
            self.buffer.append(g)

    def get_buffer_length(self) -> int:
        return len(self.buffer)

    # --- state ---
    def state_dict(self, held: list[list[Sample]] | None = None) -> dict[str, Any]:
        """The whole state; `held` are groups handed out and not yet trained (a background worker's),
        saved behind the buffer so a resumed run serves them again."""
        return {"epoch_id": self.epoch_id, "offset": self.offset, "group_counter": self.group_counter,
                "sample_counter": self.sample_counter, "num_prompts": len(self.prompts),
                "buffer": [[s.to_dict() for s in g] for g in [*self.buffer, *(held or [])]]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("num_prompts") != len(self.prompts):
            raise DataError(f"data source state was saved for {state.get('num_prompts')} prompts, "
                            f"the data now has {len(self.prompts)}")
        self.epoch_id, self.offset = state["epoch_id"], state["offset"]
        self.group_counter, self.sample_counter = state["group_counter"], state["sample_counter"]
        self.buffer = [[Sample.from_dict(d) for d in g] for g in state["buffer"]]
        self._order = self._epoch_order()

    def save(self, directory: str | Path, rollout_id: int, held: list[list[Sample]] | None = None) -> Path:
        path = Path(directory) / f"rollout_state_{rollout_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state_dict(held)))
        tmp.replace(path)
        (Path(directory) / "latest_rollout_id.txt").write_text(str(rollout_id))
        return path

    def load(self, directory: str | Path, rollout_id: int | None = None) -> int | None:
        """Restore the state saved after `rollout_id`, else the newest one; returns its rollout id
        (None when nothing was saved)."""
        if rollout_id is None:
            latest = Path(directory) / "latest_rollout_id.txt"
            if not latest.exists():
                return None
            try:
                rollout_id = int(latest.read_text().strip())
            except ValueError:
                raise DataError(f"--load {directory}: {latest} does not hold a rollout id: "
                                f"{latest.read_text()[:40]!r}") from None
        path = Path(directory) / f"rollout_state_{rollout_id}.json"
        try:
            self.load_state_dict(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise DataError(f"cannot load data source state {path}: {e}") from e
        return rollout_id


class RolloutDataSourceWithBuffer(DataSource):
    """slime's class (`--data-source-path` defaults to it), built slime's way as `cls(args)`: the
    prompts of `--prompt-data` (untokenised) with `rollout_global_dataset`, else only its buffer.
    The controller builds the default one through `DataSource.from_args` (with the tokenizer)."""

    def __init__(self, args: Any, prompts: list[Sample] | None = None, n_samples_per_prompt: int | None = None,
                 shuffle: bool | None = None, filtered: int = 0):
        if prompts is None:
            prompts = []
            if getattr(args, "rollout_global_dataset", True) and getattr(args, "prompt_data", None):
                prompts, filtered = build_prompt_samples(args, args.prompt_data, args.input_key, args.label_key, None)
        super().__init__(args, prompts, n_samples_per_prompt or args.n_samples_per_prompt,
                         bool(getattr(args, "rollout_shuffle", False) if shuffle is None else shuffle), filtered)


RolloutDataSource = RolloutDataSourceWithBuffer  # slime's other name
