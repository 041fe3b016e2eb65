"""The rollout's flags (data, sampling, requests, partial rollout, reward, eval) as one frozen config.

Why: these flags are read across `slime.rollout` (the controller, the data source, the default rollout,
the reward step) and by slime's plugins, which get `args`; their defaults are written once, here. The
parser's "data", "rollout", "reward" and "eval" groups are generated from the fields
(`RolloutConfig.add_arguments`), and a namespace built by hand is completed from the same defaults
(`slime.utils.plugin_args.completed`). Our own rollout code reads no flag off `args` (issue #33): it gets
a `RolloutRunConfig` (these fields and the few flags it reads that are declared elsewhere), read once by the
controller or, for code a plugin's `args` reaches, by the runtime (`RolloutRuntime.config`), or the smaller
`PromptConfig` for reading prompt rows. Only slime's plugin contract keeps `args`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slime.rollout.defaults import REQUEST_MAX_RETRIES, ROLLOUT_BATCH_SIZE
from slime.utils.flag_config import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, FlagConfig, ParsedConfig, Range, flag

DATA, REWARD, EVAL = "data", "reward", "eval"


@dataclass(frozen=True)
class RolloutConfig(FlagConfig):
    GROUP = "rollout"

    prompt_data: str | None = flag(None, help="JSONL or parquet prompts", group=DATA)
    input_key: str = flag("input", help="dotted paths allowed, e.g. extra_info.question", group=DATA)
    label_key: str | None = flag(None, group=DATA)
    metadata_key: str = flag("metadata", group=DATA)
    tool_key: str = flag(
        "tools",
        help="per-sample tools: a list of tool schemas (given to the chat template, "
        "metadata['tools']) or verl's tools_kwargs mapping (metadata['tools_kwargs'])",
        group=DATA,
    )
    apply_chat_template: bool = flag(False, action="store_true", group=DATA)
    multimodal_keys: Any | None = flag(
        None,
        type=json.loads,
        help="slime's JSON {type: row key}, e.g. '{\"image\": \"images\"}': each row's "
        "images (paths, data URIs, base64; no URLs) go into its prompt where its "
        "text says `<image>` (else before the text), checked at preflight, and to "
        "a vision-language engine as image_data",
        group=DATA,
    )
    rollout_shuffle: bool = flag(False, action="store_true", group=DATA)
    rollout_seed: int = flag(42, type=int, group=DATA)
    rollout_max_prompt_len: int | None = flag(None, range=AT_LEAST_ONE, type=int, group=DATA)
    over_long_prompt: str = flag(
        "filter",
        choices=["filter", "error"],
        help="prompts longer than --rollout-max-context-len (or --rollout-max-prompt-len)",
        group=DATA,
    )
    num_rollout: int | None = flag(None, type=int, help="rollouts to run; default: from --num-epoch, else 1")
    start_rollout_id: int | None = flag(None, type=int, help="default 0")
    rollout_batch_size: int = flag(
        ROLLOUT_BATCH_SIZE, type=int, help="prompts (groups) per rollout (required by slime; 4 here)"
    )
    n_samples_per_prompt: int = flag(1, type=int)
    over_sampling_batch_size: int | None = flag(
        None,
        type=int,
        help="groups started per sampling step (>= --rollout-batch-size; "
        "default equal): the extra groups over-provision, the rollout "
        "stops once its target is met and aborts the rest",
    )
    global_batch_size: int | None = flag(None, range=AT_LEAST_ONE, type=int)
    rollout_max_response_len: int = flag(
        64, type=int, help="slime's default is None (up to the context length); the embedded engine needs a bound"
    )
    rollout_max_context_len: int | None = flag(None, type=int)
    rollout_temperature: float = flag(1.0, type=float)
    rollout_top_p: float = flag(1.0, type=float)
    rollout_top_k: int = flag(-1, range=Range(1, also=(-1,), text=">= 1, or -1 (no top-k)"), type=int)
    rollout_stop: list[str] | None = flag(None, nargs="+")
    rollout_stop_token_ids: list[int] | None = flag(None, type=int, nargs="+")
    rollout_skip_special_tokens: bool = flag(False, action="store_true")
    sglang_server_concurrency: int = flag(512, type=int, help="in-flight requests per process")
    request_timeout: float = flag(300.0, type=float, help="deadline of one engine request, seconds")
    request_max_retries: int = flag(
        REQUEST_MAX_RETRIES,
        range=NON_NEGATIVE,
        type=int,
        help="cap on the retries of one request (connection errors, timeouts, 429, 5xx); "
        "the budget is --request-retry-window seconds",
    )
    dynamic_sampling_filter_path: str | None = flag(None)
    partial_rollout: bool = flag(
        False,
        action="store_true",
        help="aborted samples keep their partial response and are continued by a later rollout",
    )
    mask_offpolicy_in_partial_rollout: bool = flag(
        False,
        action="store_true",
        help="with --partial-rollout: loss mask 0 on tokens sampled by "
        "another weight version than the one that finished the sample",
    )
    abort_timeout: float = flag(
        5.0,
        type=float,
        help="seconds a rollout waits for the engines' answers to its abort before cancelling "
        "the groups still running (returned to the buffer as they were handed out)",
    )
    max_staleness: int | None = flag(
        None,
        type=int,
        help="fully-async rollout: samples whose oldest segment is more than this many "
        "weight versions behind are dropped (continued with --partial-rollout); "
        "default: no bound",
    )
    rollout_function_path: str = flag("slime.rollout.sglang_rollout.generate_rollout")
    eval_function_path: str | None = flag(None, help="default: --rollout-function-path")
    custom_generate_function_path: str | None = flag(None)
    custom_generate_timeout: float = flag(
        3600.0,
        range=POSITIVE,
        type=float,
        help="seconds a custom generate function may take on one sample; one that "
        "does not return fails its sample (generate_timeout) and the rollout "
        "goes on",
    )
    rm_type: str | None = flag(
        None,
        help="a rule of slime.rollout.rm_hub (math, deepscaler, dapo, f1, gpqa, ifbench, "
        "remote_rm, random, boxed_<type>, ...)",
        group=REWARD,
    )
    custom_rm_path: str | None = flag(None, group=REWARD)
    group_rm: bool = flag(False, action="store_true", group=REWARD)
    reward_key: str | None = flag(None, help="key of dict rewards used for training", group=REWARD)
    reward_timeout: float = flag(
        1800.0,
        range=POSITIVE,
        type=float,
        help="seconds one reward call (a sample's, or a group's with --group-rm) may take; "
        "one that does not return fails its samples (reward_timeout) and the rollout "
        "goes on",
        group=REWARD,
    )
    eval_prompt_data: list[str] | None = flag(
        None,
        nargs="+",
        metavar="NAME PATH",
        help="NAME PATH pairs; PATH may end in a row slice, e.g. aime /data/aime.jsonl@[0:30]",
        group=EVAL,
    )
    eval_interval: int | None = flag(None, type=int, group=EVAL)
    n_samples_per_eval_prompt: int = flag(1, type=int, group=EVAL)
    eval_max_response_len: int | None = flag(None, range=AT_LEAST_ONE, type=int, group=EVAL)
    eval_temperature: float | None = flag(None, range=NON_NEGATIVE, type=float, group=EVAL)
    eval_top_p: float | None = flag(None, range=Range(0, 1, open_low=True, text="in (0, 1]"), type=float, group=EVAL)
    eval_input_key: str | None = flag(None, group=EVAL)
    eval_label_key: str | None = flag(None, group=EVAL)
    skip_eval_before_train: bool = flag(False, action="store_true", group=EVAL)


@dataclass(frozen=True)
class PromptConfig(ParsedConfig):
    """How a prompt row becomes a template `Sample` (`prompt_rows`, `prompt_index`): its keys, template, images,
    length limit, and whether the default generate reads it. Read off a namespace by the data source or
    preflight; an eval set's own keys replace fields (`dataclasses.replace`). No defaults: the parser's."""

    metadata_key: str
    tool_key: str | None
    apply_chat_template: bool
    apply_chat_template_kwargs: dict[str, Any] | None
    multimodal_keys: Any | None
    rollout_max_prompt_len: int | None
    rollout_max_context_len: int | None
    over_long_prompt: str
    rollout_function_path: str  # (with the next) the default generate reads text or messages only
    custom_generate_function_path: str | None
    interaction_config_path: str | None  # (the tools' flags) verl's interaction_kwargs of each row
    interaction_key: str
    hf_checkpoint: str | None  # the processor that counts a prompt's image tokens


@dataclass(frozen=True)
class RolloutRunConfig(ParsedConfig):
    """What `slime.rollout`'s own code reads (issue #33): the rollout's flags, and the few it reads that are
    declared elsewhere (where state is saved and loaded, slime's hook paths, the fleet's retry window, the router
    given; the checkpoint is the prompt reader's). Read once from the namespace: by the controller, or by the runtime a plugin's
    `args` bound (`RolloutRuntime.config`); slime's plugins keep getting `args`. No defaults: the parser's."""

    rollout: RolloutConfig
    prompt: PromptConfig  # how prompt rows are read (eval sets' too), with --hf-checkpoint
    load: str | None  # where the data source's state is restored from
    save: str | None  # where it is saved
    load_debug_rollout_data: str | None  # a replay: samples from the file, no engine
    save_debug_rollout_data: str | None
    save_debug_train_data: str | None
    data_source_path: str | None  # slime's: a class built as `cls(args)`
    custom_reward_post_process_path: str | None
    custom_convert_samples_to_train_data_path: str | None
    rollout_sample_filter_path: str | None  # slime's hook: `fn(args, groups)`
    rollout_all_samples_process_path: str | None  # slime's hook: `fn(args, groups, data_source)`
    eval_reward_key: str | None
    custom_rollout_log_function_path: str | None  # slime's: `fn(rollout_id, args, samples, metrics, seconds)`
    custom_eval_rollout_log_function_path: str | None  # slime's: `fn(rollout_id, args, data, metrics)`
    request_retry_window: float | None  # (the fleet's flag) the retry budget of one engine request
    sglang_router_ip: str | None  # a router given on the command line (a plugin run outside a controller)
    sglang_router_port: int | None

    @property
    def hf_checkpoint(self) -> str | None:
        """The tokenizer, processor and chat template: the prompt reader's (one flag, read once)."""
        return self.prompt.hf_checkpoint
