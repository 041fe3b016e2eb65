"""The default rollout function, at slime's path `slime.rollout.sglang_rollout.generate_rollout`.

Groups are generated concurrently through the router (bounded by `--sglang-server-concurrency`),
each sample token-in/token-out: `tokens` = prompt ids + exactly the ids the engine returned,
with their log-probs and a loss mask of ones. Rewards are computed as soon as a group is done.
With a dynamic filter or `--over-sampling-batch-size` above `--rollout-batch-size`, more groups are
started than needed; once the target is met the rest is aborted on the engines, waited for at most
`--abort-timeout` seconds, and returned to the buffer, so nothing is lost: partial (to be continued,
`partial_rollout.py`) with `--partial-rollout`, else reset to its prompt (the tokens counted as wasted).

Every function has slime's signature (only `args`, no runtime parameter): the engine client,
progress and tool services are the process's bound runtime's (`slime.rollout.runtime.current`).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import logging
import time
import weakref
from contextlib import contextmanager
from typing import Any

from slime.rollout import partial_rollout as partial
from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.data_source import DataSource, build_prompt_samples
from slime.rollout.filter_hub.base_types import apply_filter, should_drop_dynamic_filter_output
from slime.rollout.rm_hub import async_rm, batched_async_rm
from slime.rollout.reward_check import reward_source, sample_name
from slime.rollout.runtime import RolloutRuntime, current
from slime.rollout.sample_hooks import apply_rollout_sample_hooks
from slime.utils.async_utils import run
from slime.utils.http_retry import HttpError
from slime.utils.misc import PluginLoadError, load_function
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

MAX_DROPPED_PER_KEPT = 50  # a filter that drops more than this many groups per wanted group is broken


class GenerateState:
    """slime's per-process generation state, for plugins that call `GenerateState(args)`.

    A compatibility view, not an owner: one per `RolloutRuntime` (like slime's singleton), kept in
    the runtime under "sglang_rollout.GenerateState". The tokenizer is the engine client's; the
    processor, sampling parameters and dp-rank counters are slime's; the semaphore is the plugin's
    own bound (`--sglang-server-concurrency` x engines, one per event loop), separate from the
    client's request bound, so a plugin that holds it and calls our `generate` never waits on itself.
    """

    def __new__(cls, args: Any = None) -> "GenerateState":
        rt = current(args)
        return rt.shared("sglang_rollout.GenerateState", lambda: cls._create(rt))

    @classmethod
    def _create(cls, rt: RolloutRuntime) -> "GenerateState":
        from slime.utils.endpoints import rollout_num_engines as get_rollout_num_engines

        self = object.__new__(cls)
        self.runtime, self.args = rt, rt.args
        # slime's keys, `stop`/`stop_token_ids` included (None when unset), as plugins read them
        self.sampling_params = {"stop": None, "stop_token_ids": None, **sampling_params_from_args(rt.args)}
        seed = getattr(rt.args, "rollout_seed", None)
        self.group_sampling_seeds = [(seed or 0) + i for i in range(int(getattr(rt.args, "n_samples_per_prompt", 1)))]
        self.plugin_concurrency = max(1, int(getattr(rt.args, "sglang_server_concurrency", 512) or 512)
                                      * max(1, get_rollout_num_engines(rt.args)))
        self._semaphores: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = \
            weakref.WeakKeyDictionary()
        self.dp_counts = [0] * int(getattr(rt.args, "sglang_dp_size", None) or 1)
        self.dp_rank = 0
        self.reset()
        return self

    def __init__(self, args: Any = None) -> None:  # state is set once in _create
        pass

    @classmethod
    def get(cls, args: Any = None) -> "GenerateState":
        return cls(args)

    @property
    def tokenizer(self):
        return self.runtime.client.tokenizer

    @property
    def processor(self):
        """slime's `load_processor(--hf-checkpoint)`: None for text-only models; loaded once."""
        from slime.utils.processing_utils import load_processor

        path = getattr(self.args, "hf_checkpoint", None)
        return self.runtime.shared("sglang_rollout.processor",
                                   lambda: load_processor(path, trust_remote_code=True) if path else None)

    @property
    def semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()  # asyncio primitives are loop-bound
        sem = self._semaphores.get(loop)
        if sem is None:
            sem = self._semaphores[loop] = asyncio.Semaphore(self.plugin_concurrency)
        return sem

    @property
    def stats(self):
        return self.runtime.client.stats

    @contextmanager
    def dp_rank_context(self):
        """slime's dp-rank balancing: yields the least-loaded data-parallel rank (ties: lowest)."""
        rank = min(range(len(self.dp_counts)), key=lambda i: (self.dp_counts[i], i))
        self.dp_counts[rank] += 1
        self.dp_rank = rank
        try:
            yield rank
        finally:
            self.dp_counts[rank] -= 1

    def reset(self) -> None:
        self.remaining_batch_size, self.pendings, self.aborted = 0, set(), False

    def submit_generate_tasks(self, groups: list[list[Sample]]) -> None:
        for group in groups:
            self.pendings.add(asyncio.ensure_future(
                generate_and_rm_group(self.args, group, dict(self.sampling_params))))
        self.remaining_batch_size += len(groups)


def get_model_url(args: Any, model_name: str = "default", endpoint: str = "/generate") -> str:
    """slime's helper: the URL of `endpoint` on `model_name`'s router (`args.sglang_model_routers`
    {name: (ip, port)} when set), else on the process's router."""
    routers = getattr(args, "sglang_model_routers", None)
    if routers and model_name in routers:
        ip, port = routers[model_name]
        return f"http://{ip}:{port}{endpoint}"
    return f"{current(args).client.router_url}{endpoint}"


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


def prompt_ids(args: Any, sample: Sample, runtime: RolloutRuntime | None = None) -> list[int]:
    """The prompt's token ids: pre-tokenised by the data source, else tokenised once here."""
    if sample.tokens and sample.response_length == 0:
        return list(sample.tokens)
    prompt = sample.prompt
    if not isinstance(prompt, (str, list)):
        raise TypeError(f"sample {sample.index}: the prompt is {type(prompt).__name__}, not text or messages; the "
                        "default generate cannot tokenise it (set --custom-generate-function-path to a function "
                        "that reads it)")
    tok = (runtime or current(args)).tokenizer
    if isinstance(prompt, list):
        prompt = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tok(prompt, add_special_tokens=False)["input_ids"]


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """Default per-sample generation: one engine call, token-in/token-out, the answer appended to the
    sample as one segment (`Sample.append_segment`). With `--partial-rollout` an ABORTED sample with a
    partial response is continued (see `partial_rollout`). The engine client is the process's
    runtime's (`current(args)`)."""
    runtime = current(args)
    continued = bool(getattr(args, "partial_rollout", False)) and sample.is_partial
    if continued:  # --partial-rollout: prompt + partial response, the remaining budget
        ids, params = partial.continuation_input(sample, sampling_params)
    else:
        ids, params = prompt_ids(args, sample, runtime), dict(sampling_params)
    if args.rollout_max_context_len is not None:
        room = args.rollout_max_context_len - len(ids)
        if room <= 0 and not continued:
            sample.start_response(ids)
            sample.status = Sample.Status.TRUNCATED
            sample.metadata["finish_reason"] = "prompt_fills_context"
            return sample
        params["max_new_tokens"] = min(params["max_new_tokens"], room)
    if params["max_new_tokens"] <= 0:  # a continued sample whose budget is spent
        sample.status = Sample.Status.TRUNCATED
        sample.metadata["finish_reason"] = "length"
        return sample
    if runtime.client.gate.closed:  # the rollout is aborting: no new request
        if not continued:
            sample.start_response(ids)
        sample.status = Sample.Status.ABORTED
        return sample
    out = await runtime.client.generate(ids, params)
    if not continued:
        sample.start_response(ids)
    return sample.append_segment(out.token_ids, out.log_probs, text=out.text or "", finish_reason=out.finish_type,
                                 weight_version=out.weight_version, rollout_id=runtime.rollout_id,
                                 continued=continued)


generate.supports_partial_rollout = True  # continues ABORTED samples from their tokens


def _accepts(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())


def generate_function(args: Any, sample: Sample) -> Any:
    """The sample's generate function: `Sample.generate_function_path` (an eval dataset's
    `custom_generate_function_path` sets it), else `--custom-generate-function-path`, else `generate`."""
    for where, path in (("Sample.generate_function_path", getattr(sample, "generate_function_path", None)),
                        ("--custom-generate-function-path", getattr(args, "custom_generate_function_path", None))):
        if path:
            try:
                return load_function(path)
            except PluginLoadError as e:
                raise PluginLoadError(f"{where}: {e}") from e
    return generate


async def _call_generate(args: Any, sample: Sample, sampling_params: dict[str, Any],
                         evaluation: bool) -> Sample | list[Sample]:
    fn = generate_function(args, sample)
    if fn is not generate and _accepts(fn, "evaluation"):
        return await fn(args, sample, dict(sampling_params), evaluation=evaluation)
    return await fn(args, sample, dict(sampling_params))


async def _generate_one(args: Any, sample: Sample, sampling_params: dict[str, Any],
                        evaluation: bool = False) -> list[Sample]:
    """Generate one sample through slime's `GenerateState` (its plugin bound, abort flag and dp-rank
    balancing), then apply the sample hooks. A plugin's own GenerateState stand-in has no runtime:
    then nothing is counted in the progress."""
    state = GenerateState(args)
    runtime = getattr(state, "runtime", None)
    partial_on = bool(getattr(args, "partial_rollout", False))
    if partial_on and not evaluation and partial.is_finished(args, sample):
        if runtime is not None:
            runtime.progress.on_samples(1)  # finished in an earlier rollout (its group was interrupted): kept
        return [sample]
    async with state.semaphore:
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return [sample]
        with state.dp_rank_context():
            try:
                out = await _call_generate(args, sample, sampling_params, evaluation)
            except HttpError as e:
                # The retry budget is spent: report the sample as FAILED instead of failing the rollout.
                mark_failed(sample, e.reason, str(e))
                sample.tokens, sample.response_length, sample.loss_mask, sample.rollout_log_probs = \
                    prompt_ids(args, sample, runtime), 0, [], []
                out = sample
    samples = out if isinstance(out, list) else [out]
    if partial_on and getattr(args, "mask_offpolicy_in_partial_rollout", False):
        for s in samples:
            if s.status in partial.FINISHED:
                partial.mask_offpolicy(s)
    rollout_id = runtime.rollout_id if runtime is not None else None
    samples = await apply_rollout_sample_hooks(args, samples, rollout_id=rollout_id, evaluation=evaluation)
    if runtime is not None:
        runtime.progress.on_samples(len(samples))
    return samples


def mark_failed(sample: Sample, reason: str, error: str) -> Sample:
    """FAILED, with a short reason (counted in the rollout's failure summary) and the full error."""
    sample.status = Sample.Status.FAILED
    sample.metadata["failure_reason"] = reason
    sample.metadata["error"] = error
    return sample


def _set_reward(args: Any, sample: Sample, reward: Any) -> None:
    """Keep the reward exactly as returned (numbers are checked when the batch is built,
    `reward_check`); a reward function that raised fails this sample alone."""
    if isinstance(reward, BaseException):
        error = f"{reward_source(args, sample)} raised on {sample_name(sample)}: {type(reward).__name__}: {reward}"
        mark_failed(sample, "reward_error", error)
        logger.warning("%s", error)
        return
    sample.reward = reward


async def _guarded(coro: Any) -> Any:
    """The coroutine's result, or the exception it raised (a reward bug costs one sample, not the rollout)."""
    try:
        return await coro
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - handed to _set_reward, which names the flag and sample
        return e


def _scorable(samples: list[Sample]) -> list[Sample]:
    return [s for s in samples if s.status not in (Sample.Status.ABORTED, Sample.Status.FAILED)]


async def _reward_each(args: Any, samples: list[Sample]) -> None:
    todo = [s for s in _scorable(samples) if s.reward is None]  # a custom generate may have set it
    for s, r in zip(todo, await asyncio.gather(*(_guarded(async_rm(args, s)) for s in todo))):
        _set_reward(args, s, r)


async def _reward_group(args: Any, samples: list[Sample]) -> None:
    """`--group-rm`: one call for the whole group; if it raises, each of its samples failed."""
    scorable = _scorable(samples)
    if not scorable:
        return
    rewards = await _guarded(batched_async_rm(args, scorable))
    if isinstance(rewards, BaseException):
        rewards = [rewards] * len(scorable)
    for s, r in zip(scorable, rewards):
        _set_reward(args, s, r)


def _group_rm(args: Any, evaluation: bool) -> bool:
    return bool(getattr(args, "group_rm", False)) and not evaluation


async def generate_and_rm_group(args: Any, group: list[Sample], sampling_params: dict[str, Any],
                                evaluation: bool = False) -> list[Sample]:
    """Generate every sample of a group concurrently, then reward the ones that need it (the whole
    group at once with `--group-rm`). A reward function that raises marks its sample FAILED (flag and
    sample named); what it returns is kept as it is."""
    if GenerateState(args).aborted:
        return group
    params = group_sampling_params(args, sampling_params, len(group))
    results = await asyncio.gather(*(_generate_one(args, s, p, evaluation) for s, p in zip(group, params)))
    samples = [s for r in results for s in r]
    await (_reward_group if _group_rm(args, evaluation) else _reward_each)(args, samples)
    for s in samples:
        if s.status == Sample.Status.FAILED:
            s.reward = 0.0  # never None or NaN in a batch; FAILED samples train nothing anyway
    return samples


def group_sampling_params(args: Any, sampling_params: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """slime's `--sglang-enable-deterministic-inference`: the i-th sample of every group is sampled
    with `sampling_seed = --rollout-seed + i` (the same seeds in every group and in eval), so a run
    repeats its samples; otherwise every sample shares the flags' parameters."""
    if not getattr(args, "sglang_enable_deterministic_inference", False):
        return [sampling_params] * n
    seed = int(getattr(args, "rollout_seed", 42) or 0)
    return [{**sampling_params, "sampling_seed": seed + i} for i in range(n)]


async def generate_and_rm(args: Any, sample: Sample, sampling_params: dict[str, Any],
                          evaluation: bool = False) -> Sample | list[Sample]:
    """slime's per-sample step: generate (the sample's or the flag's custom function, else `generate`)
    through `GenerateState`, then reward unless aborted, failed or `--group-rm` (the group does it)."""
    samples = await _generate_one(args, sample, sampling_params, evaluation)
    if not _group_rm(args, evaluation):
        await _reward_each(args, samples)
    return samples if len(samples) != 1 else samples[0]


async def abort(args: Any, rollout_id: int) -> None:
    """slime's name: abort every in-flight request on every engine (the router does not proxy abort;
    without a fleet the engines are the router's workers)."""
    await current(args).client.abort_all()


def _reset(sample: Sample) -> Sample:
    """Back to a fresh prompt, so a recycled group is generated from scratch."""
    partial.reset_sample(sample)
    return sample


class _Leftovers:
    """Where the groups a rollout does not keep go, and what that cost (the rollout's abort metrics).

    With `--partial-rollout` an interrupted group goes back as it is (finished samples kept, unfinished
    ones ABORTED with their partial response); without it, to its prompt, its tokens counted as wasted.
    A group whose generation was cancelled (past `--abort-timeout`) or failed goes back as the rollout
    took it (its snapshot, taken by `taken`); what it generated meanwhile is wasted.
    """

    def __init__(self, args: Any, rollout_id: int, data_source: Any):
        self.args, self.rollout_id, self.data_source = args, rollout_id, data_source
        self.partial = bool(getattr(args, "partial_rollout", False))
        self.aborted_samples = self.wasted_tokens = self.requeued = self.continued = 0

    def taken(self, group: list[Sample]) -> list[Sample] | None:
        """A group handed out to generate: its snapshot, to put back as it was if its generation is
        cancelled or fails (None for fresh prompts); with --partial-rollout, its continuations counted."""
        if self.partial:
            self.continued += sum(partial.is_continuation(self.args, s) for s in group)
        return partial.snapshot(group)

    def finished(self, group: list[Sample], handed: list[Sample]) -> None:
        """A group whose generation ended but that the rollout does not keep."""
        self.aborted_samples += partial.unfinished(group)
        same = len(group) == len(handed) and all(a is b for a, b in zip(group, handed))
        if self.partial and same:
            self.data_source.add_samples([partial.keep_partial_group(group, self.rollout_id)])
        else:  # no partial rollout, or a custom function returned other samples (fan-out): start again
            self.wasted_tokens += sum(s.response_length for s in group)
            self.data_source.add_samples([[_reset(s) for s in handed]])

    def restore(self, group: list[Sample], before: list[Sample] | None, *, interrupted: bool) -> None:
        """A group whose generation was cancelled or failed: back as it was handed out."""
        if interrupted:
            self.aborted_samples += len(group) - sum(partial.is_finished(self.args, b) for b in before or [])
        back, wasted = partial.restore(group, before)
        self.wasted_tokens += wasted
        self.data_source.add_samples([back if self.partial else [_reset(s) for s in back]])

    def metrics(self, abort_time: float) -> dict[str, Any]:
        return {"rollout/aborted_samples": self.aborted_samples, "rollout/continued_samples": self.continued,
                "rollout/wasted_tokens": self.wasted_tokens, "perf/abort_time": abort_time}


async def _abort_leftovers(args: Any, runtime: RolloutRuntime, pending: dict[asyncio.Task, list[Sample]],
                           before: dict[asyncio.Task, list[Sample] | None], leftovers: _Leftovers) -> float:
    """Abort what is still generating, wait at most --abort-timeout for the engines' partial answers,
    cancel the rest; every group goes back to the buffer. Returns the seconds it took."""
    start = time.monotonic()
    gate = runtime.client.gate
    gate.close()  # no new request (a multi-turn sample between turns stops here)
    done: set[asyncio.Task] = set()
    late: set[asyncio.Task] = set(pending)
    try:
        done, late = await runtime.client.abort_until_settled(set(pending), getattr(args, "abort_timeout", None))
    finally:
        # even when the abort itself failed or was cancelled: nothing keeps running, every group goes back
        for task in late:
            task.cancel()
        try:
            await asyncio.gather(*late, return_exceptions=True)
        finally:
            gate.open()
            for task, group in pending.items():
                if task in done and not task.cancelled() and task.exception() is None:
                    leftovers.finished(task.result(), group)
                else:
                    leftovers.restore(group, before[task], interrupted=True)
    if late:
        logger.warning("rollout: %d group(s) did not answer the abort within --abort-timeout %ss; cancelled and "
                       "returned to the buffer as they were handed out", len(late), getattr(args, "abort_timeout", None))
    return time.monotonic() - start


async def generate_rollout_async(args: Any, rollout_id: int, data_source: DataSource) -> RolloutFnTrainOutput:
    """Generate groups until `--rollout-batch-size` are kept, `--over-sampling-batch-size` in flight
    (extra groups over-provision: the rollout stops as soon as its target is met); then abort the rest
    (bounded by `--abort-timeout`) and return it to the buffer, partial with `--partial-rollout`."""
    runtime = current(args)
    runtime.rollout_id = rollout_id  # segments record it
    runtime.client.gate.open()
    target = args.rollout_batch_size
    over = max(target, int(getattr(args, "over_sampling_batch_size", None) or target))
    stats = runtime.client.stats
    retries_before, failures_before = stats.total_retries, stats.failures
    params = sampling_params_from_args(args)
    filter_fn = load_function(args.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path") \
        if args.dynamic_sampling_filter_path else None
    start = time.monotonic()
    kept: list[list[Sample]] = []
    finished: list[list[Sample]] = []  # every group generated this rollout, dropped ones included
    dropped: dict[str, int] = {}
    pending: dict[asyncio.Task, list[Sample]] = {}
    handed_groups: dict[asyncio.Task, list[Sample]] = {}  # every group this rollout took from the data source
    before: dict[asyncio.Task, list[Sample] | None] = {}  # ... and its snapshot (None: fresh prompts)
    settled: set[asyncio.Task] = set()  # dropped by the filter, or already back in the buffer
    leftovers = _Leftovers(args, rollout_id, data_source)
    abort_time = 0.0
    try:
        while len(kept) < target:
            if len(kept) + len(pending) < target:
                # with a filter: a whole over-sampling batch (slime); without: top up to the over-sampling size
                n = over if filter_fn else over - len(kept) - len(pending)
                for g in data_source.get_samples(n):
                    task = asyncio.ensure_future(generate_and_rm_group(args, g, params))
                    pending[task] = handed_groups[task] = g
                    before[task] = leftovers.taken(g)
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                handed = pending.pop(task)
                group = task.result()
                if any(s.status == Sample.Status.ABORTED for s in group):
                    # an engine aborted it (not us): whole groups only, back it goes
                    settled.add(task)
                    leftovers.finished(group, handed)
                    leftovers.requeued += 1
                    if leftovers.requeued > MAX_DROPPED_PER_KEPT * target:
                        raise RuntimeError(f"the engines aborted {leftovers.requeued} groups while collecting "
                                           f"{target}; are they being released or updated in a loop?")
                    continue
                finished.append(group)
                if filter_fn is not None and len(kept) < target:
                    verdict = apply_filter(filter_fn, args, group)
                    # slime's keep_when_insufficient: a rejected group is kept when dropping it would
                    # leave fewer groups (kept + generating + this one) than the rollout needs
                    if should_drop_dynamic_filter_output(verdict, remaining_batch_size=len(kept) + len(pending) + 1,
                                                         target_data_size=target):
                        settled.add(task)
                        dropped[verdict.reason or "filtered"] = dropped.get(verdict.reason or "filtered", 0) + 1
                        if sum(dropped.values()) > MAX_DROPPED_PER_KEPT * target:
                            raise RuntimeError(
                                f"--dynamic-sampling-filter-path dropped {sum(dropped.values())} groups "
                                f"({dropped}) while collecting {target}; the filter rejects (almost) everything")
                        continue
                if len(kept) < target:
                    kept.append(group)
                else:  # finished after the target was met: kept for a later rollout (partial) or reset
                    settled.add(task)
                    leftovers.finished(group, handed)
    except BaseException:
        # the rollout failed (e.g. a reward function raised): its groups go back as they were handed out
        for task, snap in before.items():
            if task not in pending and task not in settled:
                leftovers.restore(handed_groups[task], snap, interrupted=False)
        raise
    finally:
        if pending:
            abort_time = await _abort_leftovers(args, runtime, pending, before, leftovers)
            logger.info("rollout %d: %d leftover group(s) aborted and returned to the buffer", rollout_id,
                        len(pending))
    kept.sort(key=lambda g: g[0].index if g and g[0].index is not None else 0)
    if getattr(args, "rollout_sample_filter_path", None):  # slime's hook: marks samples remove_sample
        load_function(args.rollout_sample_filter_path, "--rollout-sample-filter-path")(args, kept)
    if getattr(args, "rollout_all_samples_process_path", None):  # slime's hook: sees filtered groups too
        load_function(args.rollout_all_samples_process_path, "--rollout-all-samples-process-path")(
            args, finished, data_source)
    elapsed = time.monotonic() - start
    samples = [s for g in kept for s in g]
    tokens = sum(s.response_length for s in samples)
    metrics = {"perf/rollout_time": elapsed, "perf/tokens_per_s": tokens / max(elapsed, 1e-9),
               "perf/engine_retries": stats.total_retries - retries_before,
               "perf/engine_failures": stats.failures - failures_before,
               **leftovers.metrics(abort_time),
               **{f"rollout/dropped_groups_{k}": v for k, v in dropped.items()}}
    return RolloutFnTrainOutput(samples=kept, metrics=metrics)


def _dataset_setting(dataset: Any, field: str, default: Any) -> Any:
    """A per-dataset setting of `--eval-config` (an `EvalDatasetConfig` attribute), else `default`."""
    value = getattr(dataset, field, None)
    return default if value is None else value


def eval_prompts(args: Any, dataset: Any, runtime: RolloutRuntime) -> list[Sample]:
    """An eval set's prompts, read once per runtime; keyed by everything that shapes them (name, path
    with its row slice, keys), so two files or two key choices never share an entry."""
    name, path = dataset[0], dataset[1]
    input_key = _dataset_setting(dataset, "input_key", args.eval_input_key or args.input_key)
    label_key = _dataset_setting(dataset, "label_key", args.eval_label_key or args.label_key)

    def read() -> list[Sample]:
        tok = runtime.tokenizer if args.hf_checkpoint else None
        generate = getattr(dataset, "custom_generate_function_path", None)  # (its prompts are read by its generate)
        reader = args if generate is None else \
            argparse.Namespace(**{**vars(args), "custom_generate_function_path": generate})
        prompts, _ = build_prompt_samples(reader, path, input_key, label_key, tok)
        inject = getattr(dataset, "inject_metadata", None)
        if inject is not None:  # per-dataset rm_type / metadata_overrides
            for p in prompts:
                p.metadata = inject(p.metadata)
        return prompts

    return runtime.shared(f"eval_prompts:{(name, path, input_key, label_key)!r}", read)


def eval_sampling_params(args: Any, dataset: Any) -> dict[str, Any]:
    params = sampling_params_from_args(args, evaluation=True)
    for field, key in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                       ("max_response_len", "max_new_tokens"), ("stop", "stop"), ("stop_token_ids", "stop_token_ids"),
                       ("min_new_tokens", "min_new_tokens")):
        value = getattr(dataset, field, None)
        if value is not None:
            params[key] = list(value) if isinstance(value, (list, tuple)) else value
    return params


def eval_reward(args: Any, sample: Sample) -> Any:
    """slime's eval reward: the reward, or its `--eval-reward-key` entry when it is a dict."""
    key = getattr(args, "eval_reward_key", None)
    return sample.reward[key] if key and isinstance(sample.reward, dict) else sample.reward


async def eval_rollout_single_dataset(args: Any, rollout_id: int, dataset: Any) -> dict[str, dict[str, Any]]:
    """slime's: one eval dataset, `{name: {"rewards", "truncated", "samples"}}`. Its settings come
    from the `EvalDatasetConfig` (else the flags); its `custom_generate_function_path` and
    `custom_rm_path` are set on every sample, so they replace the flags' for this dataset only."""
    runtime = current(args)
    name = dataset[0]
    prompts = eval_prompts(args, dataset, runtime)
    n = int(_dataset_setting(dataset, "n_samples_per_eval_prompt", args.n_samples_per_eval_prompt))
    groups = DataSource(args, prompts, n).get_samples(len(prompts))
    for s in (s for g in groups for s in g):
        s.generate_function_path = getattr(dataset, "custom_generate_function_path", None) or s.generate_function_path
        s.custom_rm_path = getattr(dataset, "custom_rm_path", None) or s.custom_rm_path
    params = eval_sampling_params(args, dataset)
    runtime.progress.reset(len(prompts) * n, phase="eval")
    results = await asyncio.gather(*(generate_and_rm_group(args, g, params, evaluation=True) for g in groups))
    samples = [s for g in results for s in g]
    return {name: {"rewards": [eval_reward(args, s) for s in samples],
                   "truncated": [s.status == Sample.Status.TRUNCATED for s in samples], "samples": samples}}


async def eval_rollout(args: Any, rollout_id: int) -> RolloutFnEvalOutput:
    """Every eval dataset (`--eval-prompt-data` / `--eval-config`), one after the other, each with its
    own settings."""
    data: dict[str, dict[str, Any]] = {}
    start = time.monotonic()
    for dataset in args.eval_datasets:
        data.update(await eval_rollout_single_dataset(args, rollout_id, dataset))
    return RolloutFnEvalOutput(data=data, metrics={"perf/eval_time": time.monotonic() - start})


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False):
    """slime's rollout-function contract (REFERENCE §3): exactly slime's four parameters. The engine
    client and progress come from the process's runtime (`runtime.current(args)`: the controller's,
    or one built from `--sglang-router-ip/--sglang-router-port`)."""
    if evaluation:
        return run(eval_rollout(args, rollout_id))
    return run(generate_rollout_async(args, rollout_id, data_source))
