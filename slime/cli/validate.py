"""`validate_args`: every bad value refused before anything starts, with the flag that carries it
(`ArgError`); plugin paths (`--rm-type`, the agent's flags, a custom generate function with
`--partial-rollout`) are checked here too."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

from slime.rollout.data_source import parse_path_slice

logger = logging.getLogger(__name__)


class ArgError(ValueError):
    """A flag has a bad value; the message names the flag."""


def _check_rm_type(args: argparse.Namespace) -> None:
    """Reject an unknown --rm-type (also an eval dataset's rm_type) at start-up, before any engine starts."""
    eval_types = [(d.name, d.rm_type) for d in args.eval_datasets if getattr(d, "rm_type", None)]
    if args.rm_type is None and not eval_types:
        return
    try:
        from slime.rollout import rm_hub
    except ModuleNotFoundError as e:  # until slime.rollout.rm_hub lands; then this branch is dead
        if e.name not in ("slime.rollout.rm_hub",):
            raise
        return
    check = getattr(rm_hub, "check_rm_type", None)
    if check is None:  # the package is being created
        return
    import inspect

    takes_args = "args" in inspect.signature(check).parameters  # remote_rm also needs --rm-url
    eval_flag = "--eval-config" if args.eval_config else "--eval-prompt-data"
    for where, rm_type in ([("", args.rm_type)] if args.rm_type else []) + eval_types:
        try:
            check(rm_type, args=args) if takes_args else check(rm_type)
        except (ValueError, KeyError) as e:
            msg = str(e) if str(e).startswith("--rm-type") else f"--rm-type: {e}"
            raise ArgError(f"{eval_flag}: dataset {where!r}: {msg}" if where else msg) from None


def data_file_problem(path: Path) -> str | None:
    """Why `path` cannot be a prompt file (None: it can): missing, or not a regular file (a FIFO, a
    device, a directory: the prompts are indexed by byte offset and read again, which a pipe cannot be)."""
    if path.is_file():
        return None
    if not path.exists():
        return "file not found"
    import stat

    mode = path.stat().st_mode
    kind = (
        "a directory"
        if stat.S_ISDIR(mode)
        else "a FIFO (named pipe)"
        if stat.S_ISFIFO(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "not a regular file"
    )
    return f"{kind}, not a regular file (prompts are indexed by byte offset and read again; write them to a file first)"


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def validate_args(args: argparse.Namespace) -> None:
    def need(cond: bool, flag: str, msg: str) -> None:
        if not cond:
            raise ArgError(f"{flag}: {msg}")

    for flag in (
        "rollout_batch_size",
        "n_samples_per_prompt",
        "rollout_max_response_len",
        "sglang_server_concurrency",
        "n_samples_per_eval_prompt",
        "rollout_num_engines",
    ):
        need(getattr(args, flag) >= 1, _flag(flag), f"must be >= 1, got {getattr(args, flag)}")
    need(args.num_rollout >= 0, "--num-rollout", "must be >= 0")
    need(args.start_rollout_id >= 0, "--start-rollout-id", "must be >= 0")
    need(
        args.over_sampling_batch_size >= args.rollout_batch_size,
        "--over-sampling-batch-size",
        "must be >= --rollout-batch-size",
    )
    need(0 < args.rollout_top_p <= 1, "--rollout-top-p", f"must be in (0, 1], got {args.rollout_top_p}")
    need(args.rollout_temperature >= 0, "--rollout-temperature", "must be >= 0")
    need(args.request_timeout > 0, "--request-timeout", "must be > 0")
    need(args.abort_timeout >= 0, "--abort-timeout", f"must be >= 0 seconds, got {args.abort_timeout}")
    if args.max_staleness is not None:
        need(args.max_staleness >= 0, "--max-staleness", f"must be >= 0 weight versions, got {args.max_staleness}")
    if args.mask_offpolicy_in_partial_rollout and not args.partial_rollout:
        logger.warning("--mask-offpolicy-in-partial-rollout has no effect without --partial-rollout")
    if args.num_steps_per_rollout is not None:
        need(args.num_steps_per_rollout >= 1, "--num-steps-per-rollout", "must be >= 1")
    if args.num_epoch is not None:
        need(args.num_epoch >= 1, "--num-epoch", "must be >= 1")
        need(
            args.rollout_global_dataset,
            "--num-epoch",
            "needs the global dataset (drop --disable-rollout-global-dataset, or set --num-rollout)",
        )
    if args.rollout_max_context_len is not None:
        need(args.rollout_max_context_len > 1, "--rollout-max-context-len", "must be > 1")
        need(
            args.rollout_max_prompt_len <= args.rollout_max_context_len - 1,
            "--rollout-max-prompt-len",
            f"must be < --rollout-max-context-len ({args.rollout_max_context_len}) so one token can be generated",
        )
    need(
        (args.sglang_router_ip is None) == (args.sglang_router_port is None),
        "--sglang-router-ip/--sglang-router-port",
        "give both or neither",
    )
    if args.eval_interval is not None:
        need(args.eval_interval >= 1, "--eval-interval", "must be >= 1")
        need(bool(args.eval_datasets), "--eval-interval", "needs --eval-prompt-data or --eval-config")
    if args.save_interval is not None:
        need(args.save is not None, "--save-interval", "needs --save")
    need(not (args.kl_coef != 0 and args.kl_loss_coef != 0), "--kl-coef/--kl-loss-coef", "set only one of them")
    if args.advantage_estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        need(
            args.normalize_advantages,
            "--advantage-estimator",
            f"{args.advantage_estimator} needs --normalize-advantages (as in slime)",
        )
    if args.use_dynamic_batch_size:
        need(args.max_tokens_per_gpu is not None, "--use-dynamic-batch-size", "needs --max-tokens-per-gpu")
    if args.balance_by_flops:
        need(args.use_dynamic_batch_size, "--balance-by-flops", "needs --use-dynamic-batch-size")
    need(
        args.optimizer == "adam",
        "--optimizer",
        f"{args.optimizer}: the reference trainer runs AdamW (Megatron's "
        "adam with --weight-decay); it has no other optimizer",
    )
    need(
        not (args.only_train_params_name_list and args.freeze_params_name_list),
        "--only-train-params-name-list/--freeze-params-name-list",
        "give only one of them",
    )
    for flag, patterns in (
        ("--only-train-params-name-list", args.only_train_params_name_list),
        ("--freeze-params-name-list", args.freeze_params_name_list),
    ):
        for pattern in patterns or []:
            try:
                re.compile(pattern)
            except re.error as e:
                need(False, flag, f"{pattern!r} is not a regular expression: {e}")
    if args.use_opd:
        need(args.opd_type is not None, "--opd-type", "required with --use-opd (sglang or megatron)")
    else:
        need(args.opd_teacher_load is None, "--opd-teacher-load", "is set but --use-opd is not")
    if args.save_debug_train_data is not None:
        need(
            args.save_debug_train_data != args.save_debug_rollout_data,
            "--save-debug-train-data",
            "must differ from --save-debug-rollout-data",
        )
    if not isinstance(args.apply_chat_template_kwargs, dict):
        raise ArgError(f"--apply-chat-template-kwargs: must be a JSON object, got {args.apply_chat_template_kwargs!r}")
    if args.multimodal_keys is not None and not isinstance(args.multimodal_keys, dict):
        raise ArgError(
            f'--multimodal-keys: must be a JSON object like \'{{"image": "images"}}\', got {args.multimodal_keys!r}'
        )
    for path in (args.hf_checkpoint,):
        if path is not None:
            need(Path(path).is_dir(), "--hf-checkpoint", f"{path!r} is not a directory (a local HF model dir)")
    if args.prompt_data is not None and not args.load_debug_rollout_data:
        problem = data_file_problem(Path(parse_path_slice(args.prompt_data)[0]))
        need(problem is None, "--prompt-data", f"{problem}: {args.prompt_data}")
    eval_flag = "--eval-config" if args.eval_config else "--eval-prompt-data"
    for d in args.eval_datasets:
        problem = data_file_problem(Path(d.file_path))
        need(problem is None, eval_flag, f"{d.name}: {problem}: {d.file_path}")
    for flag in ("save_debug_rollout_data", "load_debug_rollout_data", "save_debug_train_data"):
        v = getattr(args, flag)
        if v is not None and args.num_rollout > 1 and "{rollout_id}" not in v:
            raise ArgError(f"{_flag(flag)}: needs a {{rollout_id}} placeholder when --num-rollout > 1")
    if args.rollout_backend == "sglang" and not args.load_debug_rollout_data:
        need(args.hf_checkpoint is not None, "--hf-checkpoint", "required with --rollout-backend sglang")
        need((args.rollout_num_gpus or 0) >= 1, "--rollout-num-gpus", "required with --rollout-backend sglang")
    _check_rm_type(args)
    _check_partial_rollout(args)
    _check_agent(args)


def _check_agent(args: argparse.Namespace) -> None:
    """The agent rollout's flags (`slime.agent.flags.check_agent_args`), refused at start."""
    from slime.agent.flags import check_agent_args

    try:
        check_agent_args(args)
    except ValueError as e:
        raise ArgError(str(e)) from None


def _check_partial_rollout(args: argparse.Namespace) -> None:
    """--partial-rollout with a custom generate function that cannot continue a sample: refused at start."""
    if not (args.partial_rollout and args.custom_generate_function_path):
        return
    from slime.rollout.flags import RolloutConfig
    from slime.rollout.partial_rollout import check_generate_function

    try:
        check_generate_function(RolloutConfig.from_args(args))
    except (ValueError, ImportError, AttributeError) as e:
        msg = str(e)
        raise ArgError(msg if msg.startswith("--") else f"--custom-generate-function-path: {msg}") from None
