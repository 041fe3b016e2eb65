"""The range of every numeric flag that has one, declared once, and the check that refuses a value
outside it with the flag's name before anything starts (`check_ranges`, called by `validate_args`).

Why a table: a value that cannot work (`--engine-max-batch-size 0`, `--rollout-top-k -5`, `--eps-clip
-0.2`) was accepted and failed far from its cause (a rollout that never progressed, a 400 on every
request, a loss of the wrong sign). Every float flag must also be finite (`--kl-loss-coef nan` trained
NaN weights and pushed them). One entry per flag, keyed by its `dest`: here for the core parser's
flags, on the field for the flags of a package's typed config (`slime.utils.flag_config`). `vocab_problem` is the one range that needs the model (preflight asks it).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from slime.utils.flag_config import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, POSITIVE, Range, numbers, value_problem  # noqa: F401 (re-exports)


def _config_ranges() -> dict[str, Range]:
    """The ranges declared on the packages' flag configs (`flag(..., range=...)`)."""
    from slime.cli.parser import flag_configs

    return {dest: rng for config in flag_configs() for dest, rng in config.ranges().items()}


# dest -> its range; a flag left unset (None) is not checked. Flags checked elsewhere with a message of
# their own (validate.py's --rollout-batch-size, --rollout-top-p, ...) are not repeated here.
RANGES: dict[str, Range] = {
    # engines
    "engine_max_batch_size": AT_LEAST_ONE,
    "engine_threads": AT_LEAST_ONE,
    "engine_startup_timeout": POSITIVE,
    "rollout_num_cpus_per_engine": POSITIVE,
    "rollout_num_gpus_per_engine": AT_LEAST_ONE,
    # router and requests
    "router_health_check_interval": AT_LEAST_ONE,
    # trainer
    "save_interval": AT_LEAST_ONE,
    "micro_batch_size": AT_LEAST_ONE,
    "lr": NON_NEGATIVE,
    "clip_grad": NON_NEGATIVE,
    "eps_clip": POSITIVE,
    "eps_clip_high": POSITIVE,
    "update_weight_buffer_size": AT_LEAST_ONE,
    **_config_ranges(),
}

# token-id flags: each id must be a row of the model's embedding (checked by preflight, which has the model)
TOKEN_ID_FLAGS = ("rollout_stop_token_ids",)


def flag_name(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def float_dests(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag parsed as a float (upstream's included): each must be finite unless its default is not."""
    return [
        a.dest
        for a in parser._actions
        if a.type is float  # noqa: SLF001
        and not (isinstance(a.default, float) and not math.isfinite(a.default))
    ]


def range_problem(dest: str, value: Any, *, finite: bool = False) -> str | None:
    """Why `value` cannot be `dest`'s (None: it can): "--flag: must be ..., got v"."""
    return value_problem(flag_name(dest), value, RANGES.get(dest), finite=finite)


def check_ranges(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> str | None:
    """The first flag value outside its range (or a non-finite float), as an error line; None if all hold."""
    values = vars(args)
    finite = set(float_dests(parser)) if parser is not None else set()
    for dest in [*RANGES, *sorted(finite - set(RANGES))]:
        problem = range_problem(dest, values.get(dest), finite=dest in finite)
        if problem:
            return problem
    return None


def vocab_problem(args: argparse.Namespace, vocab_size: int) -> str | None:
    """A token-id flag naming an id the model has no embedding row for."""
    for dest in TOKEN_ID_FLAGS:
        for v in numbers(vars(args).get(dest)):
            if not 0 <= v < vocab_size:
                return f"{flag_name(dest)}: token id {v} is outside the model's vocabulary (0..{vocab_size - 1})"
    return None
