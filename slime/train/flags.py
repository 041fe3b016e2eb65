"""Flags of the reference trainer that slime does not have (slime sizes its trainer in GPUs).

`add_train_arguments(parser)` is meant for `slime.cli.args.build_parser`; until it is there,
`slime-train` adds them itself (`split_train_argv`).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Sequence

from slime.utils.flag_config import AT_LEAST_ONE, POSITIVE, FlagConfig, flag


@dataclass(frozen=True)
class TrainConfig(FlagConfig):
    GROUP = "reference trainer (slime-train)"

    actor_num_workers: int = flag(
        1, type=int, help="trainer processes (data-parallel ranks, DDP over gloo), one CPU bundle each"
    )
    actor_num_cpus_per_worker: float = flag(
        1.0, type=float, range=POSITIVE, help="CPUs of each trainer worker's placement-group bundle"
    )
    train_threads: int | None = flag(
        None,
        type=int,
        range=AT_LEAST_ONE,
        help="torch threads per trainer worker (default: the bundle's CPUs, at least 1)",
    )
    weight_sync: str = flag(
        "auto",
        choices=["auto", "tensor", "distributed", "disk"],
        help="how weights reach the engines: auto = tensor when --colocate, else distributed",
    )
    weight_sync_transport: str = flag(
        "auto",
        choices=["auto", "broadcast"],
        help="bytes of the distributed path: auto = a shared-memory ring when every engine is on the "
        "trainer's host (the group carries only handshakes), else gloo broadcasts; broadcast = always "
        "broadcast over the group",
    )
    load_without_manifest: bool = flag(
        False,
        action="store_true",
        help="resume from a --load checkpoint that has no manifest.json: its files are then checked for "
        "their format only, so a corrupted byte in the weights goes unnoticed",
    )
    async_train: bool = flag(
        False,
        action="store_true",
        options=("--async",),
        help="slime's train_async.py: generate rollout k+1 while rollout k trains (one weight version "
        "off-policy); not with --colocate / --offload-rollout",
    )


def add_train_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    return TrainConfig.add_arguments(parser)


def update_weights_interval(args: argparse.Namespace) -> int:
    """--update-weights-interval (slime's default 1); ValueError naming the flag when below 1."""
    interval = args.update_weights_interval
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise ValueError(
            f"--update-weights-interval must be an integer >= 1 (push weights every N rollouts), got {interval!r}"
        )
    return interval


def check_train_arguments(args: argparse.Namespace) -> None:
    """Combinations the trainer cannot run; the message names the flags."""
    from slime.train.loss import check_opd_args

    check_opd_args(args)  # LossConfigError (a ValueError) naming --opd-type
    if args.rollout_external_engine_addrs:
        raise ValueError(
            "--rollout-external-engine-addrs with slime-train: the trainer pushes weights to the engines "
            "it starts (and restarts); engines started elsewhere are for slime-rollout, whose engines' "
            "owner updates them"
        )
    interval = update_weights_interval(args)  # ValueError naming --update-weights-interval
    offloaded = "--colocate" if args.colocate else "--offload-rollout" if args.offload_rollout else None
    if interval > 1 and offloaded:
        raise ValueError(
            f"--update-weights-interval {interval} with {offloaded}: the engines give their weights' "
            f"memory back while the trainer runs, so weights must be pushed after every rollout; "
            f"drop {offloaded} or use --update-weights-interval 1"
        )
    if args.async_train and (args.colocate or args.offload_rollout):
        offloaded = "--colocate" if args.colocate else "--offload-rollout"
        raise ValueError(
            f"--async overlaps generation with training, so the engines cannot be offloaded while the "
            f"trainer runs: drop {offloaded} or --async (slime's train_async.py asserts the same)"
        )


def split_train_argv(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """(the trainer flags, every other argument) when the main parser does not define them."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_train_arguments(parser)
    return parser.parse_known_args(list(argv))
