"""Prompt data and the sample buffer.

The data source hands out *groups*: `n_samples_per_prompt` copies of one prompt sharing a
`group_index`, each with a unique `index`. Recycled groups (aborted partial rollouts, groups a
filter dropped for later) wait in a buffer and are served first. Its whole state, buffer
included, is saved and restored, so a resumed run neither repeats nor skips prompts. Prompts are
read from the file when served (`prompt_index.PromptIndex`); `prompt_rows.sample_from_row` turns one row
into a template Sample.
"""

from __future__ import annotations

import json
import logging
import random
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# re-exported: their old home
from slime.rollout.prompt_rows import DEFAULT_ROLLOUT, DataError, parse_path_slice  # noqa: F401
from slime.rollout.prompt_rows import prompt_limit, read_rows, sample_from_row, too_long  # noqa: F401
from slime.rollout.sample_clone import clone_group
from slime.utils.atomic_file import write_atomic
from slime.utils.misc import load_function
from slime.utils.types import Sample
from slime.utils.plugin_args import completed

logger = logging.getLogger(__name__)


def build_prompt_samples(
    args: Any, path: str | Path, input_key: str, label_key: str | None, tokenizer: Any = None
) -> tuple[list[Sample], int]:
    """One template Sample per usable row, and how many rows were filtered as too long (a list:
    for eval sets and callers that want every row; the data source reads `PromptIndex` on demand).
    `path` may end in slime's `@[start:end]` row slice."""
    from slime.rollout.prompt_index import PromptIndex

    index = PromptIndex.from_args(args, path, input_key, label_key, tokenizer)
    return index.read_all(), index.filtered


def pop_first(args: Any, rollout_id: Any, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]:
    """slime's default buffer filter: the oldest `num_samples` groups (slime's name for the count of
    groups), removed from the buffer."""
    taken = buffer[:num_samples]
    del buffer[:num_samples]
    return taken


class DataSource:
    """Serves groups of samples, epoch after epoch, recycled groups first."""

    def __init__(
        self, args: Any, prompts: list[Sample], n_samples_per_prompt: int, shuffle: bool = False, filtered: int = 0
    ):
        args = completed(args)
        self.args = args
        self.prompts = prompts
        self.n = n_samples_per_prompt
        self.shuffle = shuffle
        self.seed = int(args.rollout_seed)
        self.filtered_prompts = filtered
        self.epoch_id = 0
        self.offset = 0
        self.group_counter = 0
        self.sample_counter = 0
        self.buffer: list[list[Sample]] = []
        self.metadata: dict[str, Any] = {}  # slime's: what plugins keep with the data (update_metadata)
        path = args.buffer_filter_path
        # --buffer-filter-path: slime's `fn(args, rollout_id, buffer, num_groups) -> groups` (it removes them)
        self.buffer_filter = load_function(path, "--buffer-filter-path") if path else pop_first
        self._order = self._epoch_order()

    @classmethod
    def from_args(cls, args: Any, tokenizer: Any = None) -> "DataSource":
        """The prompts of --prompt-data, indexed and read as they are served (`PromptIndex`)."""
        args = completed(args)
        from slime.rollout.prompt_index import PromptIndex

        if not args.prompt_data:
            raise DataError("--prompt-data is required (a JSONL or parquet file)")
        prompts = PromptIndex.from_args(args, args.prompt_data, args.input_key, args.label_key, tokenizer)
        return cls(args, prompts, args.n_samples_per_prompt, args.rollout_shuffle, prompts.filtered)

    def _epoch_order(self) -> Sequence[int]:
        if not self.shuffle:
            return range(len(self.prompts))
        order = list(range(len(self.prompts)))
        random.Random(self.seed + self.epoch_id).shuffle(order)
        return array("q", order)  # 8 bytes a prompt, not a Python int each

    def __len__(self) -> int:
        return len(self.prompts)

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """`num_groups` groups: from the buffer first, then fresh prompts."""
        groups = (
            list(self.buffer_filter(self.args, None, self.buffer, num_groups)) if self.buffer and num_groups else []
        )
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
        group = clone_group(template, self.n)  # each as copy.deepcopy, at a fraction of its CPU
        for s in group:
            s.group_index = self.group_counter
            s.index = self.sample_counter
            self.sample_counter += 1
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

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """slime's: merge into the data source's metadata (saved with its state)."""
        self.metadata.update(metadata)

    def get_metadata(self) -> dict[str, Any]:
        return self.metadata

    # --- state ---
    def state_dict(self, held: list[list[Sample]] | None = None) -> dict[str, Any]:
        """The whole state; `held` are groups handed out and not yet trained (a background worker's),
        saved behind the buffer so a resumed run serves them again."""
        return {
            "epoch_id": self.epoch_id,
            "offset": self.offset,
            "group_counter": self.group_counter,
            "sample_counter": self.sample_counter,
            "num_prompts": len(self.prompts),
            "buffer": [[s.to_dict() for s in g] for g in [*self.buffer, *(held or [])]],
            **({"metadata": dict(self.metadata)} if self.metadata else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("num_prompts") != len(self.prompts):
            raise DataError(
                f"data source state was saved for {state.get('num_prompts')} prompts, "
                f"the data now has {len(self.prompts)}"
            )
        self.epoch_id, self.offset = state["epoch_id"], state["offset"]
        self.group_counter, self.sample_counter = state["group_counter"], state["sample_counter"]
        self.buffer = [[Sample.from_dict(d) for d in g] for g in state["buffer"]]
        self.metadata = dict(state.get("metadata") or {})
        self._order = self._epoch_order()

    def save(self, directory: str | Path, rollout_id: int, held: list[list[Sample]] | None = None) -> Path:
        path = Path(directory) / f"rollout_state_{rollout_id}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(self.state_dict(held)))
        write_atomic(Path(directory) / "latest_rollout_id.txt", str(rollout_id))
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
                raise DataError(
                    f"--load {directory}: {latest} does not hold a rollout id: {latest.read_text()[:40]!r}"
                ) from None
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

    def __init__(
        self,
        args: Any,
        prompts: Any = None,
        n_samples_per_prompt: int | None = None,
        shuffle: bool | None = None,
        filtered: int = 0,
    ):
        args = completed(args)
        if prompts is None:
            prompts = []
            if args.rollout_global_dataset and args.prompt_data:
                from slime.rollout.prompt_index import PromptIndex

                prompts = PromptIndex.from_args(args, args.prompt_data, args.input_key, args.label_key, None)
                filtered = prompts.filtered
        super().__init__(
            args,
            prompts,
            n_samples_per_prompt or args.n_samples_per_prompt,
            bool(args.rollout_shuffle if shuffle is None else shuffle),
            filtered,
        )


RolloutDataSource = RolloutDataSourceWithBuffer  # slime's other name
