"""The default rollout function and slime's generation seam, at slime's path `slime.rollout.sglang_rollout`.

Here live the names slime's plugins import and patch: `GenerateState` (per-process generation state)
and the sample/group step that goes through it (`generate_and_rm`, `generate_and_rm_group`: the sample's
or the flag's generate function, else `generate`, then the reward step), plus slime's entry points
(`generate_rollout`, `eval_rollout`, `abort`). The steps themselves are one idea a file:
`default_generate` (one engine call), `sampling_params` (flags, per-sample seeds), `reward_step`,
`rollout_loop` (the over-sampling loop; its `leftovers` go back to the buffer), `evaluation`.
Every function has slime's signature (only `args`, no runtime parameter): the engine client,
progress and tool services are the process's bound runtime's (`slime.rollout.runtime.current`).
"""

from __future__ import annotations

import asyncio
import inspect
import time
import weakref
from typing import Any

from slime.rollout import partial_rollout as partial
from slime.rollout.base_types import RolloutFnEvalOutput, RolloutFnTrainOutput
from slime.rollout.data_source import DataSource
from slime.rollout.default_generate import generate, prompt_ids
from slime.rollout.evaluation import eval_prompts, eval_reward, eval_sampling_params, evaluate_dataset
from slime.rollout.failures import mark_failed
from slime.rollout.reward_step import group_rm_applies, reward_each, reward_group
from slime.rollout.rollout_loop import MAX_DROPPED_PER_KEPT, collect_rollout
from slime.rollout.runtime import RolloutRuntime, config_for, current, reread_config
from slime.rollout.sample_hooks import apply_rollout_sample_hooks
from slime.rollout.sampling_params import group_sampling_params, sampling_params_from_args
from slime.utils.async_utils import run
from slime.utils.http_retry import HttpError
from slime.utils.misc import PluginLoadError, load_function
from slime.utils.types import Sample
from slime.utils.plugin_args import completed

# every name slime's plugins and our modules import from here (the ones defined elsewhere re-exported)
__all__ = [
    "GenerateState",
    "MAX_DROPPED_PER_KEPT",
    "abort",
    "eval_prompts",
    "eval_reward",
    "eval_rollout",
    "eval_rollout_single_dataset",
    "eval_sampling_params",
    "generate",
    "generate_and_rm",
    "generate_and_rm_group",
    "generate_function",
    "generate_rollout",
    "generate_rollout_async",
    "get_model_url",
    "group_sampling_params",
    "load_function",
    "mark_failed",
    "prompt_ids",
    "sampling_params_from_args",
]


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
        seed = rt.args.rollout_seed
        self.group_sampling_seeds = [(seed or 0) + i for i in range(int(rt.args.n_samples_per_prompt))]
        self.plugin_concurrency = max(
            1, int(rt.args.sglang_server_concurrency) * max(1, get_rollout_num_engines(rt.args))
        )
        self._semaphores: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = (
            weakref.WeakKeyDictionary()
        )
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
        from slime.rollout.multimodal_prompt import shared_processor

        return shared_processor(self.runtime)

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

    def dp_rank_context(self) -> "_DpRank":
        """slime's dp-rank balancing: `with state.dp_rank_context() as rank:` holds the least-loaded
        data-parallel rank (ties: lowest) for the block."""
        return _DpRank(self)

    def reset(self) -> None:
        self.remaining_batch_size, self.pendings, self.aborted = 0, set(), False

    def submit_generate_tasks(self, groups: list[list[Sample]]) -> None:
        for group in groups:
            self.pendings.add(
                asyncio.ensure_future(generate_and_rm_group(self.args, group, dict(self.sampling_params)))
            )
        self.remaining_batch_size += len(groups)


class _DpRank:
    """The context of `GenerateState.dp_rank_context`: a plain class, entered once per sample."""

    __slots__ = ("state", "rank")

    def __init__(self, state: GenerateState) -> None:
        self.state = state

    def __enter__(self) -> int:
        counts = self.state.dp_counts
        rank = 0 if len(counts) == 1 else min(range(len(counts)), key=lambda i: (counts[i], i))
        counts[rank] += 1
        self.state.dp_rank = self.rank = rank
        return rank

    def __exit__(self, *exc: Any) -> None:
        self.state.dp_counts[self.rank] -= 1


_PROCESSOR_PROMPT_KEYS = ("input_ids", "attention_mask")  # the prompt itself, not inputs the trainer needs


def _prepare_prompt_ids(sample: Sample, tokenizer: Any, processor: Any) -> list[int]:
    """slime's private helper, imported by its `sglang_streaming_rollout`: the ids to send for `sample`.
    Its tokens when it has them (a pre-tokenised prompt, or prompt + partial response to continue);
    with images (or other media) and a processor, the processor's ids, its other outputs kept once as
    `multimodal_train_inputs`; else the prompt tokenised (messages through the chat template)."""
    media = {k: v for k, v in (sample.multimodal_inputs or {}).items() if v is not None}
    if sample.tokens and (sample.multimodal_train_inputs is not None or not media):
        return list(sample.tokens)
    if processor is not None and media:
        from slime.utils.processing_utils import build_processor_kwargs

        out = processor(text=sample.prompt, **build_processor_kwargs(sample.multimodal_inputs))
        if sample.multimodal_train_inputs is None:
            sample.multimodal_train_inputs = {k: v for k, v in out.items() if k not in _PROCESSOR_PROMPT_KEYS} or None
        return list(out["input_ids"][0])
    prompt = sample.prompt
    if isinstance(prompt, list):
        prompt = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(prompt, add_special_tokens=False)["input_ids"]


def get_model_url(args: Any, model_name: str = "default", endpoint: str = "/generate") -> str:
    """slime's helper: the URL of `endpoint` on `model_name`'s router (`args.sglang_model_routers`
    {name: (ip, port)} when set), else on the process's router."""
    routers = getattr(args, "sglang_model_routers", None)
    if routers and model_name in routers:
        ip, port = routers[model_name]
        return f"http://{ip}:{port}{endpoint}"
    return f"{current(args).client.router_url}{endpoint}"


def _accepts(fn: Any, name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params.values())


def generate_function(args: Any, sample: Sample) -> Any:
    """The sample's generate function: `Sample.generate_function_path` (an eval dataset's
    `custom_generate_function_path` sets it), else `--custom-generate-function-path`, else `generate`."""
    own, flag = getattr(sample, "generate_function_path", None), args.custom_generate_function_path
    if not own and not flag:  # the default rollout's case, on every sample
        return generate
    for where, path in (("Sample.generate_function_path", own), ("--custom-generate-function-path", flag)):
        if path:
            try:
                return load_function(path)
            except PluginLoadError as e:
                raise PluginLoadError(f"{where}: {e}") from e
    return generate


class GenerateTimeout(TimeoutError):
    """A custom generate function that did not return within --custom-generate-timeout."""


async def _call_custom_generate(
    args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool, fn: Any
) -> Sample | list[Sample]:
    """A custom generate function `fn` (`generate_function`'s answer when it is not ours): it gets a copy of
    the params (and `evaluation` when it takes it) and runs within --custom-generate-timeout."""
    call = (
        fn(args, sample, dict(sampling_params), evaluation=evaluation)
        if _accepts(fn, "evaluation")
        else fn(args, sample, dict(sampling_params))
    )
    timeout = args.custom_generate_timeout
    try:
        return await asyncio.wait_for(call, timeout)
    except asyncio.TimeoutError:
        raise GenerateTimeout(
            f"the custom generate function ({getattr(fn, '__module__', '?')}."
            f"{getattr(fn, '__qualname__', fn)}) did not return within {timeout:g} s on sample "
            f"{sample.index} (--custom-generate-timeout)"
        ) from None


async def _generate_one(
    args: Any,
    sample: Sample,
    sampling_params: dict[str, Any],
    evaluation: bool = False,
    state: GenerateState | None = None,
) -> list[Sample]:
    """Generate one sample through slime's `GenerateState` (its plugin bound, abort flag and dp-rank
    balancing), then apply the sample hooks. A plugin's own GenerateState stand-in has no runtime:
    then nothing is counted in the progress. `state`: `GenerateState(args)`, looked up once by a caller
    generating a whole group."""
    if state is None:
        state = GenerateState(args)
    runtime = getattr(state, "runtime", None)
    partial_on = bool(args.partial_rollout)
    if partial_on and not evaluation and partial.is_finished(sample):
        if runtime is not None:
            runtime.progress.on_samples(1)  # finished in an earlier rollout (its group was interrupted): kept
        return [sample]
    async with state.semaphore:  # (a plugin's stand-in state may give any async context manager)
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return [sample]
        with state.dp_rank_context():
            try:
                fn = generate_function(args, sample)
                # ours is awaited directly (every engine request has its deadline and retry budget; it copies
                # the params): one coroutine frame less on every resume
                out = await (
                    fn(args, sample, sampling_params)
                    if fn is generate
                    else _call_custom_generate(args, sample, sampling_params, evaluation, fn)
                )
            except (HttpError, GenerateTimeout) as e:
                # The retry budget is spent, or the plugin's bound: the sample FAILED, the rollout goes on.
                mark_failed(sample, e.reason if isinstance(e, HttpError) else "generate_timeout", str(e))
                sample.tokens, sample.response_length, sample.loss_mask, sample.rollout_log_probs = (
                    prompt_ids(args, sample, runtime),
                    0,
                    [],
                    [],
                )
                out = sample
    samples = out if isinstance(out, list) else [out]
    if partial_on and args.mask_offpolicy_in_partial_rollout:
        for s in samples:
            if s.status in partial.FINISHED:
                partial.mask_offpolicy(s)
    if args.rollout_sample_hook_path:  # (checked here too: no coroutine per sample when there is none)
        samples = await apply_rollout_sample_hooks(args, samples, evaluation=evaluation)  # this rollout's id
    if runtime is not None:
        runtime.progress.on_samples(len(samples))
    return samples


async def generate_and_rm_group(
    args: Any, group: list[Sample], sampling_params: dict[str, Any], evaluation: bool = False
) -> list[Sample]:
    """Generate every sample of a group concurrently, then reward the ones that need it (the whole
    group at once with `--group-rm`). A reward function that raises marks its sample FAILED (flag and
    sample named); what it returns is kept as it is."""
    args = completed(args)
    state = GenerateState(args)
    if state.aborted:
        return group
    params = group_sampling_params(args, sampling_params, len(group))
    results = await asyncio.gather(*(_generate_one(args, s, p, evaluation, state) for s, p in zip(group, params)))
    samples = [s for r in results for s in r]
    await reward_group(config_for(args, getattr(state, "runtime", None)).rollout, args, samples, evaluation)
    return samples


async def generate_and_rm(
    args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
) -> Sample | list[Sample]:
    """slime's per-sample step: generate (the sample's or the flag's custom function, else `generate`)
    through `GenerateState`, then reward unless aborted, failed or `--group-rm` (the group does it)."""
    args = completed(args)
    state = GenerateState(args)
    samples = await _generate_one(args, sample, sampling_params, evaluation, state)
    config = config_for(args, getattr(state, "runtime", None)).rollout
    if not group_rm_applies(config, evaluation):
        await reward_each(config, args, samples)
    return samples if len(samples) != 1 else samples[0]


async def abort(args: Any, rollout_id: int) -> None:
    """slime's name: abort every in-flight request on every engine (the router does not proxy abort;
    without a fleet the engines are the router's workers)."""
    await current(args).client.abort_all()


async def generate_rollout_async(args: Any, rollout_id: int, data_source: DataSource) -> RolloutFnTrainOutput:
    """slime's name for the train rollout (`rollout_loop.collect_rollout`), each group through
    `generate_and_rm_group`."""
    args = completed(args)
    config = reread_config(args)  # the rollout's flags, read once a rollout
    return await collect_rollout(config, args, rollout_id, data_source, generate_and_rm_group)


async def eval_rollout_single_dataset(args: Any, rollout_id: int, dataset: Any) -> dict[str, dict[str, Any]]:
    """slime's: one eval dataset, `{name: {"rewards", "truncated", "samples"}}` (`evaluation.evaluate_dataset`),
    each group through `generate_and_rm_group`."""
    args = completed(args)
    config = reread_config(args)  # the eval set's flags, read once
    return await evaluate_dataset(config, args, rollout_id, dataset, generate_and_rm_group)


async def eval_rollout(args: Any, rollout_id: int) -> RolloutFnEvalOutput:
    """Every eval dataset (`--eval-prompt-data` / `--eval-config`), one after the other, each with its
    own settings."""
    args = completed(args)
    data: dict[str, dict[str, Any]] = {}
    start = time.monotonic()
    for dataset in args.eval_datasets:
        data.update(await eval_rollout_single_dataset(args, rollout_id, dataset))
    return RolloutFnEvalOutput(data=data, metrics={"perf/eval_time": time.monotonic() - start})


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False):
    """slime's rollout-function contract (REFERENCE §3): exactly slime's four parameters. The engine
    client and progress come from the process's runtime (`runtime.current(args)`: the controller's,
    or one built from `--sglang-router-ip/--sglang-router-port`)."""
    args = completed(args)
    if evaluation:
        return run(eval_rollout(args, rollout_id))
    return run(generate_rollout_async(args, rollout_id, data_source))
