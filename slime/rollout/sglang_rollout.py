"""The default rollout function, at slime's path `slime.rollout.sglang_rollout.generate_rollout`.

Groups are generated concurrently through the router (bounded by `--sglang-server-concurrency`),
each sample token-in/token-out: `tokens` = prompt ids + exactly the ids the engine returned,
with their log-probs and a loss mask of ones. Rewards are computed as soon as a group is done.
With a dynamic filter, more groups are started than needed and the leftovers are aborted on the
engines and their prompts returned to the buffer, so nothing is lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.data_source import DataSource, build_prompt_samples
from slime.rollout.engine_client import GenerateState, generate_tokens
from slime.rollout.filters import apply_filter
from slime.rollout.rm import async_rm, batched_async_rm
from slime.utils.async_utils import run
from slime.utils.http_retry import HttpError, post
from slime.utils.misc import load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

FINISH_TO_STATUS = {"length": Sample.Status.TRUNCATED, "abort": Sample.Status.ABORTED,
                    "stop": Sample.Status.COMPLETED}


class RolloutProgressState:
    """Live counters of the running rollout, read by the controller's status query."""

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, target: int) -> None:
        self.target, self.done, self.response_tokens, self.started = target, 0, 0, time.monotonic()
        self.running = target > 0

    def as_dict(self, state: GenerateState | None) -> dict[str, Any]:
        elapsed = max(1e-9, time.monotonic() - self.started)
        return {"target": self.target, "done": self.done, "running": self.running,
                "in_flight": state.in_flight if state else 0, "tokens": self.response_tokens,
                "tokens_per_s": self.response_tokens / elapsed,
                "retries": state.stats.total_retries if state else 0}


PROGRESS = RolloutProgressState()
MAX_DROPPED_PER_KEPT = 50  # a filter that drops more than this many groups per wanted group is broken


def sampling_params_from_args(args: Any, evaluation: bool = False) -> dict[str, Any]:
    params = {
        "temperature": args.eval_temperature if evaluation and args.eval_temperature is not None
        else args.rollout_temperature,
        "top_p": args.eval_top_p if evaluation and args.eval_top_p is not None else args.rollout_top_p,
        "top_k": args.rollout_top_k,
        "max_new_tokens": args.eval_max_response_len if evaluation else args.rollout_max_response_len,
        "skip_special_tokens": bool(args.rollout_skip_special_tokens),
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    if args.rollout_stop:
        params["stop"] = list(args.rollout_stop)
    if args.rollout_stop_token_ids:
        params["stop_token_ids"] = list(args.rollout_stop_token_ids)
    return params


def prompt_ids(args: Any, sample: Sample) -> list[int]:
    """The prompt's token ids: pre-tokenised by the data source, else tokenised once here."""
    if sample.tokens and sample.response_length == 0:
        return list(sample.tokens)
    tok = GenerateState.get(args).tokenizer
    prompt = sample.prompt
    if isinstance(prompt, list):
        prompt = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tok(prompt, add_special_tokens=False)["input_ids"]


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Default per-sample generation: one engine call, token-in/token-out."""
    ids = prompt_ids(args, sample)
    params = dict(sampling_params)
    if args.rollout_max_context_len is not None:
        room = args.rollout_max_context_len - len(ids)
        if room <= 0:
            sample.tokens, sample.response_length, sample.response = ids, 0, ""
            sample.loss_mask, sample.rollout_log_probs = [], []
            sample.status = Sample.Status.TRUNCATED
            sample.metadata["finish_reason"] = "prompt_fills_context"
            return sample
        params["max_new_tokens"] = min(params["max_new_tokens"], room)
    out = await generate_tokens(args, ids, params)
    sample.tokens = ids + out.token_ids
    sample.response_length = len(out.token_ids)
    sample.response = out.text
    sample.rollout_log_probs = out.log_probs
    sample.loss_mask = [1] * len(out.token_ids)
    sample.status = FINISH_TO_STATUS.get(out.finish_type, Sample.Status.COMPLETED)
    sample.metadata["finish_reason"] = out.finish_type
    if out.weight_version is not None:
        sample.weight_versions.append(str(out.weight_version))
    return sample


async def _generate_one(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> list[Sample]:
    fn = load_function(args.custom_generate_function_path, "--custom-generate-function-path") \
        if args.custom_generate_function_path else generate
    try:
        out = await fn(args, sample, dict(sampling_params))
    except HttpError as e:
        # The retry budget is spent: report the sample as FAILED instead of failing the rollout.
        sample.status = Sample.Status.FAILED
        sample.metadata["error"] = str(e)
        sample.tokens, sample.response_length, sample.loss_mask, sample.rollout_log_probs = \
            prompt_ids(args, sample), 0, [], []
        out = sample
    samples = out if isinstance(out, list) else [out]
    PROGRESS.done += len(samples)
    PROGRESS.response_tokens += sum(s.response_length for s in samples)
    return samples


async def generate_and_rm_group(args: Any, group: list[Sample], sampling_params: dict[str, Any],
                                evaluation: bool = False) -> list[Sample]:
    """Generate every sample of a group concurrently, then reward the ones that need it."""
    results = await asyncio.gather(*(_generate_one(args, s, sampling_params) for s in group))
    samples = [s for r in results for s in r]
    scorable = [s for s in samples if s.status not in (Sample.Status.ABORTED, Sample.Status.FAILED)]
    if getattr(args, "group_rm", False) and not evaluation:
        if scorable:
            for s, r in zip(scorable, await batched_async_rm(args, scorable)):
                s.reward = r
    else:
        todo = [s for s in scorable if s.reward is None]
        for s, r in zip(todo, await asyncio.gather(*(async_rm(args, s) for s in todo))):
            s.reward = r
    for s in samples:
        if s.reward is None:
            s.reward = 0.0
    return samples


async def abort_engines(args: Any) -> None:
    """Ask every engine to abort its in-flight requests (the router does not proxy abort)."""
    urls = getattr(args, "rollout_engine_urls", None) or []
    await asyncio.gather(*(post(f"{u}/abort_request", {"abort_all": True}, timeout=10) for u in urls),
                         return_exceptions=True)


def _reset(sample: Sample) -> Sample:
    """Back to a fresh prompt, so a recycled group is generated from scratch."""
    ids = sample.tokens[: sample.prompt_length] if sample.response_length else sample.tokens
    sample.tokens, sample.response, sample.response_length = ids, "", 0
    sample.loss_mask = sample.rollout_log_probs = None
    sample.reward, sample.status = None, Sample.Status.PENDING
    return sample


async def generate_rollout_async(args: Any, rollout_id: int, data_source: DataSource) -> RolloutFnTrainOutput:
    target = args.rollout_batch_size
    state = GenerateState.get(args)
    retries_before, failures_before = state.stats.total_retries, state.stats.failures
    PROGRESS.reset(target * args.n_samples_per_prompt)
    params = sampling_params_from_args(args)
    filter_fn = load_function(args.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path") \
        if args.dynamic_sampling_filter_path else None
    start = time.monotonic()
    kept: list[list[Sample]] = []
    dropped: dict[str, int] = {}
    pending: dict[asyncio.Task, list[Sample]] = {}
    handed: dict[asyncio.Task, list[Sample]] = {}  # every group this rollout took from the data source
    settled: set[asyncio.Task] = set()  # dropped by the filter, or already back in the buffer
    try:
        while len(kept) < target:
            if len(kept) + len(pending) < target:
                n = args.over_sampling_batch_size if filter_fn else target - len(kept) - len(pending)
                for g in data_source.get_samples(n):
                    task = asyncio.ensure_future(generate_and_rm_group(args, g, params))
                    pending[task] = handed[task] = g
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                pending.pop(task)
                group = task.result()
                if filter_fn is not None and len(kept) < target:
                    verdict = apply_filter(filter_fn, args, group)
                    if not verdict.keep:
                        settled.add(task)
                        dropped[verdict.reason or "filtered"] = dropped.get(verdict.reason or "filtered", 0) + 1
                        if sum(dropped.values()) > MAX_DROPPED_PER_KEPT * target:
                            raise RuntimeError(
                                f"--dynamic-sampling-filter-path dropped {sum(dropped.values())} groups "
                                f"({dropped}) while collecting {target}; the filter rejects (almost) everything")
                        continue
                if len(kept) < target:
                    kept.append(group)
                else:
                    settled.add(task)
                    data_source.add_samples([[_reset(s) for s in handed[task]]])
    except BaseException:
        # the rollout failed (e.g. a reward function raised): its prompts go back, not lost
        back = [g for t, g in handed.items() if t not in settled and t not in pending]
        data_source.add_samples([[_reset(s) for s in g] for g in back])
        raise
    finally:
        if pending:
            await abort_engines(args)
            leftovers = await asyncio.gather(*pending, return_exceptions=True)
            data_source.add_samples([[_reset(s) for s in g] for g in pending.values()])
            logger.info("rollout %d: %d leftover group(s) aborted and returned to the buffer", rollout_id,
                        len(leftovers))
        PROGRESS.running = False
    elapsed = time.monotonic() - start
    samples = [s for g in kept for s in g]
    tokens = sum(s.response_length for s in samples)
    metrics = {"perf/rollout_time": elapsed, "perf/tokens_per_s": tokens / max(elapsed, 1e-9),
               "perf/engine_retries": state.stats.total_retries - retries_before,
               "perf/engine_failures": state.stats.failures - failures_before,
               **{f"rollout/dropped_groups_{k}": v for k, v in dropped.items()}}
    return RolloutFnTrainOutput(samples=kept, metrics=metrics)


_EVAL_CACHE: dict[str, list[Sample]] = {}


def eval_prompts(args: Any, name: str, path: str) -> list[Sample]:
    if name not in _EVAL_CACHE:
        tok = GenerateState.get(args).tokenizer if args.hf_checkpoint else None
        _EVAL_CACHE[name], _ = build_prompt_samples(args, path, args.eval_input_key or args.input_key,
                                                    args.eval_label_key or args.label_key, tok)
    return _EVAL_CACHE[name]


async def eval_rollout_async(args: Any, rollout_id: int) -> RolloutFnEvalOutput:
    params = sampling_params_from_args(args, evaluation=True)
    data: dict[str, dict[str, Any]] = {}
    start = time.monotonic()
    for name, path in args.eval_datasets:
        prompts = eval_prompts(args, name, path)
        source = DataSource(args, prompts, args.n_samples_per_eval_prompt)
        groups = source.get_samples(len(prompts))
        PROGRESS.reset(len(prompts) * args.n_samples_per_eval_prompt)
        results = await asyncio.gather(*(generate_and_rm_group(args, g, params, evaluation=True) for g in groups))
        samples = [s for g in results for s in g]
        data[name] = {"rewards": [s.get_reward_value(args) for s in samples],
                      "truncated": [s.status == Sample.Status.TRUNCATED for s in samples],
                      "samples": samples}
    PROGRESS.running = False
    return RolloutFnEvalOutput(data=data, metrics={"perf/eval_time": time.monotonic() - start})


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False):
    """slime's rollout-function contract (REFERENCE §3)."""
    if evaluation:
        return run(eval_rollout_async(args, rollout_id))
    return run(generate_rollout_async(args, rollout_id, data_source))
