"""Command-line flags, named as in slime so run scripts move between the two.

`parse_args` returns an argparse Namespace (what plugins written for slime expect) after
`validate_args` has checked it: every bad value is reported with the flag that carries it.
Flags of the form `--sglang-<name> VALUE` that slime itself does not define are passed
through to `sglang.launch_server --<name> VALUE`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Sequence

OUR_SGLANG_FLAGS = {"sglang_router_ip", "sglang_router_port", "sglang_server_concurrency"}


class ArgError(ValueError):
    """A flag has a bad value; the message names the flag."""


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="slime-rollout", description="slime rollout service",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model and engines")
    g.add_argument("--hf-checkpoint", default=None,
                   help="local HF model dir; default: SmolLM2-135M-Instruct converted into $SLIME_CACHE")
    g.add_argument("--rollout-backend", choices=["auto", "hf", "sglang"], default="auto",
                   help="hf = embedded CPU engine; sglang = SGLang servers; auto = sglang when CUDA is present")
    g.add_argument("--rollout-num-engines", type=int, default=None, help="engines (CPU backend); default 1")
    g.add_argument("--rollout-num-gpus", type=int, default=None)
    g.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    g.add_argument("--num-gpus-per-node", type=int, default=8)
    g.add_argument("--rollout-num-cpus-per-engine", type=float, default=1.0,
                   help="CPU share of each embedded engine's placement-group bundle (fractions allowed)")
    g.add_argument("--engine-threads", type=int, default=None, help="torch threads per embedded engine")
    g.add_argument("--engine-host", default="127.0.0.1", help="address engines bind; 'auto' = the node's IP")
    g.add_argument("--engine-startup-timeout", type=float, default=300.0)
    g.add_argument("--engine-max-batch-size", type=int, default=32)
    g.add_argument("--offload", action="store_true", help="start engines able to release memory (memory saver)")
    g.add_argument("--sglang-mem-fraction-static", type=float, default=None)

    g = p.add_argument_group("router")
    g.add_argument("--sglang-router-ip", default=None, help="use an existing router instead of starting one")
    g.add_argument("--sglang-router-port", type=int, default=None)
    g.add_argument("--router-policy", default="round_robin",
                   choices=["round_robin", "cache_aware", "power_of_two", "random", "consistent_hashing"])
    g.add_argument("--router-health-check-interval", type=int, default=1, help="seconds")
    g.add_argument("--router-prometheus-port", type=int, default=None, help="default: a free port")

    g = p.add_argument_group("data")
    g.add_argument("--prompt-data", default=None, help="JSONL or parquet prompts")
    g.add_argument("--input-key", default="input", help="dotted paths allowed, e.g. extra_info.question")
    g.add_argument("--label-key", default=None)
    g.add_argument("--metadata-key", default="metadata")
    g.add_argument("--tool-key", default=None, help="per-sample tools / tools_kwargs")
    g.add_argument("--apply-chat-template", action="store_true")
    g.add_argument("--rollout-shuffle", action="store_true")
    g.add_argument("--rollout-seed", type=int, default=42)
    g.add_argument("--rollout-max-prompt-len", type=int, default=None)
    g.add_argument("--over-long-prompt", choices=["filter", "error"], default="filter",
                   help="prompts longer than --rollout-max-context-len (or --rollout-max-prompt-len)")

    g = p.add_argument_group("rollout")
    g.add_argument("--num-rollout", type=int, default=1)
    g.add_argument("--start-rollout-id", type=int, default=0)
    g.add_argument("--rollout-batch-size", type=int, default=4, help="prompts (groups) per rollout")
    g.add_argument("--n-samples-per-prompt", type=int, default=4)
    g.add_argument("--over-sampling-batch-size", type=int, default=None)
    g.add_argument("--global-batch-size", type=int, default=None)
    g.add_argument("--rollout-max-response-len", type=int, default=64)
    g.add_argument("--rollout-max-context-len", type=int, default=None)
    g.add_argument("--rollout-temperature", type=float, default=1.0)
    g.add_argument("--rollout-top-p", type=float, default=1.0)
    g.add_argument("--rollout-top-k", type=int, default=-1)
    g.add_argument("--rollout-stop", nargs="*", default=None)
    g.add_argument("--rollout-stop-token-ids", type=int, nargs="*", default=None)
    g.add_argument("--rollout-skip-special-tokens", action="store_true")
    g.add_argument("--sglang-server-concurrency", type=int, default=512, help="in-flight requests per process")
    g.add_argument("--request-timeout", type=float, default=300.0, help="deadline of one engine request, seconds")
    g.add_argument("--request-max-retries", type=int, default=8,
                   help="retries of one request on connection errors, 429 and 5xx (with back-off)")
    g.add_argument("--dynamic-sampling-filter-path", default=None)
    g.add_argument("--partial-rollout", action="store_true", help="aborted partial samples go back to the buffer")
    g.add_argument("--rollout-function-path", default="slime.rollout.sglang_rollout.generate_rollout")
    g.add_argument("--eval-function-path", default=None, help="default: --rollout-function-path")
    g.add_argument("--custom-generate-function-path", default=None)

    g = p.add_argument_group("reward")
    g.add_argument("--rm-type", default=None, help="math | boxed | gsm8k | f1 | exact | random")
    g.add_argument("--custom-rm-path", default=None)
    g.add_argument("--group-rm", action="store_true")
    g.add_argument("--reward-key", default=None, help="key of dict rewards used for training")
    g.add_argument("--advantage-estimator", default="grpo", choices=["grpo", "gspo", "reinforce_plus_plus_baseline",
                                                                     "reinforce_plus_plus", "ppo"])
    g.add_argument("--disable-rewards-normalization", action="store_true")
    g.add_argument("--disable-grpo-std-normalization", action="store_true")

    g = p.add_argument_group("eval")
    g.add_argument("--eval-prompt-data", nargs="*", default=None, metavar="NAME PATH")
    g.add_argument("--eval-interval", type=int, default=None)
    g.add_argument("--n-samples-per-eval-prompt", type=int, default=1)
    g.add_argument("--eval-max-response-len", type=int, default=None)
    g.add_argument("--eval-temperature", type=float, default=None)
    g.add_argument("--eval-top-p", type=float, default=None)
    g.add_argument("--eval-input-key", default=None)
    g.add_argument("--eval-label-key", default=None)
    g.add_argument("--skip-eval-before-train", action="store_true")

    g = p.add_argument_group("debug")
    g.add_argument("--debug-rollout-only", action="store_true")
    g.add_argument("--save-debug-rollout-data", default=None, help="path with {rollout_id}")
    g.add_argument("--load-debug-rollout-data", default=None, help="path with {rollout_id}; starts no engines")
    g.add_argument("--save-debug-train-data", default=None, help="path with {rollout_id}")
    g.add_argument("--save", default=None, help="directory for the data source state (incl. buffer)")
    g.add_argument("--load", default=None, help="directory to resume the data source state from")
    g.add_argument("--ray-address", default=None, help="join this Ray cluster; default: start a local one")
    g.add_argument("--log-dir", default=None, help="engine and router logs; default: a temp dir")

    _optional_groups(p)
    return p


def _optional_groups(p: argparse.ArgumentParser) -> None:
    """Flags owned by the tool and observability packages."""
    from slime.observability.flags import add_observability_arguments
    from slime.tools.flags import add_tool_arguments

    add_tool_arguments(p)
    add_observability_arguments(p)


def _sglang_passthrough(unknown: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(unknown):
        tok = unknown[i]
        if not tok.startswith("--sglang-"):
            parser.error(f"unrecognized argument: {tok}")
        name, _, value = tok[len("--sglang-"):].partition("=")
        if not value:
            if i + 1 < len(unknown) and not unknown[i + 1].startswith("--"):
                value = unknown[i + 1]
                i += 1
            else:
                value = True
        out[name.replace("-", "_")] = value
        i += 1
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    args.sglang_extra_args = _sglang_passthrough(unknown, parser)
    finalize_args(args)
    return args


def finalize_args(args: argparse.Namespace) -> argparse.Namespace:
    """Fill derived defaults, then validate."""
    if args.rollout_backend == "auto":
        args.rollout_backend = "sglang" if _cuda_available() else "hf"
    if args.rollout_num_engines is None:
        if args.rollout_backend == "sglang" and args.rollout_num_gpus:
            args.rollout_num_engines = max(1, args.rollout_num_gpus // max(1, args.rollout_num_gpus_per_engine))
        else:
            args.rollout_num_engines = 1
    if args.eval_function_path is None:
        args.eval_function_path = args.rollout_function_path
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if args.global_batch_size is None:
        args.global_batch_size = args.rollout_batch_size * args.n_samples_per_prompt
    if args.eval_max_response_len is None:
        args.eval_max_response_len = args.rollout_max_response_len
    args.eval_datasets = _eval_pairs(args.eval_prompt_data)
    validate_args(args)
    return args


def _eval_pairs(values: list[str] | None) -> list[tuple[str, str]]:
    if not values:
        return []
    if len(values) % 2:
        raise ArgError(f"--eval-prompt-data takes NAME PATH pairs, got {len(values)} value(s): {values}")
    return [(values[i], values[i + 1]) for i in range(0, len(values), 2)]


def validate_args(args: argparse.Namespace) -> None:
    def need(cond: bool, flag: str, msg: str) -> None:
        if not cond:
            raise ArgError(f"{flag}: {msg}")

    for flag in ("rollout_batch_size", "n_samples_per_prompt", "rollout_max_response_len",
                 "sglang_server_concurrency", "n_samples_per_eval_prompt", "rollout_num_engines"):
        need(getattr(args, flag) >= 1, "--" + flag.replace("_", "-"), f"must be >= 1, got {getattr(args, flag)}")
    need(args.num_rollout >= 0, "--num-rollout", "must be >= 0")
    need(args.over_sampling_batch_size >= args.rollout_batch_size, "--over-sampling-batch-size",
         "must be >= --rollout-batch-size")
    need(0 < args.rollout_top_p <= 1, "--rollout-top-p", f"must be in (0, 1], got {args.rollout_top_p}")
    need(args.rollout_temperature >= 0, "--rollout-temperature", "must be >= 0")
    need(args.request_timeout > 0, "--request-timeout", "must be > 0")
    if args.rollout_max_context_len is not None:
        need(args.rollout_max_context_len > 1, "--rollout-max-context-len", "must be > 1")
    need((args.sglang_router_ip is None) == (args.sglang_router_port is None), "--sglang-router-ip/--sglang-router-port",
         "give both or neither")
    if args.eval_interval is not None:
        need(args.eval_interval >= 1, "--eval-interval", "must be >= 1")
    for path in (args.hf_checkpoint,):
        if path is not None:
            need(Path(path).is_dir(), "--hf-checkpoint", f"{path!r} is not a directory (a local HF model dir)")
    if args.prompt_data is not None and not args.load_debug_rollout_data:
        need(Path(args.prompt_data).is_file(), "--prompt-data", f"file not found: {args.prompt_data}")
    for name, path in args.eval_datasets:
        need(Path(path).is_file(), "--eval-prompt-data", f"{name}: file not found: {path}")
    for flag in ("save_debug_rollout_data", "load_debug_rollout_data", "save_debug_train_data"):
        v = getattr(args, flag)
        if v is not None and args.num_rollout > 1 and "{rollout_id}" not in v:
            raise ArgError(f"--{flag.replace('_', '-')}: needs a {{rollout_id}} placeholder when --num-rollout > 1")
    if args.rollout_backend == "sglang" and not args.load_debug_rollout_data:
        need(args.hf_checkpoint is not None, "--hf-checkpoint", "required with --rollout-backend sglang")
        need((args.rollout_num_gpus or 0) >= 1, "--rollout-num-gpus", "required with --rollout-backend sglang")


def default_cache_dir() -> Path:
    return Path(os.environ.get("SLIME_CACHE") or Path.home() / ".cache" / "slime")
