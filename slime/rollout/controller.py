"""`RolloutController`: a rollout id in, a training batch out (rollout function, then conversion).

It calls the rollout function over the data source and converts its samples. It owns the data
source, the plugins loaded from their `--*-path` flags, and the `RolloutRuntime` (engine client,
progress, tool services) the plugins share.
`generate(rollout_id)`: rollout function -> flatten groups -> optional debug save -> convert
(`train_data.convert_samples_to_train_data`) -> metrics and dumps -> batch, or one batch per
data-parallel rank. With `--load-debug-rollout-data` the samples come from the file and no engine
is touched. A rollout in which every sample failed raises `RolloutFailedError` (`failures.py`: the
failures by reason, with one example each). Counters in `status()` are the running rollout's, as in
its summary. A plain object: the RolloutManager actor holds it; no Ray here.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from slime.observability import reporting, rollout_dump
from slime.observability.flags import ReportConfig
from slime.observability.metrics import reward_value
from slime.observability.wandb_logger import WandbRun
from slime.rollout.base_types import RolloutFnTrainOutput, call_rollout_fn
from slime.rollout.current_rollout import rollout_scope
from slime.rollout.data_source import DataSource
from slime.rollout.debug_data import load_debug_rollout, save_debug_rollout, save_debug_train_data
from slime.rollout.engine_client import EngineClient
from slime.rollout.flags import RolloutRunConfig
from slime.rollout.failures import RolloutFailedError, describe_failures, failure_reasons
from slime.rollout.reward_check import fail_invalid_rewards, number_problem
from slime.rollout.runtime import RolloutRuntime, unbind
from slime.rollout.stall_guard import StallGuard
from slime.rollout.train_data import (  # noqa: F401 - tests and plugins import these from here
    CONVERT_FLAG,
    PER_TOKEN_KEYS,
    REWARD_FLAG,
    BatchError,
    assign_rollout_ids,
    check_custom_train_data,
    check_sample,
    convert_samples_to_train_data,
    normalization_groups,
    normalize_group_rewards,
    post_process_rewards,
    rollout_mask_sums,
    untrained_log_probs_filled,
)
from slime.tools.services import ToolServices
from slime.train_batch.flags import TrainBatchConfig
from slime.utils.async_utils import run
from slime.utils.endpoints import Endpoints, rollout_num_engines
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


def rollout_summary(
    keyed: ReportConfig, samples: list[Sample], seconds: float, metrics: dict[str, Any]
) -> dict[str, Any]:
    """The rollout's counts; `keyed` holds --reward-key (`reward_value`)."""
    n = len(samples)
    rewards = [r for r in (reward_value(keyed, s) for s in samples) if r == r]  # NaN: not a number (yet)
    tokens = sum(s.response_length for s in samples)
    return {
        "samples": n,
        "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        "truncated_ratio": sum(s.status == Sample.Status.TRUNCATED for s in samples) / n if n else 0.0,
        "failed": sum(s.status == Sample.Status.FAILED for s in samples),
        "aborted": sum(s.status == Sample.Status.ABORTED for s in samples),
        "response_tokens": tokens,
        "tokens_per_s": tokens / max(seconds, 1e-9),
        "seconds": seconds,
        "engine_retries": metrics.get("perf/engine_retries", 0),
        **{
            k: metrics.get(f"perf/{k}", 0)
            for k in (
                "engine_deaths",
                "engine_restarts",
                "nodes_lost",
                "engines_moved",
                "engines_unplaced",
                "router_moves",
            )
        },
        "failure_reasons": failure_reasons(samples)[0],
    }


def _call_rollout_function(
    fn: Any, args: Any, rollout_id: int, data_source: Any, evaluation: bool, runtime: RolloutRuntime
) -> Any:
    """slime's signature through slime's `call_rollout_fn` (bare lists and dicts come back wrapped);
    the function reaches `runtime` as the process's bound one (`runtime.current(args)`). A function
    that only repeats the same error without progress fails with it (`StallGuard`)."""
    runtime.bind()  # this controller's, even when another one was created in this process since
    with StallGuard(runtime.progress).installed():
        return call_rollout_fn(fn, args, rollout_id, data_source, evaluation=evaluation)


def make_data_source(args: Any, path: str | None, tokenizer: Any) -> Any:
    """`--data-source-path` `path` (slime's: a class built as `cls(args)`); ours by default."""
    cls = load_function(path, "--data-source-path") if path else DataSource
    from slime.rollout.data_source import RolloutDataSourceWithBuffer

    default = cls is DataSource or cls is RolloutDataSourceWithBuffer
    return DataSource.from_args(args, tokenizer) if default else cls(args)


def _custom_log(path: str | None, option: str, *call_args: Any) -> bool:
    """slime's `--custom-(eval-)rollout-log-function-path` `path`: True means it logged, skip ours."""
    return bool(path and load_function(path, option)(*call_args))


class RolloutController:
    def __init__(
        self,
        args: Any,
        endpoints: Endpoints,
        *,
        tool_services: ToolServices | None = None,
        wandb_run: WandbRun | None = None,
        fleet_counters: Callable[[], dict[str, int]] | None = None,
    ):
        self.args = args
        # the rollout's flags, read once: a namespace lacking one is refused here, naming it (plugins get `args`)
        self.run_config = run = RolloutRunConfig.from_args(args)  # with the few flags declared elsewhere
        self.config = config = run.rollout
        self.report = ReportConfig.from_args(args)  # what the metric logs and dumps read
        self.batch_config = TrainBatchConfig.from_args(args)  # how a trainer's batch is split over its ranks
        self.wandb_run = wandb_run
        # the fleet's cumulative counters (engine deaths, restarts); each rollout reports its own share
        self.fleet_counters = fleet_counters or (lambda: {})
        self._retries_base = 0
        tokenizer = load_tokenizer(run.hf_checkpoint) if run.hf_checkpoint else None
        client = EngineClient.of(run, endpoints, engines=rollout_num_engines(args), tokenizer=tokenizer)
        self.runtime = RolloutRuntime(args, client, tool_services or ToolServices()).reading(run).bind()
        self.data_source = None
        self.loaded_rollout_id: int | None = None  # the rollout whose saved state `--load` restored
        if config.prompt_data and not run.load_debug_rollout_data:
            self.data_source = make_data_source(args, run.data_source_path, tokenizer)
            if run.load:
                self.loaded_rollout_id = self.data_source.load(run.load)
        self.generate_rollout = load_function(config.rollout_function_path, "--rollout-function-path")
        self.eval_generate_rollout = load_function(config.eval_function_path, "--eval-function-path")
        for flag in ("custom_generate_function_path", "custom_rm_path", "dynamic_sampling_filter_path"):
            if getattr(config, flag):
                load_function(getattr(config, flag), "--" + flag.replace("_", "-"))
        self.last_summary: dict[str, Any] | None = None

    @property
    def progress(self):
        return self.runtime.progress

    def status(self) -> dict[str, Any]:
        client = self.runtime.client
        # retries of the rollout (or eval) that is running: the same count its summary reports
        return {
            **self.progress.as_dict(),
            "in_flight": client.in_flight,
            "retries": client.stats.total_retries - self._retries_base,
            "buffer": self.data_source.get_buffer_length() if self.data_source else 0,
        }

    def _samples(self, rollout_id: int) -> tuple[list[Sample], dict[str, Any]]:
        if self.run_config.load_debug_rollout_data:
            return load_debug_rollout(self.run_config.load_debug_rollout_data, rollout_id), {}
        if self.data_source is None:
            raise ValueError("--prompt-data is required to generate rollouts")
        with rollout_scope(rollout_id):  # what the function starts knows its rollout (current_rollout.py)
            out = _call_rollout_function(
                self.generate_rollout, self.args, rollout_id, self.data_source, False, self.runtime
            )
        return flatten_groups(out)

    def generate(self, rollout_id: int, parallel_config: dict[str, Any] | None = None) -> Any:
        """One rollout. Without a parallel config: the training batch (one dict). With one (slime's
        `set_train_parallel_config`): one dict per data-parallel rank, scheduled into micro-batches."""
        start = time.monotonic()
        self.progress.reset(self.config.rollout_batch_size * self.config.n_samples_per_prompt, phase="rollout")
        retries_before = self._retries_base = self.runtime.client.stats.total_retries
        fleet_before = dict(self.fleet_counters())
        try:
            samples, metrics = self._samples(rollout_id)
        finally:
            self.progress.finish()
        run = self.run_config
        if not (run.custom_reward_post_process_path or run.custom_convert_samples_to_train_data_path):
            fail_invalid_rewards(self.config, samples)  # the default post-processing needs numbers
        metrics.setdefault("perf/engine_retries", self.runtime.client.stats.total_retries - retries_before)
        for key, value in self.fleet_counters().items():
            metrics.setdefault(f"perf/{key}", value - fleet_before.get(key, 0))
        seconds = time.monotonic() - start
        if run.save_debug_rollout_data:
            save_debug_rollout(run.save_debug_rollout_data, rollout_id, samples)
        if samples and all(s.status == Sample.Status.FAILED for s in samples):
            self.last_summary = {"rollout_id": rollout_id, **rollout_summary(self.report, samples, seconds, metrics)}
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
        if run.save_debug_train_data:
            save_debug_train_data(run.save_debug_train_data, rollout_id, batch)
        out: Any = batch
        if parallel_config is not None:
            # imported here: it needs torch, which a rollout without a trainer never loads (cold start)
            from slime.train_batch.rank_batches import split_for_data_parallel

            out, split_metrics = split_for_data_parallel(self.batch_config, batch, parallel_config)
            metrics.update(split_metrics)
        self.last_summary = {"rollout_id": rollout_id, **rollout_summary(self.report, samples, seconds, metrics)}
        perf = {**metrics, "perf/rollout_time": metrics.get("perf/rollout_time", seconds)}
        log_path = self.run_config.custom_rollout_log_function_path
        if not _custom_log(
            log_path, "--custom-rollout-log-function-path", rollout_id, self.args, samples, metrics, seconds
        ):
            reporting.log_rollout(self.report, rollout_id, samples, perf, self.wandb_run)
        rollout_dump.dump_rollout(self.report, rollout_id, samples)
        self.save(rollout_id)
        return out

    def eval(self, rollout_id: int) -> dict[str, Any]:
        self._retries_base = self.runtime.client.stats.total_retries
        try:
            with rollout_scope(rollout_id):
                out = _call_rollout_function(
                    self.eval_generate_rollout, self.args, rollout_id, self.data_source, True, self.runtime
                )
        finally:
            self.progress.finish()
        data = out.data
        if not isinstance(data, dict):
            raise TypeError(
                f"--eval-function-path returned {type(data).__name__}; expected "
                "{dataset: {'rewards', 'truncated', 'samples'}}"
            )
        log_path = self.run_config.custom_eval_rollout_log_function_path
        if not _custom_log(
            log_path, "--custom-eval-rollout-log-function-path", rollout_id, self.args, data, out.metrics
        ):
            reporting.log_eval(self.report, rollout_id, data, self.wandb_run)
        rollout_dump.dump_eval(self.report, rollout_id, data)
        summary = {}
        for name, d in data.items():
            rewards, truncated = d.get("rewards", []), d.get("truncated", [])
            numbers = [float(r) for r in rewards if number_problem(r) is None]  # raw dicts: not averaged
            summary[name] = {
                "samples": len(rewards),
                "mean_reward": sum(numbers) / max(1, len(numbers)),
                "truncated_ratio": sum(map(bool, truncated)) / max(1, len(truncated)),
            }
        return summary

    def save(self, rollout_id: int) -> None:
        """The data source's state; groups a fully-async worker holds are saved as buffered prompts."""
        from slime.rollout.fully_async_rollout import worker_hub

        save = self.run_config.save
        if save and self.data_source is not None:
            held = worker_hub(self.runtime).held_groups()
            if held:
                self.data_source.save(save, rollout_id, held=held)
            else:  # a custom --data-source-path keeps slime's two-argument save
                self.data_source.save(save, rollout_id)

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
        (rollouts ran on the process's background loop: the engine client's and the tools') and what
        plugins started for it (the agent gateway). Returns how many groups went back."""
        from slime.rollout.fully_async_rollout import worker_hub

        try:
            stopped = run(worker_hub(self.runtime).stop())
        finally:
            unbind(self.runtime)
            self.runtime.close()
        if stopped["returned_groups"]:
            logger.info("rollout workers stopped: %d group(s) returned to the data source", stopped["returned_groups"])
        return stopped
