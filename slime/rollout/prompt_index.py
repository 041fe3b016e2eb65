"""`PromptIndex`: the prompts of a JSONL or parquet file, read when served, not held as objects.

A JSONL file is scanned once for where each non-blank line starts and how long it is (24 bytes a
row with its line number); a row is parsed, templated and tokenised (`sample_from_row`) when the
data source serves it, by `os.pread` (no shared file position). A parquet file stays an Arrow
table, one row converted at a time. With a prompt-length limit every row is tokenised once while
indexing (slime filters over-long prompts at load) and only the kept rows stay in the index. That
filter runs once per command: preflight records the rows it dropped in `args` (`carry_filter`),
keyed by what decides them (the file as it is, keys, template, tokenizer, limit), and the manager's
index takes them from there instead of tokenising every row again.
Indexing prints a progress line every few seconds, so a large file does not look like a hang.
"""

from __future__ import annotations

import json
import os
import time
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Iterator

from slime.rollout.flags import PromptConfig
from slime.rollout.prompt_rows import DataError, parse_path_slice, prompt_limit, sample_from_row, too_long
from slime.utils.plugin_args import completed
from slime.utils.types import Sample

PROGRESS_EVERY_S = 5.0  # seconds between two progress lines while indexing
PROGRESS_ROWS = 4096  # rows between two looks at the clock
TOKENIZE_BATCH = 256  # rendered prompts tokenised in one call while checking or filtering
CARRIED = "prompt_length_filter"  # args attribute: {PromptIndex.filter_key: rows dropped}, set by preflight


def carried_filter(args: Any) -> dict[tuple, array] | None:
    """The rows preflight's length filter dropped (`PromptIndex.carry_filter`), recorded in `args`."""
    return getattr(args, CARRIED, None)


class IndexProgress:
    """`prompt data FILE: <what> N of M MB (R rows)` at most every PROGRESS_EVERY_S seconds."""

    def __init__(self, path: Path, what: str, total_bytes: int):
        self.path, self.what, self.total = path, what, total_bytes
        self.start = self.last = time.monotonic()

    def tick(self, done_bytes: int, rows: int, final: bool = False) -> None:
        now = time.monotonic()
        if final and now - self.start < PROGRESS_EVERY_S:
            return  # a file read in a blink needs no line
        if final or now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            print(
                f"prompt data {self.path}: {self.what} {done_bytes / 2**20:.0f} of {self.total / 2**20:.0f} MB "
                f"({rows} rows, {now - self.start:.0f} s){'' if not final else ', done'}",
                flush=True,
            )


MAX_LINE_BYTES = 256 << 20  # a prompt row beyond this is not a prompt (a 2.2 GB line took 105 s and 4.5 GB to fail)


def bounded_lines(f: Any, path: Path) -> Iterator[bytes]:
    """The lines of binary file `f`, each read at most MAX_LINE_BYTES at a time: a longer line is a
    DataError naming the file and line, before it is held in memory whole."""
    lineno = 0
    while raw := f.readline(MAX_LINE_BYTES + 1):
        lineno += 1
        if len(raw) > MAX_LINE_BYTES:
            raise DataError(
                f"{path}:{lineno}: the line is longer than {MAX_LINE_BYTES} bytes; a prompt row is "
                f"one JSON object per line (is this JSONL, or a whole dataset on one line?)"
            )
        yield raw


def scan_jsonl(path: Path) -> tuple[array, array, array]:
    """(start, length, line number) of every non-blank line."""
    starts, lengths, lines = array("q"), array("q"), array("q")
    progress = IndexProgress(path, "indexed", path.stat().st_size)
    pos = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(bounded_lines(f, path), 1):
            if not raw.isspace():
                starts.append(pos)
                lengths.append(len(raw))
                lines.append(lineno)
            pos += len(raw)
            if lineno % PROGRESS_ROWS == 0:
                progress.tick(pos, len(starts))
    progress.tick(pos, len(starts), final=True)
    return starts, lengths, lines


def count_rows(path: str | Path) -> int:
    """Rows of a prompt file after its `@[start:end]` slice, without reading them into memory."""
    file_path, row_slice = parse_path_slice(path)
    p = Path(file_path)
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        n = pq.ParquetFile(p).metadata.num_rows
    else:
        with open(p, "rb") as f:
            n = sum(1 for raw in f if not raw.isspace())
    return len(range(n)[row_slice]) if row_slice is not None else n


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What changes when a file is rewritten or replaced: size, modification time, inode, device."""
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev


class PromptIndex(Sequence):
    """`index[i]` is the i-th usable prompt as a template `Sample` (a fresh object each time)."""

    def __init__(
        self,
        config: PromptConfig,
        path: str | Path,
        input_key: str,
        label_key: str | None,
        tokenizer: Any = None,
        *,
        carried: dict[tuple, array] | None = None,
    ):
        """`carried`: the rows preflight's length filter dropped, by `filter_key` (`carry_filter`)."""
        file_path, row_slice = parse_path_slice(path)
        self.path, self._slice = Path(file_path), row_slice
        if not self.path.is_file():
            raise DataError(f"prompt data file not found: {self.path}")
        self.config, self.input_key, self.label_key, self.tokenizer = config, input_key, label_key, tokenizer
        self.template_kwargs = config.apply_chat_template_kwargs or {}
        if not isinstance(self.template_kwargs, dict):
            raise DataError(f"--apply-chat-template-kwargs must be a JSON object, got {self.template_kwargs!r}")
        self._table = None
        self._fd: int | None = None
        if self.path.suffix == ".parquet":
            self._table = self._read_parquet()
            n = self._table.num_rows
            self._starts, self._lengths, self._lines = array("q", range(n)), array("q"), array("q", range(n))
        else:
            self._indexed = file_identity(self.path.stat())
            self._starts, self._lengths, self._lines = scan_jsonl(self.path)
        total = len(self._starts)
        if not total:
            raise DataError(f"{self.path}: no prompts in file")
        if row_slice is not None:
            self._keep(range(total)[row_slice])
            if not len(self._starts):
                raise DataError(
                    f"{self.path}: the row slice @[{row_slice.start}:{row_slice.stop}] selects no rows "
                    f"(the file has {total})"
                )
        self.filtered = 0
        self._images: Any = None  # the checkpoint's image side, loaded for the first prompt with images
        self.dropped: array | None = None  # rows the length filter dropped (positions before dropping)
        self.read_through = False  # every row converted once (while filtering, or by check_all)
        max_len, _ = prompt_limit(config)
        if max_len is not None and tokenizer is not None:
            dropped = (carried or {}).get(self.filter_key())
            self._drop(dropped if dropped is not None else self._too_long_rows())

    @classmethod
    def from_args(
        cls, args: Any, path: str | Path, input_key: str, label_key: str | None, tokenizer: Any = None
    ) -> "PromptIndex":
        """The index of a namespace (completed here, where it enters): its `PromptConfig`, and the rows
        preflight dropped (recorded in it)."""
        args = completed(args)
        return cls(PromptConfig.from_args(args), path, input_key, label_key, tokenizer, carried=carried_filter(args))

    def _read_parquet(self) -> Any:
        import pyarrow.parquet as pq

        try:
            return pq.read_table(self.path)
        except Exception as e:  # noqa: BLE001 - pyarrow's errors vary; the file is what matters
            raise DataError(f"{self.path}: cannot read parquet: {e}") from e

    def _keep(self, positions: Sequence[int]) -> None:
        self._starts = array("q", (self._starts[i] for i in positions))
        self._lines = array("q", (self._lines[i] for i in positions))
        if self._table is None:
            self._lengths = array("q", (self._lengths[i] for i in positions))

    def filter_key(self) -> tuple:
        """What decides the rows the length filter drops: the file as it is now, the slice, the keys,
        the template, the tokenizer and the limit. Equal keys, equal rows dropped."""
        st = self.path.stat()
        return (
            str(self.path.resolve()),
            st.st_size,
            st.st_mtime_ns,
            st.st_ino,
            repr(self._slice),
            self.input_key,
            self.label_key,
            bool(self.config.apply_chat_template),
            json.dumps(self.template_kwargs, sort_keys=True, default=repr),
            self.config.tool_key,
            getattr(self.tokenizer, "name_or_path", None),
            prompt_limit(self.config)[0],
        )

    def carry_filter(self, args: Any) -> None:
        """Record the rows this index dropped in `args`, for the manager's index of the same file
        (nothing when no length filter ran here)."""
        if self.dropped is not None:
            setattr(args, CARRIED, {**(carried_filter(args) or {}), self.filter_key(): self.dropped})

    def _too_long_rows(self) -> array:
        """slime's filter_long_prompt: tokenise every row once; the positions of the too long ones."""
        dropped = array(
            "q",
            (
                i
                for i, n in self._token_counts("tokenised")
                if n is not None and too_long(self.config, n, self.where(i))
            ),
        )
        self.read_through = True
        return array("q", sorted(dropped))

    def _drop(self, dropped: array) -> None:
        max_len = prompt_limit(self.config)[0]
        self.dropped, self.filtered = dropped, len(dropped)
        if self.filtered >= len(self._starts):
            raise DataError(f"{self.path}: every prompt was filtered as too long ({self.filtered} rows)")
        if self.filtered:
            print(
                f"prompt data {self.path}: filtered {self.filtered} prompt(s) longer than {max_len} tokens", flush=True
            )
            gone = set(dropped)
            self._keep([i for i in range(len(self._starts)) if i not in gone])

    def check_all(self) -> None:
        """Convert every row once (parse; with a tokenizer, render and tokenise), keeping none: the
        first bad row raises its DataError. What preflight runs before anything starts."""
        if not self.read_through:
            for _ in self._token_counts("checked"):
                pass
            self.read_through = True

    def _token_counts(self, what: str) -> Iterator[tuple[int, int | None]]:
        """(row, prompt tokens, or None when not tokenised) for every row: rendered one at a time,
        tokenised TOKENIZE_BATCH at a time (one call into the fast tokenizer, not one per row)."""
        size = self.path.stat().st_size
        progress = IndexProgress(self.path, what, size)
        pending: list[tuple[int, str]] = []
        for i in range(len(self)):
            sample = self.sample(i, tokenize=False)
            if self.tokenizer is not None and isinstance(sample.prompt, str):
                pending.append((i, sample.prompt, self._image_tokens(sample)))
            else:
                yield i, None
            if len(pending) >= TOKENIZE_BATCH:
                yield from self._count(pending)
                pending = []
            if i % PROGRESS_ROWS == 0:
                progress.tick(self._starts[i] if self._table is None else size * i // len(self), i)
        yield from self._count(pending)
        progress.tick(size, len(self), final=True)

    def _count(self, pending: list[tuple[int, str, int]]) -> Iterator[tuple[int, int]]:
        if pending:
            ids = self.tokenizer([text for _, text, _ in pending], add_special_tokens=False)["input_ids"]
            yield from ((i, len(tokens) + extra) for (i, _, extra), tokens in zip(pending, ids))

    def _image_tokens(self, sample: Any) -> int:
        """The tokens a prompt's images add past their one placeholder each (`--multimodal-keys`): the
        processor expands each to its own count before the engine runs it, so the length filter counts
        them as the engine will."""
        images = (sample.multimodal_inputs or {}).get("images") or []
        if not images:
            return 0
        if self._images is None:
            from slime.utils.prompt_images import PromptImages

            self._images = PromptImages.of_checkpoint(self.config.hf_checkpoint) or False
        return sum(self._images.count(image) - 1 for image in images) if self._images else 0

    def where(self, i: int) -> str:
        """`FILE:LINE` (JSONL) or `FILE row N` (parquet) of the i-th prompt, for messages."""
        return f"{self.path}:{self._lines[i]}" if self._table is None else f"{self.path} row {self._lines[i]}"

    def row(self, i: int) -> dict[str, Any]:
        if self._table is not None:
            return self._table.slice(self._starts[i], 1).to_pylist(maps_as_pydicts="lossy")[0]  # map<k,v>: a dict
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        raw = os.pread(self._fd, self._lengths[i], self._starts[i])
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            self._check_unchanged(i)
            raise DataError(f"{self.where(i)}: invalid JSON: {e}") from e
        if not isinstance(row, dict):
            self._check_unchanged(i)
            raise DataError(f"{self.where(i)}: expected a JSON object, got {type(row).__name__}")
        return row

    def _check_unchanged(self, i: int) -> None:
        """A row that no longer parses in a file rewritten since it was indexed: say so (rows are read by
        their byte offsets; the line itself may be valid). Rows appended at the end are no change here."""
        now = file_identity(os.fstat(self._fd))
        if now != self._indexed:
            raise DataError(
                f"{self.where(i)}: the file changed after it was indexed (size {self._indexed[0]} -> "
                f"{now[0]} bytes, or rewritten in place); prompt rows are read by their byte offsets "
                f"while the run goes on: do not rewrite --prompt-data during a run, or start it again"
            )

    def sample(self, i: int, tokenize: bool = True) -> Sample:
        return sample_from_row(
            self.config,
            self.row(i),
            self.where(i),
            self.input_key,
            self.label_key,
            self.tokenizer,
            self.template_kwargs,
            tokenize=tokenize,
            base_dir=self.path.parent,
        )

    def __len__(self) -> int:
        return len(self._starts)

    def __getitem__(self, i: int) -> Sample:  # type: ignore[override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return self.sample(i % len(self))

    def read_all(self) -> list[Sample]:
        """Every usable prompt, then the file closed: for callers that want the whole list (eval sets,
        `build_prompt_samples`); the data source reads the index on demand instead."""
        try:
            return list(self)
        finally:
            self.close()

    def close(self) -> None:
        if getattr(self, "_fd", None) is not None:  # also when __init__ failed before opening
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": None}  # a descriptor means nothing in another process
