"""`preflight(args)`: every input checked before Ray or any engine starts.

Why: an input error found inside the RolloutManager actor arrives 20-30 s later, after Ray and
the engines started, under a generic actor-died headline with the useful line buried at the end
of a Ray traceback. Here each input is read through once with the loader that will use it
later (plugins, prompt and eval data with their encoding, tool YAML, debug rollout files,
`--load` state) and the first problem is raised as `PreflightError`, whose message starts with
the flag and names the file and line. It also resolves where a `--load` run resumes: slime's
rule, the saved rollout id + 1.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from slime.rollout.data_source import (DataError, DataSource, RolloutDataSourceWithBuffer, build_prompt_samples,
                                      parse_path_slice)
from slime.utils.misc import load_function

PLUGIN_FLAGS = ("rollout_function_path", "eval_function_path", "custom_generate_function_path", "custom_rm_path",
                "dynamic_sampling_filter_path", "data_source_path", "buffer_filter_path",
                "rollout_sample_filter_path", "rollout_all_samples_process_path",
                "custom_rollout_log_function_path", "custom_eval_rollout_log_function_path")
STATE_KEYS = ("epoch_id", "offset", "group_counter", "sample_counter", "buffer")


class PreflightError(ValueError):
    """A bad input, found before anything started; the message names the flag, file and line."""


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_utf8(path: Path, flag: str) -> None:
    """Fail on the first line that is not UTF-8, naming file, line and column (the JSON reader
    would only say `UnicodeDecodeError` with a byte offset)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PreflightError(f"{flag}: {path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                                     f"column {e.start + 1}); the data must be UTF-8 JSONL or parquet") from None


def check_prompt_file(args: Any, flag: str, path: str, input_key: str, label_key: str | None) -> int:
    """Encoding and structure (every row has the keys, the right types, valid tools); returns the rows
    used. Structure only: templating and length filtering need the tokenizer, which the engines' side
    loads anyway."""
    file_path, _ = parse_path_slice(path)
    p = Path(file_path)
    if not p.is_file():
        raise PreflightError(f"{flag}: file not found: {p}")
    if p.suffix != ".parquet":
        check_utf8(p, flag)
    structural = copy.copy(args)
    structural.apply_chat_template = False  # a message list is checked as messages, not rendered
    structural.rollout_max_prompt_len = structural.rollout_max_context_len = None
    try:
        samples, _ = build_prompt_samples(structural, path, input_key, label_key, None)
    except DataError as e:
        raise PreflightError(f"{flag}: {e}") from None
    if args.apply_chat_template:
        for k, s in enumerate(samples):
            if not isinstance(s.prompt, (str, list)):
                raise PreflightError(f"{flag}: {path}: prompt #{k} (key {input_key!r}) is {type(s.prompt).__name__}; "
                                     "--apply-chat-template needs a string or a message list (without it a "
                                     "non-string prompt goes to the generate function as it is)")
    return len(samples)


def check_data(args: Any) -> None:
    if not args.prompt_data and not args.load_debug_rollout_data and args.start_rollout_id < args.num_rollout:
        raise PreflightError(f"--prompt-data: required to generate rollouts {args.start_rollout_id}.."
                             f"{args.num_rollout - 1} (or replay them with --load-debug-rollout-data; "
                             "--num-rollout 0 runs the evals alone)")
    if args.prompt_data and not args.load_debug_rollout_data:
        path = getattr(args, "data_source_path", None)
        if path and load_function(path, "--data-source-path") not in (DataSource, RolloutDataSourceWithBuffer):
            p = Path(parse_path_slice(args.prompt_data)[0])
            if p.is_file() and p.suffix != ".parquet":
                check_utf8(p, "--prompt-data")  # a custom data source reads it its own way
        else:
            check_prompt_file(args, "--prompt-data", args.prompt_data, args.input_key, args.label_key)
    for dataset in getattr(args, "eval_datasets", None) or []:
        if args.load_debug_rollout_data:
            break
        name, path = dataset[0], dataset[1]
        input_key = getattr(dataset, "input_key", None) or args.eval_input_key or args.input_key
        label_key = getattr(dataset, "label_key", None) or args.eval_label_key or args.label_key
        flag = f"--eval-config {args.eval_config} [{name}]" if getattr(args, "eval_config", None) \
            else f"--eval-prompt-data {name}"
        check_prompt_file(args, flag, path, input_key, label_key)


def check_tools(args: Any) -> None:
    path = getattr(args, "tool_config_path", None)
    if not path:
        return
    from slime.tools.registry import load_tool_config

    try:
        load_tool_config(path)
    except Exception as e:  # noqa: BLE001 - ToolConfigError names the file and the entry
        raise PreflightError(f"--tool-config-path: {e}") from None


def check_debug_rollouts(args: Any) -> None:
    template = args.load_debug_rollout_data
    if not template:
        return
    from slime.rollout.debug_data import DebugDataError, load_debug_rollout, path_for

    ids = list(range(args.start_rollout_id, max(args.num_rollout, args.start_rollout_id + 1)))
    missing = [str(path_for(template, i)) for i in ids if not path_for(template, i).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise PreflightError(f"--load-debug-rollout-data: file not found: {missing[0]}{more}; rollouts "
                             f"{ids[0]}..{ids[-1]} are replayed (--start-rollout-id, --num-rollout)")
    try:
        load_debug_rollout(template, ids[0])  # the format, read through once
    except DebugDataError as e:
        raise PreflightError(str(e)) from None


def saved_rollout_id(directory: str | Path) -> int | None:
    """The rollout id `--load DIR` resumes after (None: nothing saved there yet), with its state checked."""
    d = Path(directory)
    latest = d / "latest_rollout_id.txt"
    if not d.exists() or not latest.exists():
        return None  # slime: --load of a fresh directory starts from scratch
    text = latest.read_text(errors="replace").strip()
    try:
        rollout_id = int(text)
    except ValueError:
        raise PreflightError(f"--load {directory}: {latest}: expected a rollout id (an integer), got {text[:80]!r}; "
                             f"fix or remove the file (it is written by --save)") from None
    state = d / f"rollout_state_{rollout_id}.json"
    if not state.is_file():
        raise PreflightError(f"--load {directory}: {latest} names rollout {rollout_id} but {state} does not exist")
    try:
        data = json.loads(state.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PreflightError(f"--load {directory}: {state}: not a valid data source state ({e})") from None
    missing = [k for k in STATE_KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise PreflightError(f"--load {directory}: {state}: not a data source state (missing {', '.join(missing)})")
    if not isinstance(data["buffer"], list) or not all(isinstance(g, list) for g in data["buffer"]):
        raise PreflightError(f"--load {directory}: {state}: 'buffer' must be a list of groups")
    return rollout_id


def resolve_resume(args: Any) -> int | None:
    """`--load DIR` continues at the saved rollout id + 1 (slime's rule) unless --start-rollout-id
    says otherwise; returns the saved id."""
    if not getattr(args, "load", None):
        return None
    saved = saved_rollout_id(args.load)
    if saved is not None and not args.start_rollout_id:
        args.start_rollout_id = saved + 1
    return saved


def preflight(args: Any) -> dict[str, Any]:
    """Check every input; raise `PreflightError` at the first bad one. Returns what was resolved."""
    for dest in PLUGIN_FLAGS:
        if getattr(args, dest, None):
            try:
                load_function(getattr(args, dest), _flag(dest))
            except Exception as e:  # noqa: BLE001 - PluginLoadError names the flag and the import failure
                raise PreflightError(str(e)) from e
    saved = resolve_resume(args)
    check_data(args)
    check_tools(args)
    check_debug_rollouts(args)
    return {"resumed_after": saved}
