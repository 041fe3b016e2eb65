"""`preflight(args)`: every input checked before Ray or any engine starts.

Why: an input error found inside the RolloutManager actor arrives 20-30 s later, after Ray and
the engines started, under a generic actor-died headline with the useful line buried at the end
of a Ray traceback. Here each input is read through once with the loader that will use it
later (plugins, prompt and eval data with their encoding, tool YAML, debug rollout files,
`--load` checkpoint and state, `--save` room) and the first problem is raised as `PreflightError`,
whose message starts with the flag and names the file and line. It also resolves where a `--load`
run resumes: slime's rule, the saved rollout id + 1 (slime-train: of its newest complete model
checkpoint, whose data state comes with it).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from slime.fleet.external_engines import ExternalEngineError, check_reachable, external_urls
from slime.rollout.flags import PromptConfig
from slime.rollout.data_source import (
    DEFAULT_ROLLOUT,
    DataError,
    DataSource,
    RolloutDataSourceWithBuffer,
    parse_path_slice,
)
from slime.train.checkpoint import (
    CHECKPOINT_TRACKER,
    CheckpointError,
    check_same_model,
    checkpoint_dir,
    data_state_dir,
    data_state_name,
    latest_checkpoint,
    verify_checkpoint,
)
from slime.train.save_dir import SaveDirError, check_save_dir, checkpoint_bytes
from slime.cli.flag_ranges import vocab_problem
from slime.utils.misc import load_function

PLUGIN_FLAGS = (
    "rollout_function_path",
    "eval_function_path",
    "custom_generate_function_path",
    "custom_rm_path",
    "dynamic_sampling_filter_path",
    "data_source_path",
    "buffer_filter_path",
    "rollout_sample_filter_path",
    "rollout_all_samples_process_path",
    "custom_rollout_log_function_path",
    "custom_eval_rollout_log_function_path",
    "custom_loss_function_path",
    "custom_pg_loss_reducer_function_path",
    "rollout_data_postprocess_path",
)
STATE_KEYS = ("epoch_id", "offset", "group_counter", "sample_counter", "buffer")


class PreflightError(ValueError):
    """A bad input, found before anything started; the message names the flag, file and line."""


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_utf8(path: Path, flag: str) -> None:
    """Fail on the first line that is not UTF-8, naming file, line and column (the JSON reader
    would only say `UnicodeDecodeError` with a byte offset)."""
    from slime.rollout.prompt_index import bounded_lines

    with open(path, "rb") as f:
        for lineno, raw in enumerate(_lines_or_refuse(bounded_lines(f, path), flag), 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise PreflightError(
                    f"{flag}: {path}:{lineno}: not UTF-8 text (byte 0x{raw[e.start]:02x} at "
                    f"column {e.start + 1}); the data must be UTF-8 JSONL or parquet"
                ) from None


def _lines_or_refuse(lines: Any, flag: str) -> Any:
    """`lines`, with a DataError (a line too long) raised as the flag's PreflightError."""
    try:
        yield from lines
    except DataError as e:
        raise PreflightError(f"{flag}: {e}") from None


def prompt_tokenizer(args: Any) -> Any:
    """The tokenizer the manager templates with, when --apply-chat-template asks for one."""
    if not args.apply_chat_template:
        return None
    from slime.utils.processing_utils import load_tokenizer

    path = args.hf_checkpoint
    if path is None:
        from slime.engine.default_model import ensure_default_model

        path = str(ensure_default_model())  # the command would convert it next anyway
    return load_tokenizer(path)


def check_prompt_file(
    args: Any, flag: str, path: str, input_key: str, label_key: str | None, tokenizer: Any = None
) -> int:
    """Every row read as the manager will (`PromptIndex`, one row at a time): encoding, keys, types,
    tools and, with --apply-chat-template, the rendered template and its tokens (and the length
    filter); returns the rows used. The first bad row raises, naming the flag, file and line."""
    from slime.rollout.prompt_index import PromptIndex, carried_filter

    file_path, _ = parse_path_slice(path)
    p = Path(file_path)
    if not p.is_file():
        raise PreflightError(f"{flag}: file not found: {p}")
    if p.suffix != ".parquet":
        check_utf8(p, flag)
    config = PromptConfig.from_args(args)
    if tokenizer is None:  # without a template the manager's tokens cannot fail: the rows' structure is checked
        config = dataclasses.replace(
            config, apply_chat_template=False, rollout_max_prompt_len=None, rollout_max_context_len=None
        )
    try:
        index = PromptIndex(config, path, input_key, label_key, tokenizer, carried=carried_filter(args))
        try:
            index.check_all()
        finally:
            index.close()
        if tokenizer is not None:
            index.carry_filter(args)  # the manager's index drops the same rows without tokenising them again
    except DataError as e:
        raise PreflightError(f"{flag}: {e}") from None
    return len(index)


def check_data(args: Any) -> None:
    if not args.prompt_data and not args.load_debug_rollout_data and args.start_rollout_id < args.num_rollout:
        raise PreflightError(
            f"--prompt-data: required to generate rollouts {args.start_rollout_id}.."
            f"{args.num_rollout - 1} (or replay them with --load-debug-rollout-data; "
            "--num-rollout 0 runs the evals alone)"
        )
    if args.load_debug_rollout_data:
        return  # the replayed files are checked by check_debug_rollouts; no prompt is read
    tokenizer = prompt_tokenizer(args) if args.prompt_data or getattr(args, "eval_datasets", None) else None
    if args.prompt_data:
        path = args.data_source_path
        if path and load_function(path, "--data-source-path") not in (DataSource, RolloutDataSourceWithBuffer):
            p = Path(parse_path_slice(args.prompt_data)[0])
            if p.is_file() and p.suffix != ".parquet":
                check_utf8(p, "--prompt-data")  # a custom data source reads it its own way
        else:
            check_prompt_file(args, "--prompt-data", args.prompt_data, args.input_key, args.label_key, tokenizer)
    for dataset in getattr(args, "eval_datasets", None) or []:
        name, path = dataset[0], dataset[1]
        input_key = getattr(dataset, "input_key", None) or args.eval_input_key or args.input_key
        label_key = getattr(dataset, "label_key", None) or args.eval_label_key or args.label_key
        flag = f"--eval-config {args.eval_config} [{name}]" if args.eval_config else f"--eval-prompt-data {name}"
        check_prompt_file(args, flag, path, input_key, label_key, tokenizer)


def check_tools(args: Any) -> None:
    path = args.tool_config_path
    if not path:
        return
    from slime.tools.reachability import check_services
    from slime.tools.registry import load_tool_config

    try:
        check_services(load_tool_config(path))
    except Exception as e:  # noqa: BLE001 - ToolConfigError names the file and the entry
        raise PreflightError(f"--tool-config-path: {e}") from None


def check_interactions(args: Any) -> None:
    """--interaction-config-path loads (every class imported and built), as the rollout will."""
    path = args.interaction_config_path
    if not path:
        return
    from slime.interactions.registry import InteractionConfigError, load_interaction_config

    try:
        names = load_interaction_config(path).names
    except InteractionConfigError as e:
        raise PreflightError(f"--interaction-config-path: {e}") from None
    check_rows_name_interactions(args, names)
    if args.rollout_function_path == DEFAULT_ROLLOUT and args.custom_generate_function_path is None:
        raise PreflightError(
            "--interaction-config-path: the default generate has no multi-turn loop and would never "
            "ask the interaction; set --rollout-function-path rollout_plugins.multi_turn."
            "generate_rollout (or --custom-generate-function-path rollout_plugins.multi_turn.generate)"
        )
    if args.max_user_turns is not None and args.max_user_turns < 1:
        raise PreflightError(
            f"--max-user-turns: must be at least 1, got {args.max_user_turns} (leave it unset for no limit)"
        )


def check_rows_name_interactions(args: Any, names: list[str]) -> None:
    """Each prompt row's interaction_kwargs names an interaction the YAML configures (found only when
    the row was served, mid-run, before)."""
    if not args.prompt_data or args.load_debug_rollout_data:
        return  # (a Namespace built by hand for the interaction checks may have neither)
    path = args.data_source_path
    if path and load_function(path, "--data-source-path") not in (DataSource, RolloutDataSourceWithBuffer):
        return  # a custom data source reads the rows its own way
    from slime.interactions.registry import check_sample_kwargs
    from slime.rollout.prompt_index import PromptIndex

    config = dataclasses.replace(
        PromptConfig.from_args(args),
        apply_chat_template=False,
        rollout_max_prompt_len=None,
        rollout_max_context_len=None,
    )
    try:
        index = PromptIndex(config, args.prompt_data, args.input_key, args.label_key)
        try:
            for i in range(len(index)):
                kwargs = index.sample(i, tokenize=False).metadata.get("interaction_kwargs")
                try:
                    check_sample_kwargs(kwargs, names, args.interaction_config_path)
                except ValueError as e:
                    raise PreflightError(f"--prompt-data: {index.where(i)}: {e}") from None
        finally:
            index.close()
    except DataError as e:
        raise PreflightError(f"--prompt-data: {e}") from None


def check_agent_workspaces(args: Any) -> None:
    """With --agent-command, each prompt row's workspace fields (files, git, grading), as the agent
    rollout reads them (`slime.agent.sandboxes.workspace`)."""
    if not (args.agent_command and args.prompt_data):
        return
    from slime.agent.sandboxes.workspace import WorkspaceError, check_prompt_rows

    try:
        check_prompt_rows(parse_path_slice(args.prompt_data)[0], args.metadata_key)
    except WorkspaceError as e:
        raise PreflightError(f"--prompt-data: {e}") from None


def check_debug_rollouts(args: Any) -> None:
    template = args.load_debug_rollout_data
    if not template:
        return
    from slime.rollout.debug_data import DebugDataError, load_debug_rollout, path_for

    ids = list(range(args.start_rollout_id, max(args.num_rollout, args.start_rollout_id + 1)))
    missing = [str(path_for(template, i)) for i in ids if not path_for(template, i).is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise PreflightError(
            f"--load-debug-rollout-data: file not found: {missing[0]}{more}; rollouts "
            f"{ids[0]}..{ids[-1]} are replayed (--start-rollout-id, --num-rollout)"
        )
    try:
        load_debug_rollout(template, ids[0])  # the format, read through once
    except DebugDataError as e:
        raise PreflightError(str(e)) from None


def check_data_state(path: Path, directory: str | Path) -> None:
    """A data source state file, read through once (the manager would fail on it after Ray started)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PreflightError(f"--load {directory}: {path}: not a valid data source state ({e})") from None
    missing = [k for k in STATE_KEYS if not isinstance(data, dict) or k not in data]
    if missing:
        raise PreflightError(f"--load {directory}: {path}: not a data source state (missing {', '.join(missing)})")
    if not isinstance(data["buffer"], list) or not all(isinstance(g, list) for g in data["buffer"]):
        raise PreflightError(f"--load {directory}: {path}: 'buffer' must be a list of groups")


def newest_data_state(directory: str | Path) -> int | None:
    """The rollout id `latest_rollout_id.txt` names (None: no data state saved there)."""
    latest = Path(directory) / "latest_rollout_id.txt"
    if not latest.exists():
        return None  # slime: --load of a fresh directory starts from scratch
    text = latest.read_text(errors="replace").strip()
    try:
        return int(text)
    except ValueError:
        raise PreflightError(
            f"--load {directory}: {latest}: expected a rollout id (an integer), got {text[:80]!r}; "
            f"fix or remove the file (it is written by --save)"
        ) from None


def saved_rollout_id(directory: str | Path) -> int | None:
    """The rollout id `--load DIR` resumes after (None: nothing saved there yet), with its state checked."""
    rollout_id = newest_data_state(directory)
    if rollout_id is None:
        return None
    state = Path(directory) / data_state_name(rollout_id)
    if not state.is_file():
        raise PreflightError(
            f"--load {directory}: {Path(directory) / 'latest_rollout_id.txt'} names rollout "
            f"{rollout_id} but {state} does not exist"
        )
    check_data_state(state, directory)
    return rollout_id


def trains_model(args: Any) -> bool:
    """slime-train's arguments (`parse_train_args` marks them): `--load` is then a model checkpoint
    that carries its data state, not a data state alone."""
    return bool(getattr(args, "trains_model", False))


def model_dir(args: Any) -> str | None:
    """The model the run will serve: --hf-checkpoint, else the default model when already converted."""
    if args.hf_checkpoint:
        return args.hf_checkpoint
    from slime.engine.default_model import converted_default_model

    found = converted_default_model()
    return str(found) if found else None


def uses_default_data_source(args: Any) -> bool:
    """Prompts served by our DataSource (whose state a checkpoint carries), not a custom --data-source-path."""
    if not args.prompt_data or args.load_debug_rollout_data:
        return False
    path = args.data_source_path
    return not path or load_function(path, "--data-source-path") is DataSource


def resolve_train_resume(args: Any) -> dict[str, Any]:
    """Where slime-train resumes: the newest complete model checkpoint (or --ckpt-step), verified
    against its manifest and --hf-checkpoint, with the data state saved in it; never the data
    alone (that would continue the data on the base model)."""
    root = args.load
    try:
        model_id = latest_checkpoint(root, args.ckpt_step)
    except CheckpointError as e:
        raise PreflightError(str(e)) from None
    data_id = newest_data_state(root)
    if model_id is None:
        if data_id is not None:
            raise PreflightError(
                f"--load {root}: holds the data source's state after rollout {data_id} but no model checkpoint "
                f"({CHECKPOINT_TRACKER}); resuming would continue the data on the base model and lose what was "
                "trained. Start afresh with another --load (or none); runs save the model with --save-interval N, "
                "or once after their last rollout"
            )
        return {"resumed_after": None}
    try:
        manifest = verify_checkpoint(root, model_id, without_manifest=args.load_without_manifest)
        check_same_model(root, model_id, manifest, model_dir(args))
    except CheckpointError as e:
        raise PreflightError(str(e)) from None
    args.ckpt_step = model_id  # the trainer loads this one, not whatever the tracker names by then
    state = Path(data_state_dir(root, model_id) or root) / data_state_name(model_id)
    if state.is_file():
        check_data_state(state, root)
    elif uses_default_data_source(args):
        raise PreflightError(
            f"--load {root}: the checkpoint of rollout {model_id} has no data source state "
            f"({checkpoint_dir(root, model_id) / data_state_name(model_id)} nor {state}); the "
            "prompts would restart from the first while the model continues"
        )
    start = model_id + 1
    if args.start_rollout_id and args.start_rollout_id != start:
        raise PreflightError(
            f"--start-rollout-id {args.start_rollout_id} with --load {root}: the trainer resumes "
            f"from the checkpoint of rollout {model_id}, at rollout {start}; drop "
            "--start-rollout-id (--ckpt-step picks another checkpoint)"
        )
    args.start_rollout_id = start
    optimizer = "fresh optimizer (--no-load-optim)" if args.no_load_optim else "optimizer"
    message = (
        f"--load {root}: resuming from the checkpoint of rollout {model_id} (model, {optimizer}, data "
        f"state), at rollout {start}"
    )
    if data_id is not None and data_id > model_id:
        message += (
            f"; the data state saved after rollout {data_id} is newer than this checkpoint and is not "
            f"used (rollouts {start}..{data_id} run again)"
        )
    return {"resumed_after": model_id, "resume_message": message}


def resolve_resume(args: Any) -> dict[str, Any]:
    """`--load DIR` continues at the saved rollout id + 1 (slime's rule); slime-rollout unless
    --start-rollout-id says otherwise, slime-train from its model checkpoint (`resolve_train_resume`)."""
    if not args.load:
        return {"resumed_after": None}
    if trains_model(args):
        return resolve_train_resume(args)
    saved = saved_rollout_id(args.load)
    if saved is not None and not args.start_rollout_id:
        args.start_rollout_id = saved + 1
    return {"resumed_after": saved}


def check_save(args: Any) -> None:
    """--save writable, with room for one checkpoint (slime-train), before anything starts."""
    if not args.save:
        return
    need = checkpoint_bytes(model_dir(args), not args.no_save_optim) if trains_model(args) else 0
    try:
        check_save_dir(args.save, need)
    except SaveDirError as e:
        raise PreflightError(str(e)) from None


def check_external_engines(args: Any) -> None:
    """--rollout-external-engine-addrs: every engine answers /health before Ray starts."""
    if args.load_debug_rollout_data:
        return  # a replay starts no engine and reaches none
    try:
        check_reachable(external_urls(args.rollout_external_engine_addrs))
    except ExternalEngineError as e:
        raise PreflightError(str(e)) from e


def check_token_ids(args: Any) -> None:
    """Token-id flags (--rollout-stop-token-ids) within the served model's vocabulary: an id past it
    made every request fail at the engine, far from the flag."""
    directory = model_dir(args)
    config = Path(directory) / "config.json" if directory else None
    if config is None or not config.is_file():
        return
    try:
        vocab_size = json.loads(config.read_text(encoding="utf-8")).get("vocab_size")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return  # the model's own loader names a broken config.json
    if isinstance(vocab_size, int) and vocab_size > 0:
        problem = vocab_problem(args, vocab_size)
        if problem:
            raise PreflightError(f"{problem} of {config}")


def check_ray_address(args: Any) -> None:
    """--ray-address answers (a bounded TCP connect to its GCS port) before `ray.init`, which waits for an
    unreachable cluster forever, printing only its own warnings, with SIGTERM held."""
    address = args.ray_address
    if not address or address in ("auto", "local"):
        return
    from slime.ray.address import RayAddressError, probe_ray_address

    try:
        probe_ray_address(address)
    except RayAddressError as e:
        raise PreflightError(f"--ray-address {address}: {e}") from None


def check_opd_teacher(args: Any) -> None:
    """--use-opd: the teacher at --rm-url reads the student's ids as the same tokens."""
    if not (args.use_opd and args.rm_url):
        return
    student = model_dir(args)
    if not student:
        return
    from slime.rollout.opd_tokenizers import TokenizerMismatch, check_teacher_tokenizer

    try:
        check_teacher_tokenizer(args.rm_url, student)
    except TokenizerMismatch as e:
        raise PreflightError(str(e)) from None


def check_multimodal(args: Any) -> None:
    """--multimodal-keys needs a checkpoint that can see images (its config has a vision tower)."""
    from slime.utils.vision_model import is_vision_checkpoint

    path = args.hf_checkpoint
    if not args.multimodal_keys or not path or not (Path(path) / "config.json").is_file():
        return
    if not is_vision_checkpoint(path):
        raise PreflightError(
            f"--multimodal-keys: --hf-checkpoint {path} has no vision tower (its config.json has "
            "no vision_config), so the rows' images would reach no model; point it at a "
            "vision-language checkpoint (e.g. a Qwen2.5-VL one)"
        )


def plugins_to_load(args: Any) -> list[str]:
    """The plugin flags whose function preflight imports: each one set, except where it names slime's own default
    (the parser's: `--rollout-function-path`'s `generate_rollout`, `--eval-function-path` after it, the data
    source). Those are loaded by a test (tests/test_preflight_plugins.py); importing them here cost the command
    ~0.7 s of CPU before the engines' preload and Ray could start, and the manager imports them again anyway."""
    from slime.cli.parser import build_parser

    parser = build_parser()
    ours = {parser.get_default(dest) for dest in PLUGIN_FLAGS} - {None}
    return [dest for dest in PLUGIN_FLAGS if getattr(args, dest, None) and getattr(args, dest) not in ours]


def preflight(args: Any) -> dict[str, Any]:
    """Check every input; raise `PreflightError` at the first bad one. Returns what was resolved."""
    for dest in plugins_to_load(args):
        try:
            load_function(getattr(args, dest), _flag(dest))
        except Exception as e:  # noqa: BLE001 - PluginLoadError names the flag and the import failure
            raise PreflightError(str(e)) from e
    resolved = resolve_resume(args)
    check_save(args)
    check_multimodal(args)
    check_data(args)
    check_tools(args)
    check_interactions(args)
    check_agent_workspaces(args)
    check_debug_rollouts(args)
    check_external_engines(args)
    check_token_ids(args)
    check_opd_teacher(args)
    check_ray_address(args)
    return resolved
