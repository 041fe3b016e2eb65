"""`RolloutController`: a rollout id in, a training batch out (rollout function, then conversion).

It calls the rollout function over the data source and converts its samples. It owns the data
source, the plugins loaded from their `--*-path` flags, and the `RolloutRuntime` (engine client,
progress, tool services) the plugins share.
`generate(rollout_id)`: rollout function -> flatten groups -> optional debug save -> convert
(`convert_samples_to_train_data`, below) -> metrics and dumps -> batch, or one batch per
data-parallel rank. With `--load-debug-rollout-data` the samples come from the file and no engine
is touched. A rollout in which every sample failed raises `RolloutFailedError` (`failures.py`: the
failures by reason, with one example each). Counters in `status()` are the running rollout's, as in
its summary. A plain object: the RolloutManager actor holds it; no Ray here.

Conversion (slime's `_convert_samples_to_train_data`) gives plain Python values, one entry per
sample (per-rank tensors are made by `slime.train_batch.rank_batches`). Rewards stay as the reward
function returned them until `post_process_rewards` (`reward_check.py` says when they must be numbers).
They are normalised per *group*: by `group_index` when every sample has one (whatever the group sizes,
so a batch whose groups were filtered or partly failed is never normalised as one big group by
accident), else by position as slime does (`normalization_groups`). Every per-token list is checked against
`response_length`, and an error names the sample. Per-token lists are shared with the samples, not
copied: conversion never mutates a sample, and a rollout is converted once, just before it ships.
Keys: `tokens`, `response_lengths`, `total_lengths`, `rewards`, `raw_reward`, `truncated`,
`sample_indices`, `rollout_ids`, `loss_masks`, `rollout_mask_sums`, `weight_versions`; when the
samples carry them: `rollout_log_probs`, `teacher_log_probs`, `round_number`, `source_names`,
`metadata` (train metadata), `multimodal_train_inputs`, `rollout_top_p_token_ids`/`_offsets`,
`rollout_routed_experts`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any, Callable

from slime.observability import reporting, rollout_dump
from slime.observability.metrics import reward_value
from slime.observability.wandb_logger import WandbRun
from slime.rollout.base_types import RolloutFnTrainOutput, call_rollout_fn
from slime.rollout.data_source import DataSource
from slime.rollout.debug_data import load_debug_rollout, save_debug_rollout, save_debug_train_data
from slime.rollout.engine_client import EngineClient
from slime.rollout.failures import RolloutFailedError, describe_failures, failure_reasons
from slime.rollout.reward_check import fail_invalid_rewards, number_problem, reward_problem, reward_source
from slime.rollout.runtime import RolloutRuntime, unbind
from slime.rollout.stall_guard import StallGuard
from slime.tools.services import ToolServices
from slime.utils.async_utils import run
from slime.utils.endpoints import Endpoints
from slime.utils.misc import load_function
from slime.utils.processing_utils import load_tokenizer
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


def flatten_groups(out: Any) -> tuple[list[Sample], dict[str, Any]]:
    """Accept `RolloutFnTrainOutput`, `list[list[Sample]]` or `list[Sample]`."""
    metrics: dict[str, Any] = {}
    if isinstance(out, RolloutFnTrainOutput):
        out, metrics = out.samples, dict(out.metrics)
    if not isinstance(out, list):
        raise TypeError(f"--rollout-function-path returned {type(out).__name__}; expected list[list[Sample]]")
    flat: list[Sample] = []
    for g in out:
        flat.extend(g if isinstance(g, list) else [g])
    bad = [type(s).__name__ for s in flat if not isinstance(s, Sample)]
    if bad:
        raise TypeError(f"--rollout-function-path returned non-Sample items: {sorted(set(bad))}")
    return flat, metrics


def rollout_summary(args: Any, samples: list[Sample], seconds: float, metrics: dict[str, Any]) -> dict[str, Any]:
    n = len(samples)
    rewards = [r for r in (reward_value(args, s) for s in samples) if r == r]  # NaN: not a number (yet)
    tokens = sum(s.response_length for s in samples)
    return {"samples": n, "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
            "truncated_ratio": sum(s.status == Sample.Status.TRUNCATED for s in samples) / n if n else 0.0,
            "failed": sum(s.status == Sample.Status.FAILED for s in samples),
            "aborted": sum(s.status == Sample.Status.ABORTED for s in samples),
            "response_tokens": tokens, "tokens_per_s": tokens / max(seconds, 1e-9), "seconds": seconds,
            "engine_retries": metrics.get("perf/engine_retries", 0),
            **{k: metrics.get(f"perf/{k}", 0) for k in ("engine_deaths", "engine_restarts", "nodes_lost",
                                                          "engines_moved", "engines_unplaced", "router_moves")},
            "failure_reasons": failure_reasons(samples)[0]}


def _call_rollout_function(fn: Any, args: Any, rollout_id: int, data_source: Any, evaluation: bool,
                           runtime: RolloutRuntime) -> Any:
    """slime's signature through slime's `call_rollout_fn` (bare lists and dicts come back wrapped);
    the function reaches `runtime` as the process's bound one (`runtime.current(args)`). A function
    that only repeats the same error without progress fails with it (`StallGuard`)."""
    runtime.bind()  # this controller's, even when another one was created in this process since
    with StallGuard(runtime.progress).installed():
        return call_rollout_fn(fn, args, rollout_id, data_source, evaluation=evaluation)


def make_data_source(args: Any, tokenizer: Any) -> Any:
    """`--data-source-path` (slime's: a class built as `cls(args)`); ours by default."""
    path = getattr(args, "data_source_path", None)
    cls = load_function(path, "--data-source-path") if path else DataSource
    from slime.rollout.data_source import RolloutDataSourceWithBuffer

    default = cls is DataSource or cls is RolloutDataSourceWithBuffer
    return DataSource.from_args(args, tokenizer) if default else cls(args)


def _custom_log(args: Any, flag: str, *call_args: Any) -> bool:
    """slime's `--custom-(eval-)rollout-log-function-path`: True means it logged, skip ours."""
    path = getattr(args, flag, None)
    return bool(path and load_function(path, "--" + flag.replace("_", "-"))(*call_args))


class RolloutController:
    def __init__(self, args: Any, endpoints: Endpoints, *, tool_services: ToolServices | None = None,
                 wandb_run: WandbRun | None = None, fleet_counters: Callable[[], dict[str, int]] | None = None):
        self.args = args
        self.wandb_run = wandb_run
        # the fleet's cumulative counters (engine deaths, restarts); each rollout reports its own share
        self.fleet_counters = fleet_counters or (lambda: {})
        self._retries_base = 0
        tokenizer = load_tokenizer(args.hf_checkpoint) if args.hf_checkpoint else None
        client = EngineClient.from_args(args, endpoints, tokenizer=tokenizer)
        self.runtime = RolloutRuntime(args, client, tool_services or ToolServices()).bind()
        self.data_source = None
        self.loaded_rollout_id: int | None = None  # the rollout whose saved state `--load` restored
        if args.prompt_data and not args.load_debug_rollout_data:
            self.data_source = make_data_source(args, tokenizer)
            if args.load:
                self.loaded_rollout_id = self.data_source.load(args.load)
        self.generate_rollout = load_function(args.rollout_function_path, "--rollout-function-path")
        self.eval_generate_rollout = load_function(args.eval_function_path, "--eval-function-path")
        for flag in ("custom_generate_function_path", "custom_rm_path", "dynamic_sampling_filter_path"):
            if getattr(args, flag, None):
                load_function(getattr(args, flag), "--" + flag.replace("_", "-"))
        self.last_summary: dict[str, Any] | None = None

    @property
    def progress(self):
        return self.runtime.progress

    def status(self) -> dict[str, Any]:
        client = self.runtime.client
        # retries of the rollout (or eval) that is running: the same count its summary reports
        return {**self.progress.as_dict(), "in_flight": client.in_flight,
                "retries": client.stats.total_retries - self._retries_base,
                "buffer": self.data_source.get_buffer_length() if self.data_source else 0}

    def _samples(self, rollout_id: int) -> tuple[list[Sample], dict[str, Any]]:
        self.runtime.rollout_id = rollout_id
        if self.args.load_debug_rollout_data:
            return load_debug_rollout(self.args.load_debug_rollout_data, rollout_id), {}
        if self.data_source is None:
            raise ValueError("--prompt-data is required to generate rollouts")
        out = _call_rollout_function(self.generate_rollout, self.args, rollout_id, self.data_source, False,
                                     self.runtime)
        return flatten_groups(out)

    def generate(self, rollout_id: int, parallel_config: dict[str, Any] | None = None) -> Any:
        """One rollout. Without a parallel config: the training batch (one dict). With one (slime's
        `set_train_parallel_config`): one dict per data-parallel rank, scheduled into micro-batches."""
        start = time.monotonic()
        self.progress.reset(self.args.rollout_batch_size * self.args.n_samples_per_prompt, phase="rollout")
        retries_before = self._retries_base = self.runtime.client.stats.total_retries
        fleet_before = dict(self.fleet_counters())
        try:
            samples, metrics = self._samples(rollout_id)
        finally:
            self.progress.finish()
        if not (getattr(self.args, "custom_reward_post_process_path", None)
                or getattr(self.args, "custom_convert_samples_to_train_data_path", None)):
            fail_invalid_rewards(self.args, samples)  # the default post-processing needs numbers
        metrics.setdefault("perf/engine_retries", self.runtime.client.stats.total_retries - retries_before)
        for key, value in self.fleet_counters().items():
            metrics.setdefault(f"perf/{key}", value - fleet_before.get(key, 0))
        seconds = time.monotonic() - start
        if self.args.save_debug_rollout_data:
            save_debug_rollout(self.args.save_debug_rollout_data, rollout_id, samples)
        if samples and all(s.status == Sample.Status.FAILED for s in samples):
            self.last_summary = {"rollout_id": rollout_id, **rollout_summary(self.args, samples, seconds, metrics)}
            raise RolloutFailedError(describe_failures(rollout_id, samples), self.last_summary["failure_reasons"])
        if parallel_config is None:
            train = [s for s in samples if s.status != Sample.Status.FAILED]
        else:
            # a trainer's steps need every sample in place: a failed one trains nothing (slime's remove_sample)
            train = list(samples)
            for s in train:
                if s.status == Sample.Status.FAILED:
                    s.remove_sample = True
        batch = convert_samples_to_train_data(self.args, train)
        if self.args.save_debug_train_data:
            save_debug_train_data(self.args.save_debug_train_data, rollout_id, batch)
        out: Any = batch
        if parallel_config is not None:
            # imported here: it needs torch, which a rollout without a trainer never loads (cold start)
            from slime.train_batch.rank_batches import split_for_data_parallel

            out, split_metrics = split_for_data_parallel(self.args, batch, parallel_config)
            metrics.update(split_metrics)
        self.last_summary = {"rollout_id": rollout_id, **rollout_summary(self.args, samples, seconds, metrics)}
        perf = {**metrics, "perf/rollout_time": metrics.get("perf/rollout_time", seconds)}
        if not _custom_log(self.args, "custom_rollout_log_function_path", rollout_id, self.args, samples, metrics,
                           seconds):
            reporting.log_rollout(self.args, rollout_id, samples, perf, self.wandb_run)
        rollout_dump.dump_rollout(self.args, rollout_id, samples)
        self.save(rollout_id)
        return out

    def eval(self, rollout_id: int) -> dict[str, Any]:
        self.runtime.rollout_id = rollout_id
        self._retries_base = self.runtime.client.stats.total_retries
        try:
            out = _call_rollout_function(self.eval_generate_rollout, self.args, rollout_id, self.data_source, True,
                                         self.runtime)
        finally:
            self.progress.finish()
        data = out.data
        if not isinstance(data, dict):
            raise TypeError(f"--eval-function-path returned {type(data).__name__}; expected "
                            "{dataset: {'rewards', 'truncated', 'samples'}}")
        if not _custom_log(self.args, "custom_eval_rollout_log_function_path", rollout_id, self.args, data,
                           out.metrics):
            reporting.log_eval(self.args, rollout_id, data, self.wandb_run)
        rollout_dump.dump_eval(self.args, rollout_id, data)
        summary = {}
        for name, d in data.items():
            rewards, truncated = d.get("rewards", []), d.get("truncated", [])
            numbers = [float(r) for r in rewards if number_problem(r) is None]  # raw dicts: not averaged
            summary[name] = {"samples": len(rewards), "mean_reward": sum(numbers) / max(1, len(numbers)),
                             "truncated_ratio": sum(map(bool, truncated)) / max(1, len(truncated))}
        return summary

    def save(self, rollout_id: int) -> None:
        """The data source's state; groups a fully-async worker holds are saved as buffered prompts."""
        from slime.rollout.fully_async_rollout import worker_hub

        if self.args.save and self.data_source is not None:
            held = worker_hub(self.runtime).held_groups()
            if held:
                self.data_source.save(self.args.save, rollout_id, held=held)
            else:  # a custom --data-source-path keeps slime's two-argument save
                self.data_source.save(self.args.save, rollout_id)

    # ---- weight updates: the fully-async workers stop starting groups while weights change ----
    def begin_weight_update(self) -> None:
        """A weight push starts: background rollout workers start no new group (with
        --partial-rollout they abort what is in flight and keep it to continue afterwards)."""
        from slime.rollout.fully_async_rollout import worker_hub

        run(worker_hub(self.runtime).pause())

    def end_weight_update(self, weight_version: str | None = None) -> None:
        """The push is over (`weight_version`: what the engines serve now, None if it failed):
        the workers drop what became too stale (--max-staleness) and resume."""
        from slime.rollout.fully_async_rollout import worker_hub

        run(worker_hub(self.runtime).resume(weight_version))

    def close(self) -> dict[str, int]:
        """Stop the background rollout workers (what they had in flight is aborted and goes back to
        the data source, with their queued groups), unbind the runtime and close its HTTP sessions
        (rollouts ran on the process's background loop) and what plugins started for it (the agent
        gateway). Returns how many groups went back."""
        from slime.rollout.fully_async_rollout import worker_hub
        from slime.tools.registry import close_tool_sets

        try:
            stopped = run(worker_hub(self.runtime).stop())
        finally:
            unbind(self.runtime)
            self.runtime.close()
            run(close_tool_sets())  # tools' HTTP sessions live on the same loop
        if stopped["returned_groups"]:
            logger.info("rollout workers stopped: %d group(s) returned to the data source", stopped["returned_groups"])
        return stopped


# ---- samples -> training batch (slime's _convert_samples_to_train_data) ----------------------------
CONVERT_FLAG = "--custom-convert-samples-to-train-data-path"
REWARD_FLAG = "--custom-reward-post-process-path"

# Keys whose entries are per-token lists of `response_length` (checked for every sample).
PER_TOKEN_KEYS = ("loss_masks", "rollout_log_probs", "teacher_log_probs")


class BatchError(ValueError):
    pass


def _who(s: Sample) -> str:
    return f"sample index={s.index} group={s.group_index}"


def check_sample(s: Sample) -> None:
    """Length invariants of one sample; `loss_mask=None` is allowed (it means "train on every token")."""
    who = _who(s)
    if s.response_length < 0 or s.response_length > len(s.tokens):
        raise BatchError(f"{who}: response_length {s.response_length} but {len(s.tokens)} tokens")
    if s.loss_mask is not None and len(s.loss_mask) != s.response_length:
        raise BatchError(f"{who}: loss_mask has {len(s.loss_mask)} entries, "
                         f"response_length is {s.response_length}")
    for name in ("rollout_log_probs", "teacher_log_probs"):
        values = getattr(s, name, None)
        if values is not None and len(values) != s.response_length:
            raise BatchError(f"{who}: {name} has {len(values)} entries, response_length is {s.response_length}")


def untrained_log_probs_filled(s: Sample, name: str, mask: list[int]) -> list[float] | None:
    """`s.<name>` with a None where the loss mask is 0 replaced by 0.0. Plugins leave None at tokens the
    model did not sample (strands-sglang records tool output so; slime's recipe copies it as is), and
    0.0 is what slime's `append_response_tokens(trainable=False)` stores there; the loss never reads it.
    A None at a trained token has no value to stand for: an error naming the sample and position."""
    values = getattr(s, name, None)
    if values is None or all(v is not None for v in values):
        return values
    trained = [i for i, v in enumerate(values) if v is None and mask[i]]
    if trained:
        raise BatchError(f"{_who(s)}: {name}[{trained[0]}] is None at a token the loss trains "
                         f"(loss_mask 1): the engine's log-prob of a sampled token is needed")
    return [0.0 if v is None else v for v in values]


def normalization_groups(args: Any, samples: list[Sample]) -> list[list[int]]:
    """Positions of the samples normalised together. With a `group_index` on every sample: by group.
    Without (a custom generate function that builds new Samples): by position, slime's
    `reshape(-1, n_samples_per_prompt)`, which needs the count to be a multiple of
    `--n-samples-per-prompt`; otherwise the groups' sizes differ and their boundaries are unknown,
    so the batch is one group (slime does the same) and a warning says so."""
    if all(s.group_index is not None for s in samples):
        by_group: dict[Any, list[int]] = defaultdict(list)
        for i, s in enumerate(samples):
            by_group[s.group_index].append(i)
        return list(by_group.values())
    n = int(getattr(args, "n_samples_per_prompt", 1) or 1)
    if len(samples) % n == 0:
        return [list(range(i, i + n)) for i in range(0, len(samples), n)]
    logger.warning("reward normalisation: %d samples lack group_index and %d is not a multiple of "
                   "--n-samples-per-prompt %d, so the groups cannot be told apart; normalising the batch as one "
                   "group (as slime does). Set Sample.group_index to normalise per group.",
                   sum(s.group_index is None for s in samples), len(samples), n)
    return [list(range(len(samples)))]


def normalize_group_rewards(args: Any, samples: list[Sample], raw: list[float]) -> list[float]:
    estimator = getattr(args, "advantage_estimator", "grpo")
    if getattr(args, "disable_rewards_normalization", False) or estimator not in (
            "grpo", "gspo", "cispo", "reinforce_plus_plus_baseline"):
        return list(raw)
    out = list(raw)
    use_std = estimator in ("grpo", "gspo", "cispo") and not getattr(args, "disable_grpo_std_normalization", False)
    for idx in normalization_groups(args, samples):
        vals = [raw[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else 0.0
        for i in idx:
            out[i] = (raw[i] - mean) / (std + 1e-6) if use_std else raw[i] - mean
    return out


def _hook(args: Any, attr: str, flag: str):
    path = getattr(args, attr, None)
    return load_function(path, flag) if path else None


def post_process_rewards(args: Any, samples: list[Sample]) -> tuple[list[float], list[float]]:
    """slime's `_post_process_rewards`: `(raw_rewards, rewards)`, one entry per sample each.

    `--custom-reward-post-process-path fn(args, samples) -> (raw_rewards, rewards)` replaces the
    default group normalisation; anything else than two sequences of `len(samples)` is an error
    naming the flag (a silent mismatch would pair rewards with the wrong samples)."""
    hook = _hook(args, "custom_reward_post_process_path", REWARD_FLAG)
    if hook is None:
        for s in samples:
            problem = reward_problem(args, s)
            if problem is not None:
                raise BatchError(f"{reward_source(args, s)} {problem} for {_who(s)}")
        raw = [float(s.get_reward_value(args)) for s in samples]
        return raw, normalize_group_rewards(args, samples, raw)
    out = hook(args, samples)
    where = f"{REWARD_FLAG} {args.custom_reward_post_process_path!r}"
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise BatchError(f"{where} returned {type(out).__name__}; expected (raw_rewards, rewards)")
    checked = []
    for name, values in zip(("raw_rewards", "rewards"), out):
        if hasattr(values, "tolist"):  # a tensor or array is fine
            values = values.tolist()
        if not isinstance(values, (list, tuple)):
            raise BatchError(f"{where} returned {name} as {type(values).__name__}; expected (raw_rewards, "
                             f"rewards), each a list of {len(samples)} (one per sample)")
        if len(values) != len(samples):
            raise BatchError(f"{where} returned {name} with {len(values)} entries for {len(samples)} samples")
        for s, v in zip(samples, values):
            problem = number_problem(v)
            if problem is not None:
                raise BatchError(f"{where} {problem} in {name} for sample index={s.index} group={s.group_index}")
        checked.append([float(v) for v in values])
    return checked[0], checked[1]


def assign_rollout_ids(ids: list[int | None]) -> list[int]:
    """Each None becomes the smallest id not used by any sample, so a sample without a rollout id
    is a rollout of its own and never merges with an annotated one."""
    used = {i for i in ids if i is not None}
    out, fresh = [], 0
    for rid in ids:
        if rid is None:
            while fresh in used:
                fresh += 1
            rid = fresh
            used.add(rid)
        out.append(rid)
    return out


def rollout_mask_sums(rollout_ids: list[int], loss_masks: list[Any]) -> list[int]:
    """Per sample, the loss-mask total of its whole rollout: the denominator that keeps a token-level
    loss exact when one rollout's samples land in different micro-batches or ranks."""
    per_sample = [int(sum(m)) for m in loss_masks]
    totals: dict[int, int] = defaultdict(int)
    for rid, n in zip(rollout_ids, per_sample):
        totals[rid] += n
    return [totals[rid] for rid in rollout_ids]


def _source(s: Sample) -> str | None:
    src = getattr(s, "source", None)
    if src:
        return src
    meta = s.metadata or {}
    return meta.get("source_name") or None


def convert_samples_to_train_data(args: Any, samples: list[Sample]) -> dict[str, list]:
    """slime's `_convert_samples_to_train_data`: plain lists, one entry per sample.

    `--custom-convert-samples-to-train-data-path fn(args, samples) -> dict` replaces it; its output is
    checked by `check_custom_train_data` and completed with `total_lengths`, `rollout_ids` and
    `rollout_mask_sums` when it lacks them."""
    if not samples:
        raise BatchError("no samples to convert (every sample failed or was filtered)")
    hook = _hook(args, "custom_convert_samples_to_train_data_path", CONVERT_FLAG)
    if hook is not None:
        return check_custom_train_data(args, samples, hook(args, samples))
    for s in samples:
        check_sample(s)
    raw, rewards = post_process_rewards(args, samples)
    meta_raw = [(s.metadata or {}).get("raw_reward") for s in samples]
    if any(v is not None for v in meta_raw):  # e.g. a task reward kept apart from a shaped one
        raw = [m if m is not None else r for m, r in zip(meta_raw, raw)]

    loss_masks = []
    for s in samples:
        if getattr(s, "remove_sample", False):
            loss_masks.append([0] * s.response_length)
        elif s.loss_mask is None:  # slime's rule: plugins written for slime never set it
            loss_masks.append([1] * s.response_length)
        else:
            loss_masks.append(s.loss_mask)
    rollout_ids = assign_rollout_ids([getattr(s, "rollout_id", None) for s in samples])

    data: dict[str, list] = {
        "tokens": [s.tokens for s in samples],
        "response_lengths": [s.response_length for s in samples],
        "total_lengths": [len(s.tokens) for s in samples],
        "rewards": rewards,
        "raw_reward": raw,
        "truncated": [1 if s.status == Sample.Status.TRUNCATED else 0 for s in samples],
        "sample_indices": [s.index for s in samples],
        "rollout_ids": rollout_ids,
        "loss_masks": loss_masks,
        "rollout_mask_sums": rollout_mask_sums(rollout_ids, loss_masks),
        "weight_versions": [list(getattr(s, "weight_versions", None) or []) for s in samples],
    }
    for key in ("rollout_log_probs", "teacher_log_probs"):
        values = [untrained_log_probs_filled(s, key, mask) for s, mask in zip(samples, loss_masks)]
        if all(v is not None for v in values):
            data[key] = values
    for key, attr in (("rollout_top_p_token_ids", "rollout_top_p_token_ids"),
                      ("rollout_top_p_token_offsets", "rollout_top_p_token_offsets"),
                      ("rollout_routed_experts", "rollout_routed_experts")):
        values = [getattr(s, attr, None) for s in samples]
        if all(v is not None for v in values):
            data[key] = values
    if all("round_number" in (s.metadata or {}) for s in samples):
        data["round_number"] = [s.metadata["round_number"] for s in samples]
    sources = [_source(s) for s in samples]
    if any(sources):
        data["source_names"] = [src or "unknown" for src in sources]
    train_meta = [getattr(s, "train_metadata", None) for s in samples]
    if any(m is not None for m in train_meta):
        data["metadata"] = train_meta
    mm = [getattr(s, "multimodal_train_inputs", None) for s in samples]
    if any(m is not None for m in mm):
        data["multimodal_train_inputs"] = mm
    return data


def check_custom_train_data(args: Any, samples: list[Sample], data: Any) -> dict[str, list]:
    """What a custom convert hook returned must be a batch the trainer can read: a dict with at least
    `tokens`, `response_lengths`, `rewards` and `loss_masks`, every per-sample list of one length, and
    per-token lists of `response_length`. Errors name the flag and the entry."""
    where = f"{CONVERT_FLAG} {getattr(args, 'custom_convert_samples_to_train_data_path', None)!r}"
    if not isinstance(data, dict):
        raise BatchError(f"{where} returned {type(data).__name__}; expected a dict of per-sample lists")
    missing = [k for k in ("tokens", "response_lengths", "rewards", "loss_masks") if k not in data]
    if missing:
        raise BatchError(f"{where} returned a dict without {missing}")
    n = len(data["tokens"])
    if n == 0:
        raise BatchError(f"{where} returned no samples")
    for key, values in data.items():
        if key in ("tokens", "response_lengths", "rewards", "loss_masks", "raw_reward", "rollout_ids",
                   "total_lengths", "rollout_mask_sums", *PER_TOKEN_KEYS) and len(values) != n:
            raise BatchError(f"{where}: {key!r} has {len(values)} entries, 'tokens' has {n}")
    for i in range(n):
        rl, nt = data["response_lengths"][i], len(data["tokens"][i])
        if rl < 0 or rl > nt:
            raise BatchError(f"{where}: entry {i}: response_length {rl} but {nt} tokens")
        for key in PER_TOKEN_KEYS:
            if key in data and data[key][i] is not None and len(data[key][i]) != rl:
                raise BatchError(f"{where}: entry {i}: {key} has {len(data[key][i])} entries, "
                                 f"response_length is {rl}")
    out = dict(data)
    out.setdefault("total_lengths", [len(t) for t in data["tokens"]])
    if "rollout_ids" not in out:
        own = [getattr(s, "rollout_id", None) for s in samples] if len(samples) == n else [None] * n
        out["rollout_ids"] = assign_rollout_ids(own)
    out.setdefault("rollout_mask_sums", rollout_mask_sums(out["rollout_ids"], out["loss_masks"]))
    out.setdefault("raw_reward", list(out["rewards"]))
    return out
