"""The reference trainer's flags as frozen, typed configs.

`TrainConfig`: the flags slime does not have (slime sizes its trainer in GPUs), declared here, the
parser's arguments generated from it (`slime.cli.parser.build_parser`). The others are flags slime and
Megatron-LM declare (the parser registers them from `upstream_flags.json` with upstream's defaults), read
once from the parsed namespace with no fallback (`ParsedConfig.from_args`): `LossConfig` (slime's loss,
advantage, TIS and OPD flags), `OptimizerConfig` (Megatron's optimizer, schedule and gradient clipping, and
slime's trainable-parameter patterns), `WorkerConfig` (what a trainer rank reads) and `LoopConfig` (what the
loop reads). Code in `slime.train` receives these; only slime's plugins (custom loss, advantage, TIS,
pg-loss reducer, rollout-data post-process) get the namespace, as slime gives them (`LossHooks`).
"""

from __future__ import annotations

from dataclasses import dataclass

from slime.utils.flag_config import AT_LEAST_ONE, POSITIVE, FlagConfig, ParsedConfig, flag


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


class LossConfigError(ValueError):
    """A flag combination the reference trainer cannot train; the message names the flag."""


@dataclass(frozen=True)
class LossConfig(ParsedConfig):
    """slime's flags of the policy loss and the advantages (`slime.train.loss`)."""

    advantage_estimator: str
    loss_type: str
    calculate_per_token_loss: bool
    normalize_advantages: bool
    gamma: float
    kl_coef: float  # KL-shaped reward (REINFORCE++)
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    use_unbiased_kl: bool
    eps_clip: float
    eps_clip_high: float | None
    eps_clip_c: float | None
    entropy_coef: float
    use_rollout_logprobs: bool
    use_tis: bool
    tis_clip: float
    tis_clip_low: float
    get_mismatch_metrics: bool
    use_opd: bool
    opd_type: str | None
    opd_kl_coef: float
    custom_loss_function_path: str | None
    custom_advantage_function_path: str | None
    custom_tis_function_path: str | None
    custom_pg_loss_reducer_function_path: str | None
    rollout_data_postprocess_path: str | None


@dataclass(frozen=True)
class OptimizerConfig(ParsedConfig):
    """Megatron's optimizer, schedule and clipping flags, and slime's choice of the parameters it updates."""

    lr: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    weight_decay: float
    lr_warmup_iters: int
    clip_grad: float  # 0 = no clipping
    only_train_params_name_list: list[str] | None
    freeze_params_name_list: list[str] | None


@dataclass(frozen=True)
class WorkerConfig(ParsedConfig):
    """What one trainer rank (`TrainWorker`) reads: its model, checkpoints, weight pushes, loss, optimizer."""

    seed: int
    hf_checkpoint: str | None
    ref_load: str | None
    load: str | None
    ckpt_step: int | None
    start_rollout_id: int | None
    no_load_optim: bool | None  # Megatron's default is None
    save: str | None
    no_save_optim: bool
    rollout_temperature: float
    engine_host: str
    update_weight_buffer_size: int
    train: TrainConfig
    loss: LossConfig
    optimizer: OptimizerConfig


@dataclass(frozen=True)
class LoopConfig(ParsedConfig):
    """What slime's training loop (`slime.train.loop`) reads, and the workers' config it hands on."""

    num_rollout: int | None  # set by finalize when --num-epoch gives it
    save: str | None
    save_interval: int | None
    load: str | None
    colocate: bool
    offload_rollout: bool | None  # set by finalize from --colocate
    update_weights_interval: int
    check_weight_update_equal: bool
    eval_interval: int | None
    eval_datasets: list | None
    skip_eval_before_train: bool
    rollout_external_engine_addrs: list[str] | None
    worker: WorkerConfig


def update_weights_interval(config: LoopConfig) -> int:
    """--update-weights-interval (slime's default 1); ValueError naming the flag when below 1."""
    interval = config.update_weights_interval
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
        raise ValueError(
            f"--update-weights-interval must be an integer >= 1 (push weights every N rollouts), got {interval!r}"
        )
    return interval


def check_opd_args(config: LossConfig) -> None:
    """`--use-opd` needs the teacher's log-probs from the rollout (`--opd-type sglang`)."""
    if config.use_opd and config.opd_type != "sglang":
        raise LossConfigError(
            f"--opd-type {config.opd_type}: the reference trainer takes the "
            f"teacher's log-probs from the rollout (--opd-type sglang, teacher at --rm-url); "
            f"it loads no Megatron teacher"
        )


def check_train_arguments(config: LoopConfig) -> None:
    """Combinations the trainer cannot run; the message names the flags."""
    check_opd_args(config.worker.loss)  # LossConfigError (a ValueError) naming --opd-type
    if config.rollout_external_engine_addrs:
        raise ValueError(
            "--rollout-external-engine-addrs with slime-train: the trainer pushes weights to the engines "
            "it starts (and restarts); engines started elsewhere are for slime-rollout, whose engines' "
            "owner updates them"
        )
    interval = update_weights_interval(config)  # ValueError naming --update-weights-interval
    offloaded = "--colocate" if config.colocate else "--offload-rollout" if config.offload_rollout else None
    if interval > 1 and offloaded:
        raise ValueError(
            f"--update-weights-interval {interval} with {offloaded}: the engines give their weights' "
            f"memory back while the trainer runs, so weights must be pushed after every rollout; "
            f"drop {offloaded} or use --update-weights-interval 1"
        )
    if config.worker.train.async_train and (config.colocate or config.offload_rollout):
        raise ValueError(
            f"--async overlaps generation with training, so the engines cannot be offloaded while the "
            f"trainer runs: drop {offloaded} or --async (slime's train_async.py asserts the same)"
        )
