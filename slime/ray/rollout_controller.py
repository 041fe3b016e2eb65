"""RolloutController: owns the data source and the rollout plugins, turns rollouts into
training batches.

`generate(rollout_id)`: rollout function -> flatten groups -> optional debug save -> metrics
and dumps -> convert -> `Box(ray.put(batch))`. With `--load-debug-rollout-data` the samples
come from the file instead and no engine is touched.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray

from slime.observability import reporting, rollout_dump, wandb_logger
from slime.ray.box import Box
from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.data_source import DataSource
from slime.rollout.debug_data import load_debug_rollout, save_debug_rollout, save_debug_train_data
from slime.rollout.engine_client import GenerateState, load_tokenizer
from slime.rollout.sglang_rollout import PROGRESS
from slime.rollout.train_data import convert_samples_to_train_data
from slime.utils.misc import load_function
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
    rewards = [s.get_reward_value(args) for s in samples]
    tokens = sum(s.response_length for s in samples)
    return {"samples": n, "mean_reward": sum(rewards) / n if n else 0.0,
            "truncated_ratio": sum(s.status == Sample.Status.TRUNCATED for s in samples) / n if n else 0.0,
            "failed": sum(s.status == Sample.Status.FAILED for s in samples),
            "aborted": sum(s.status == Sample.Status.ABORTED for s in samples),
            "response_tokens": tokens, "tokens_per_s": tokens / max(seconds, 1e-9), "seconds": seconds,
            "engine_retries": metrics.get("perf/engine_retries", 0)}


class RolloutController:
    def __init__(self, args: Any, wandb_run_id: str | None = None):
        self.args = args
        self.tokenizer = load_tokenizer(args.hf_checkpoint) if args.hf_checkpoint else None
        if self.tokenizer is not None:
            GenerateState.get(args)._tokenizer = self.tokenizer
        self.data_source = None
        if args.prompt_data and not args.load_debug_rollout_data:
            self.data_source = DataSource.from_args(args, self.tokenizer)
            if args.load:
                self.data_source.load(args.load)
        self.generate_rollout = load_function(args.rollout_function_path, "--rollout-function-path")
        self.eval_generate_rollout = load_function(args.eval_function_path, "--eval-function-path")
        for flag in ("custom_generate_function_path", "custom_rm_path", "dynamic_sampling_filter_path"):
            if getattr(args, flag, None):
                load_function(getattr(args, flag), "--" + flag.replace("_", "-"))
        self.phase = "idle"
        self.last_summary: dict[str, Any] | None = None
        if wandb_run_id and getattr(args, "use_wandb", False):
            wandb_logger.init_wandb_secondary(args, wandb_run_id)

    def set_endpoints(self, router_ip: str | None, router_port: int | None, engine_urls: list[str]) -> None:
        """Router and engines come up while the controller loads data; the manager tells it where."""
        self.args.sglang_router_ip, self.args.sglang_router_port = router_ip, router_port
        self.args.rollout_engine_urls = list(engine_urls)

    def get_last_summary(self) -> dict[str, Any] | None:
        return self.last_summary

    def status(self) -> dict[str, Any]:
        state = GenerateState._instance
        return {"phase": self.phase, **PROGRESS.as_dict(state),
                "buffer": self.data_source.get_buffer_length() if self.data_source else 0}

    def _samples(self, rollout_id: int) -> tuple[list[Sample], dict[str, Any]]:
        if self.args.load_debug_rollout_data:
            return load_debug_rollout(self.args.load_debug_rollout_data, rollout_id), {}
        if self.data_source is None:
            raise ValueError("--prompt-data is required to generate rollouts")
        return flatten_groups(self.generate_rollout(self.args, rollout_id, self.data_source, evaluation=False))

    def generate(self, rollout_id: int) -> Box:
        self.phase = "rollout"
        start = time.monotonic()
        try:
            samples, metrics = self._samples(rollout_id)
            seconds = time.monotonic() - start
            if self.args.save_debug_rollout_data:
                save_debug_rollout(self.args.save_debug_rollout_data, rollout_id, samples)
            train = [s for s in samples if s.status != Sample.Status.FAILED]
            batch = convert_samples_to_train_data(self.args, train)
            if self.args.save_debug_train_data:
                save_debug_train_data(self.args.save_debug_train_data, rollout_id, batch)
            self.last_summary = {"rollout_id": rollout_id, **rollout_summary(self.args, samples, seconds, metrics)}
            self._report(rollout_id, samples, metrics, seconds)
            self.save(rollout_id)
            return Box(ray.put(batch))
        finally:
            self.phase = "idle"

    def eval(self, rollout_id: int) -> dict[str, Any]:
        self.phase = "eval"
        try:
            out = self.eval_generate_rollout(self.args, rollout_id, self.data_source, evaluation=True)
            data = out.data if isinstance(out, RolloutFnEvalOutput) else out
            if not isinstance(data, dict):
                raise TypeError(f"--eval-function-path returned {type(data).__name__}; expected "
                                "{dataset: {'rewards', 'truncated', 'samples'}}")
            reporting.log_eval(self.args, rollout_id, data)
            rollout_dump.dump_eval(self.args, rollout_id, data)
            summary = {}
            for name, d in data.items():
                rewards, truncated = d.get("rewards", []), d.get("truncated", [])
                summary[name] = {"samples": len(rewards), "mean_reward": sum(rewards) / max(1, len(rewards)),
                                 "truncated_ratio": sum(map(bool, truncated)) / max(1, len(truncated))}
            return summary
        finally:
            self.phase = "idle"

    def _report(self, rollout_id: int, samples: list[Sample], metrics: dict[str, Any], seconds: float) -> None:
        perf = {**metrics, "perf/rollout_time": metrics.get("perf/rollout_time", seconds)}
        reporting.log_rollout(self.args, rollout_id, samples, perf)
        rollout_dump.dump_rollout(self.args, rollout_id, samples)

    def save(self, rollout_id: int) -> None:
        if self.args.save and self.data_source is not None:
            self.data_source.save(self.args.save, rollout_id)

