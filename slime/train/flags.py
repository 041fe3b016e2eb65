"""Flags of the reference trainer that slime does not have (slime sizes its trainer in GPUs).

`add_train_arguments(parser)` is meant for `slime.cli.args.build_parser`; until it is there,
`slime-train` adds them itself (`split_train_argv`).
"""

from __future__ import annotations

import argparse
from typing import Sequence


def add_train_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = parser.add_argument_group("reference trainer (slime-train)")
    g.add_argument("--actor-num-workers", type=int, default=1,
                   help="trainer processes (data-parallel ranks, DDP over gloo), one CPU bundle each")
    g.add_argument("--actor-num-cpus-per-worker", type=float, default=1.0,
                   help="CPUs of each trainer worker's placement-group bundle")
    g.add_argument("--train-threads", type=int, default=None,
                   help="torch threads per trainer worker (default: the bundle's CPUs, at least 1)")
    g.add_argument("--weight-sync", choices=["auto", "tensor", "distributed", "disk"], default="auto",
                   help="how weights reach the engines: auto = tensor when --colocate, else distributed")
    return parser


def split_train_argv(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """(the trainer flags, every other argument) when the main parser does not define them."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_train_arguments(parser)
    return parser.parse_known_args(list(argv))
