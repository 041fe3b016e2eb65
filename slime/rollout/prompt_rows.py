"""One prompt row: reading rows, path slices, prompt-length limits, and a row -> template `Sample`.

The row-level half of the data source, below both `prompt_index` (which serves rows from a file) and
`data_source` (which hands out groups): each imports it, neither imports the other. Errors name the
file, the line (row) and the key.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from slime.rollout.flags import PromptConfig, RolloutConfig
from slime.rollout.multimodal_rows import row_images, with_image_parts
from slime.utils.misc import get_by_path
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
            return pq.read_table(path).to_pylist(maps_as_pydicts="lossy")  # a map<k,v> column is a dict
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


_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<stop>-?\d*)\]$")


def parse_path_slice(path: str | Path) -> tuple[str, slice | None]:
    """slime's `FILE@[start:end]` syntax: the file and the row slice (Python semantics, negatives allowed)."""
    m = _SLICE.match(str(path))
    if m is None:
        return str(path), None
    start, stop = m.group("start"), m.group("stop")
    return m.group("path"), slice(int(start) if start else None, int(stop) if stop else None)


def prompt_limit(config: PromptConfig) -> tuple[int | None, str]:
    """Longest prompt kept (tokens) and the flag that sets it; slime keeps len <= max_prompt_len."""
    if config.rollout_max_prompt_len is not None:
        return config.rollout_max_prompt_len, "--rollout-max-prompt-len"
    if config.rollout_max_context_len is not None:
        return config.rollout_max_context_len - 1, "--rollout-max-context-len"
    return None, ""


DEFAULT_ROLLOUT = RolloutConfig.defaults()["rollout_function_path"]  # the flag's default, written once there


def _row_tools(value: Any, where: str) -> Any:
    """A `--tool-key` value: a tool-schema list (slime; a JSON string of one too) or verl's tools_kwargs dict."""
    # here, not at the top: the tool registry (jsonschema, pydantic) costs every command's start ~0.4 CPU s,
    # and only rows with tools need it
    from slime.tools.registry import decode_tools_value

    try:
        return decode_tools_value(value)
    except ValueError as e:
        raise DataError(f"{where}: --tool-key: {e}") from None


def _check_text(text: str, where: str, what: str) -> None:
    """Text the tokenizer can take: a lone surrogate (JSON's "\\ud800") is not text."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(
            f"{where}: {what} holds a lone surrogate ({text[e.start]!r} at character {e.start}), not text; fix the row"
        ) from None


def _check_messages(messages: list[Any], where: str, input_key: str, templated: bool) -> None:
    """What a chat template needs, checked whether preflight renders it (--apply-chat-template) or the
    default generate will: a non-empty list of messages, each a role and text content (a string, a
    list of content parts, or null beside tool calls), and no lone surrogate anywhere in it."""
    if not messages:
        who = "--apply-chat-template" if templated else "the chat template"
        raise DataError(f"{where}: key {input_key!r} is an empty message list ({who} has nothing to render)")
    for k, m in enumerate(messages):
        if not isinstance(m.get("role"), str):
            raise DataError(f"{where}: {input_key}[{k}]['role'] must be a string, got {type(m.get('role')).__name__}")
        if not templated and "content" not in m:  # (templates read it; the default generate renders it later)
            raise DataError(f"{where}: {input_key}[{k}] has no 'content' (null is allowed beside tool calls)")
        content = m.get("content")
        if content is not None and not isinstance(content, (str, list)):
            raise DataError(
                f"{where}: {input_key}[{k}]['content'] must be a string (or a list of content parts), "
                f"got {type(content).__name__} {content!r:.40}"
            )
        for j, part in enumerate(content if isinstance(content, list) else []):
            if not isinstance(part, dict):
                raise DataError(
                    f"{where}: {input_key}[{k}]['content'][{j}] must be a content part (an object), "
                    f"got {type(part).__name__} {part!r:.40}"
                )
        _check_strings(m, where, f"{input_key}[{k}]")


def _check_strings(value: Any, where: str, what: str) -> None:
    """Every string inside `value` (keys too) is text the tokenizer can take."""
    if isinstance(value, str):
        _check_text(value, where, what)
    elif isinstance(value, dict):
        for key, v in value.items():
            _check_strings(key, where, what)
            _check_strings(v, where, f"{what}[{key!r}]")
    elif isinstance(value, list):
        for j, v in enumerate(value):
            _check_strings(v, where, f"{what}[{j}]")


def _default_generate(config: PromptConfig) -> bool:
    """The rollout reads prompts with the default generate (text or messages only); a rollout or generate
    function of the user's own reads what it reads."""
    return config.custom_generate_function_path is None and config.rollout_function_path == DEFAULT_ROLLOUT


def _row_value(row: dict[str, Any], key: str, where: str, what: str, flag: str) -> Any:
    try:
        return get_by_path(row, key)
    except KeyError as e:
        raise DataError(f"{where}: missing {what} key {key!r} (no field {e.args[0]!r}); set {flag}") from None


def _row_metadata(config: PromptConfig, row: dict[str, Any], where: str) -> tuple[dict[str, Any], Any]:
    """--metadata-key's dict and --tool-key's tools (a schema list, else verl's tools_kwargs)."""
    metadata: dict[str, Any] = {}
    mkey = config.metadata_key
    if mkey:
        try:
            meta = get_by_path(row, mkey)
            metadata.update(meta if isinstance(meta, dict) else {"metadata": meta})
        except KeyError:
            pass
    tkey = config.tool_key
    tools = None
    if tkey:
        try:
            value = _row_tools(get_by_path(row, tkey), where)
        except KeyError:
            value = None
        if isinstance(value, list):
            tools = metadata["tools"] = value
        elif value is not None:
            metadata["tools_kwargs"] = value
    if config.interaction_config_path:
        metadata["interaction_kwargs"] = _row_interaction(config.interaction_key, row, where)
    return metadata, tools


def _row_interaction(key: str, row: dict[str, Any], where: str) -> dict[str, Any]:
    """verl's interaction_kwargs of a row (at `key`, --interaction-key): a mapping whose 'name' picks the
    interaction; verl requires it on every row when an interaction config is given."""
    value = _row_value(row, key, where, "interaction", "--interaction-key")
    if hasattr(value, "tolist"):  # a Parquet struct read back as numpy
        value = value.tolist()
    if not isinstance(value, dict):
        raise DataError(
            f"{where}: --interaction-key {key!r}: expected verl's interaction_kwargs mapping, "
            f"got {type(value).__name__}"
        )
    if not isinstance(value.get("name"), str) or not value["name"]:
        raise DataError(
            f"{where}: --interaction-key {key!r}: no 'name' string (it picks the interaction of "
            f"--interaction-config-path; verl requires it)"
        )
    return value


def sample_from_row(
    config: PromptConfig,
    row: dict[str, Any],
    where: str,
    input_key: str,
    label_key: str | None,
    tokenizer: Any = None,
    template_kwargs: dict[str, Any] | None = None,
    *,
    tokenize: bool = True,
    base_dir: Path | None = None,
) -> Sample:
    """One row as the template Sample the data source copies into groups: prompt (rendered with
    --apply-chat-template, given the row's tools and --apply-chat-template-kwargs, as slime passes
    them), label, metadata, the row's images (--multimodal-keys, read and checked; relative paths also
    under `base_dir`) and the prompt's tokens when a tokenizer is given (not for a prompt with images:
    the processor expands their placeholders when it is generated). Every failure is a DataError naming
    `where` (file and line)."""
    prompt = _row_value(row, input_key, where, "input", "--input-key")
    label = _row_value(row, label_key, where, "label", "--label-key") if label_key else None
    metadata, tools = _row_metadata(config, row, where)
    images = row_images(config.multimodal_keys, row, where, base_dir, DataError)
    if images is not None and isinstance(prompt, (str, list)):  # slime: --multimodal-keys rows are conversations
        if isinstance(prompt, list) and not all(isinstance(m, dict) and "role" in m for m in prompt):
            raise DataError(f"{where}: key {input_key!r} is a list but not of chat messages")
        prompt = with_image_parts(prompt, images[0], where, DataError)
    elif images and images[1]:
        raise DataError(
            f"{where}: key {input_key!r} is {type(prompt).__name__}; a prompt with images "
            "(--multimodal-keys) must be text or a message list"
        )
    if isinstance(prompt, list):
        if not all(isinstance(m, dict) and "role" in m for m in prompt):
            raise DataError(f"{where}: key {input_key!r} is a list but not of chat messages")
        metadata["messages"] = prompt
        templated = config.apply_chat_template
        if templated or _default_generate(config):
            _check_messages(prompt, where, input_key, templated)
        if templated:
            if tokenizer is None:
                raise DataError("--apply-chat-template needs a tokenizer (--hf-checkpoint)")
            try:
                prompt = tokenizer.apply_chat_template(
                    prompt, tools=tools, tokenize=False, add_generation_prompt=True, **(template_kwargs or {})
                )
            except Exception as e:  # noqa: BLE001 - jinja's errors name neither the file nor the line
                raise DataError(
                    f"{where}: --apply-chat-template cannot render key {input_key!r}: "
                    f"{type(e).__name__}: {str(e).strip()[:200]}"
                ) from None
    elif not isinstance(prompt, str) and config.apply_chat_template:
        raise DataError(
            f"{where}: key {input_key!r} is {type(prompt).__name__}; --apply-chat-template needs a "
            "string or a message list"
        )
    elif not isinstance(prompt, str) and _default_generate(config):
        raise DataError(
            f"{where}: key {input_key!r} is {type(prompt).__name__}; the default generate reads text "
            "or a message list (set --custom-generate-function-path to read other prompts)"
        )
    # any other prompt (tau-bench's `"index": 3`) goes to the generate function as it is, as in slime
    sample = Sample(prompt=prompt, label=label, metadata=metadata)
    if images and images[1]:
        sample.multimodal_inputs = {"images": images[1], "videos": None}  # as slime's process_vision_info
    if isinstance(prompt, str):
        if not prompt and _default_generate(config):
            raise DataError(f"{where}: key {input_key!r} is an empty string (no prompt to generate from)")
        _check_text(prompt, where, f"key {input_key!r}")
        if tokenizer is not None and tokenize and sample.multimodal_inputs is None:
            sample.tokens = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return sample


def too_long(config: PromptConfig, num_tokens: int, where: str) -> bool:
    """A prompt of `num_tokens` over the limit: filtered (True), or refused with --over-long-prompt error."""
    max_len, limit_flag = prompt_limit(config)
    if max_len is None or num_tokens <= max_len:
        return False
    if config.over_long_prompt == "error":
        raise DataError(
            f"{where}: prompt has {num_tokens} tokens, over the limit "
            f"{max_len} ({limit_flag}); use --over-long-prompt filter"
        )
    return True
