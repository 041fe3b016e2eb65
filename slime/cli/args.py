"""Command-line flags, named as in slime so run scripts move between the two.

`parse_args` returns an argparse Namespace (what plugins written for slime expect) after
`finalize_args` derived what upstream derives and `validate_args` checked it: every bad value is
reported with the flag that carries it. Besides the flags defined here (and by slime.tools /
slime.observability), every flag of upstream slime and Megatron-LM is accepted and stored with
upstream's default (`upstream_flags.py`), so a slime run script's whole argument list parses; a flag
nobody defines is an error naming it. Flags of the form `--sglang-<name> VALUE` that are not defined
are passed through to `sglang.launch_server --<name> VALUE` (and stored as `args.sglang_<name>`).
The flag groups are `parser.py`'s, the derived values `finalize.py`'s, the checks `validate.py`'s; every
name is importable from here as before.
"""

from __future__ import annotations

import argparse
import difflib
import logging
from typing import Any, Sequence

# every name is importable from here as before the split (noqa: F401 - re-exports)
from slime.cli.finalize import _count_rows, _cuda_available, _fill_defaults, _finalize_upstream  # noqa: F401
from slime.cli.finalize import apply_custom_config, finalize_args  # noqa: F401 (apply_custom_config: a re-export)
from slime.cli.flag_ranges import check_ranges
from slime.cli.honest_flags import unused_flags_line
from slime.cli.parser import SlimeArgumentParser, _optional_groups, _router_groups, build_parser  # noqa: F401
from slime.cli.upstream_flags import apply_aliases
from slime.cli.validate import ArgError, _check_agent, _check_partial_rollout, _check_rm_type, _flag  # noqa: F401
from slime.cli.validate import validate_args  # noqa: F401

logger = logging.getLogger(__name__)

OUR_SGLANG_FLAGS = {"sglang_router_ip", "sglang_router_port", "sglang_server_concurrency"}
# SGLang's defaults of the server options slime's own rollout reads from args (slime defines every SGLang
# server option as --sglang-<name>; here they pass through, so one not given would be missing)
SGLANG_DEFAULTS_PLUGINS_READ = {"dp_size": 1}


def _coerce(value: Any) -> Any:
    """A passthrough value as sglang's parser would most likely type it (for args.sglang_<name>)."""
    if isinstance(value, list):
        return [_coerce(v) for v in value]
    if not isinstance(value, str):
        return value
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    return value


def _sglang_passthrough(unknown: Sequence[str], parser: argparse.ArgumentParser) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(unknown):
        tok = unknown[i]
        if not tok.startswith("--sglang-"):
            parser.error(_unknown_message(tok, parser))
        name, eq, value = tok[len("--sglang-") :].partition("=")
        if not eq:
            values = []
            while i + 1 < len(unknown) and not unknown[i + 1].startswith("--"):
                values.append(unknown[i + 1])
                i += 1
            # a bare flag is a switch; several values are an nargs list (e.g. --sglang-cuda-graph-bs 1 2 4)
            value = True if not values else values[0] if len(values) == 1 else values
        out[name.replace("-", "_")] = value
        i += 1
    return out


def _unknown_message(token: str, parser: argparse.ArgumentParser) -> str:
    if not token.startswith("-"):
        return f"unrecognized argument: {token!r} (a value with no flag before it)"
    flag = token.partition("=")[0]
    close = difflib.get_close_matches(flag, list(parser._option_string_actions), n=3)  # noqa: SLF001
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return (
        f"unrecognized argument: {flag} (not a flag of slime, Megatron-LM or this service{hint}; "
        f"SGLang server flags are passed as --sglang-<name>)"
    )


def parse_args(argv: Sequence[str] | None = None, prog: str = "slime-rollout") -> argparse.Namespace:
    parser = build_parser(prog)
    args, unknown = parser.parse_known_args(argv)
    args.sglang_extra_args = _sglang_passthrough(unknown, parser)
    for name, value in args.sglang_extra_args.items():
        setattr(args, f"sglang_{name}", _coerce(value))  # where slime plugins look for sglang settings
    for name, value in SGLANG_DEFAULTS_PLUGINS_READ.items():
        if not hasattr(args, f"sglang_{name}"):
            setattr(args, f"sglang_{name}", value)
    line = unused_flags_line(parser, args)  # what the user set, before finalize derives anything
    apply_aliases(args, parser.aliases)
    problem = check_ranges(args, parser)  # before anything is derived from a value that cannot work
    if problem:
        raise ArgError(problem)
    finalize_args(args)
    if line:
        logger.warning("%s: %s", prog, line)
    return args
