"""Plugins written the way slime users write them (slime's imports only: `GenerateState`, `post`,
`Sample.append_response_tokens`, `batched_async_rm`, `args.context_parallel_size`, ...), run by the
default rollout function through the real sglang-router in front of a scripted engine, so every
token, mask, log-prob and reward below is known exactly. Also: the fully-async rollout at slime's
path, `GenerateState`'s slime attributes, and the stall guard that fails a rollout whose plugin
logs the same error forever."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import re
import threading

import pytest

from slime.cli.args import parse_args
from slime.rollout.data_source import DataSource
from slime.rollout.fully_async_rollout import generate_rollout_fully_async
from slime.rollout.progress import Progress
from slime.rollout.rm_hub import batched_async_rm
from slime.rollout.sglang_rollout import GenerateState, generate_rollout, get_model_url
from slime.rollout.stall_guard import RolloutStalledError, StallGuard
from slime.testing.replying_stack import replying_stack
from slime.testing.runtime import bind_runtime
from slime.testing.scripted_engine import default_log_prob
from slime.utils.async_utils import run
from slime.utils.http_utils import post
from slime.utils.types import Sample

HERE = __name__
CODE = "<code>print(1)</code>"


def reply(prompt: str) -> str:
    """What the scripted engine says, from what it is shown."""
    if "role: judge" in prompt:
        return "The best is \\boxed{3}"
    if "role: solver" in prompt:
        return "I think \\boxed{2}"
    if "<information>" in prompt:
        return "<answer>Paris</answer>"
    if "search task" in prompt:
        return "<search>capital of france</search>"
    if "retool task" in prompt:
        return CODE
    return "plain"


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    with replying_stack(str(tiny_model_dir), reply) as stack:
        yield stack


def make_args(tmp_path, router, model, rows, *extra):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(model),
            "--prompt-data",
            str(data),
            "--input-key",
            "prompt",
            "--label-key",
            "label",
            "--sglang-router-ip",
            router.host,
            "--sglang-router-port",
            str(router.port),
            "--rollout-batch-size",
            "2",
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            "32",
            *extra,
        ]
    )


def start(args, tok):
    runtime = bind_runtime(args, tokenizer=tok)
    return runtime, DataSource.from_args(args, tok)


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def sampled_log_probs(n):
    return [default_log_prob(i) for i in range(n)]


# --- a search-style multi-turn plugin (slime's search-r1 way) ---------------------------------


async def search_generate(args, sample: Sample, sampling_params) -> Sample:
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt_ids = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    sample.tokens, sample.loss_mask = list(prompt_ids), []
    for _ in range(3):
        out = await post(url, {"input_ids": sample.tokens, "sampling_params": sampling_params, "return_logprob": True})
        pairs = out["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(
            args,
            tokens=[p[1] for p in pairs],
            log_probs=[p[0] for p in pairs],
            trainable=True,
            meta_info=out["meta_info"],
            text=out["text"],
        )
        found = re.search(r"<search>(.*?)</search>", out["text"])
        if not found:
            break
        hits = await post(args.retriever_url, {"queries": [found.group(1)], "topk": 1, "return_scores": False})
        obs = f"\n<information>{hits['result'][0][0]['contents']}</information>\n"
        sample.append_response_tokens(
            args, tokens=state.tokenizer(obs, add_special_tokens=False)["input_ids"], trainable=False, text=obs
        )
    return sample


async def answer_reward(args, sample, **kwargs):
    found = re.search(r"<answer>(.*?)</answer>", sample.response)
    return 1.0 if found and found.group(1).strip() == sample.label else 0.0


def test_search_style_plugin_multi_turn_exact_tokens(tmp_path, cluster, tiny_model_dir):
    router, engine, retriever, tok = cluster
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        [{"prompt": "search task: capital?", "label": "Paris"}],
        "--custom-generate-function-path",
        f"{HERE}.search_generate",
        "--custom-rm-path",
        f"{HERE}.answer_reward",
        "--rollout-batch-size",
        "1",
    )
    args.retriever_url = retriever.url
    runtime, src = start(args, tok)
    before = len(retriever.requests)
    groups = generate_rollout(args, 0, src).samples
    turn1, turn2 = ids(tok, "<search>capital of france</search>"), ids(tok, "<answer>Paris</answer>")
    obs = ids(tok, "\n<information>Paris\nParis is the capital of France.</information>\n")
    [group] = groups
    assert len(group) == 2
    for s in group:
        assert s.tokens == ids(tok, "search task: capital?") + turn1 + obs + turn2
        assert s.response_length == len(turn1) + len(obs) + len(turn2)
        assert s.loss_mask == [1] * len(turn1) + [0] * len(obs) + [1] * len(turn2)
        assert s.rollout_log_probs == sampled_log_probs(len(turn1)) + [0.0] * len(obs) + sampled_log_probs(len(turn2))
        assert s.status == Sample.Status.COMPLETED and s.reward == 1.0
        assert s.response.endswith("<answer>Paris</answer>")
    assert [r["queries"] for r in retriever.requests[before:]] == [["capital of france"]] * 2
    # the plugin's own /generate posts count as engine traffic (2 turns x 2 samples)
    assert runtime.progress.responses == 4
    assert runtime.progress.tokens == 2 * (len(turn1) + len(turn2))


# --- a multi-agent plugin: several samples per prompt, rewarded with batched_async_rm ----------


async def multi_agent_generate(args, sample: Sample, sampling_params, evaluation=False) -> list[Sample]:
    url = get_model_url(args, "default", "/generate")
    tok = GenerateState(args).tokenizer

    async def agent(role: str) -> Sample:
        s = copy.deepcopy(sample)
        s.prompt = f"role: {role}\n{sample.prompt}"
        s.tokens = tok(s.prompt, add_special_tokens=False)["input_ids"]
        out = await post(url, {"input_ids": s.tokens, "sampling_params": sampling_params, "return_logprob": True})
        pairs = out["meta_info"]["output_token_logprobs"]
        s.append_response_tokens(
            args,
            tokens=[p[1] for p in pairs],
            log_probs=[p[0] for p in pairs],
            meta_info=out["meta_info"],
            text=out["text"],
        )
        return s

    samples = list(await asyncio.gather(agent("solver"), agent("solver"), agent("judge")))
    for s, r in zip(samples, await batched_async_rm(args, samples)):
        s.reward = r
    return samples


def test_multi_agent_plugin_returns_lists_rewarded_by_batched_rm(tmp_path, cluster, tiny_model_dir):
    router, engine, retriever, tok = cluster
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        [{"prompt": "what is 1+1?", "label": "2"}],
        "--custom-generate-function-path",
        f"{HERE}.multi_agent_generate",
        "--rm-type",
        "math",
        "--rollout-batch-size",
        "1",
    )
    start(args, tok)
    [group] = generate_rollout(args, 0, src := DataSource.from_args(args, tok)).samples
    assert src.get_buffer_length() == 0
    assert len(group) == 6  # 2 samples x 3 agents, all in the prompt's group
    by_role = sorted((s.prompt.split("\n")[0], s.reward) for s in group)
    assert by_role == [("role: judge", 0.0)] * 2 + [("role: solver", 1.0)] * 4
    for s in group:
        response = ids(tok, "The best is \\boxed{3}" if "judge" in s.prompt else "I think \\boxed{2}")
        assert s.tokens == ids(tok, s.prompt) + response
        assert s.loss_mask == [1] * len(response) and s.rollout_log_probs == sampled_log_probs(len(response))


# --- a retool-style plugin: context budget from --context-parallel-size x --max-tokens-per-gpu --


async def retool_generate(args, sample: Sample, sampling_params) -> Sample:
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    if args.rollout_max_context_len is not None:
        budget = args.rollout_max_context_len
    else:
        budget = args.context_parallel_size * args.max_tokens_per_gpu
    sample.tokens = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    while len(sample.tokens) < budget:
        params = {
            **sampling_params,
            "max_new_tokens": min(sampling_params["max_new_tokens"], budget - len(sample.tokens)),
        }
        out = await post(url, {"input_ids": sample.tokens, "sampling_params": params, "return_logprob": True})
        pairs = out["meta_info"]["output_token_logprobs"]
        sample.append_response_tokens(
            args,
            tokens=[p[1] for p in pairs],
            log_probs=[p[0] for p in pairs],
            meta_info=out["meta_info"],
            text=out["text"],
        )
        if out["meta_info"]["finish_reason"]["type"] == "length":
            break
        obs = state.tokenizer("\n<interpreter>1</interpreter>\n", add_special_tokens=False)["input_ids"]
        obs = obs[: budget - len(sample.tokens)]
        sample.append_response_tokens(args, tokens=obs, trainable=False)
    if len(sample.tokens) >= budget:
        sample.status = Sample.Status.TRUNCATED
    return sample


def test_retool_style_plugin_uses_context_parallel_budget(tmp_path, cluster, tiny_model_dir):
    router, engine, retriever, tok = cluster
    prompt = "retool task: compute"
    budget = 2 * 20
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        [{"prompt": prompt, "label": "1"}],
        "--custom-generate-function-path",
        f"{HERE}.retool_generate",
        "--rm-type",
        "math",
        "--rollout-batch-size",
        "1",
        "--n-samples-per-prompt",
        "1",
        "--context-parallel-size",
        "2",
        "--max-tokens-per-gpu",
        "20",
    )
    assert args.rollout_max_context_len is None
    start(args, tok)
    first = len(engine.requests)
    [[s]] = generate_rollout(args, 0, DataSource.from_args(args, tok)).samples
    code, obs = ids(tok, CODE), ids(tok, "\n<interpreter>1</interpreter>\n")
    expected, mask, rooms = ids(tok, prompt), [], []
    while len(expected) < budget:  # replay the budget arithmetic with the known token counts
        rooms.append(min(32, budget - len(expected)))
        take = code[: budget - len(expected)]
        expected, mask = expected + take, mask + [1] * len(take)
        if len(take) < len(code):
            break
        take = obs[: budget - len(expected)]
        expected, mask = expected + take, mask + [0] * len(take)
    assert s.tokens == expected and len(s.tokens) == budget
    assert s.loss_mask == mask and s.status == Sample.Status.TRUNCATED
    assert [r["sampling_params"]["max_new_tokens"] for r in engine.requests[first:]] == rooms


# --- the dynamic-sampling filter by slime's hub path -------------------------------------------


def test_filter_by_hub_path_keeps_only_groups_with_reward_spread(tmp_path, cluster, tiny_model_dir):
    router, engine, retriever, tok = cluster
    rows = [
        {"prompt": "role: solver A", "label": "2"},
        {"prompt": "role: solver B", "label": "7"},
        {"prompt": "role: judge C", "label": "3"},
    ]
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        rows,
        "--rm-type",
        "math",
        "--rollout-batch-size",
        "1",
        "--over-sampling-batch-size",
        "3",
        "--dynamic-sampling-filter-path",
        "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std",
    )
    start(args, tok)
    # every sample of a prompt gets the same reward: no group has a spread, the filter drops them
    # all, and the rollout stops with the filter named instead of sampling forever
    with pytest.raises(RuntimeError, match="dynamic-sampling-filter-path dropped"):
        generate_rollout(args, 0, DataSource.from_args(args, tok))


# --- GenerateState: slime's attributes over the process's runtime ------------------------------


def test_generate_state_is_the_runtime_view_with_slime_attributes(tmp_path, cluster, tiny_model_dir):
    router, engine, retriever, tok = cluster
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        [{"prompt": "x", "label": "1"}],
        "--rollout-stop",
        "</answer>",
        "--sglang-server-concurrency",
        "3",
    )
    runtime, _ = start(args, tok)
    state = GenerateState(args)
    assert GenerateState(args) is state and GenerateState() is state
    assert state.tokenizer is tok and state.processor is None  # text-only model
    assert state.sampling_params["stop"] == ["</answer>"] and state.sampling_params["stop_token_ids"] is None
    assert state.sampling_params["max_new_tokens"] == 32 and state.sampling_params["no_stop_trim"] is True
    assert (state.remaining_batch_size, state.pendings, state.aborted) == (0, set(), False)
    assert state.group_sampling_seeds == [args.rollout_seed, args.rollout_seed + 1]
    with state.dp_rank_context() as rank:
        assert rank == 0 and state.dp_counts == [1]
    assert state.dp_counts == [0]
    assert get_model_url(args, "default") == f"http://{router.host}:{router.port}/generate"

    async def bounded():
        sem = state.semaphore
        assert sem is state.semaphore and sem is not runtime.client.semaphore
        for _ in range(3):  # the plugin's own bound: sglang_server_concurrency x engines
            await sem.acquire()
        assert sem.locked()
        # holding all of it does not block our own generation (a separate bound)
        out = await runtime.client.generate(ids(tok, "plain"), {"max_new_tokens": 4})
        for _ in range(3):
            sem.release()
        return out.token_ids

    assert run(bounded()) == ids(tok, "plain")[:4]
    state.submit_generate_tasks([])
    assert state.remaining_batch_size == 0


# --- fully-async rollout at slime's path --------------------------------------------------------


async def failing_generate(args, sample, sampling_params):
    raise ValueError(f"plugin bug on {sample.prompt!r}")


def test_fully_async_rollout_keeps_the_pool_warm_and_fails_with_a_plugin_error(tmp_path, cluster, tiny_model_dir):
    router, engine, retriever, tok = cluster
    rows = [{"prompt": f"question {i}", "label": "1"} for i in range(6)]
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        rows,
        "--rm-type",
        "math",
        "--sglang-server-concurrency",
        "3",
        "--rollout-num-engines",
        "1",
    )
    start(args, tok)
    src = DataSource.from_args(args, tok)
    out0 = generate_rollout_fully_async(args, 0, src)
    assert [len(g) for g in out0.samples] == [2, 2]
    assert all(s.tokens == ids(tok, s.prompt) + ids(tok, "plain") for g in out0.samples for s in g)
    # the pool (3 groups) kept generating: what was left over is served first to the next rollout
    assert out0.metrics["rollout/fully_async_queue_left"] + out0.metrics["rollout/fully_async_in_flight"] == 3
    out1 = generate_rollout_fully_async(args, 1, src)
    seen = [g[0].prompt for g in out0.samples + out1.samples]
    assert len(set(seen)) == 4

    args2 = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        rows,
        "--custom-generate-function-path",
        f"{HERE}.failing_generate",
        "--rollout-batch-size",
        "1",
        "--sglang-server-concurrency",
        "1",
    )
    start(args2, tok)
    src2 = DataSource.from_args(args2, tok)
    with pytest.raises(ValueError, match="plugin bug on 'question"):
        generate_rollout_fully_async(args2, 0, src2)
    assert src2.get_buffer_length() == 1  # the failed group's prompt went back


# --- a rollout function that logs the same error forever fails with it -------------------------


def slime_style_stuck_rollout(args, rollout_id, data_buffer, evaluation=False):
    """Like slime's fully-async worker: a thread retries a failing step, logging each failure,
    while the rollout function waits for results that never come."""
    log = logging.getLogger("tests.stuck_worker")
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            try:
                data_buffer.get_samples(1)
            except Exception as e:  # noqa: BLE001 - the upstream pattern under test
                log.exception("worker loop iteration error: %s", e)
            stop.wait(0.02)

    threading.Thread(target=worker, daemon=True).start()

    async def wait_forever():
        await asyncio.Event().wait()

    try:
        return run(wait_forever())
    finally:
        stop.set()


class BrokenSource:
    def get_samples(self, n):
        raise AttributeError("'GenerateState' object has no attribute 'sampling_params'")


def test_stall_guard_fails_a_rollout_that_repeats_the_same_error():
    progress = Progress()
    guard = StallGuard(progress, repeats=5, min_seconds=0.0)
    with guard.installed(), pytest.raises(RolloutStalledError) as info:
        slime_style_stuck_rollout(None, 0, BrokenSource())
    assert "no attribute 'sampling_params'" in str(info.value) and "logged 5 times" in str(info.value)
    assert f"{__file__}:" in str(info.value)  # where it was raised
    assert isinstance(info.value.__cause__, AttributeError)
    assert guard not in logging.getLogger().handlers


def test_stall_guard_counts_only_errors_without_progress_in_between():
    progress = Progress()
    guard = StallGuard(progress, repeats=3, min_seconds=0.0)
    log = logging.getLogger("tests.flaky_worker")
    with guard.installed():
        for i in range(6):  # progress between failures: never trips
            try:
                raise ConnectionError("reward server unreachable")
            except ConnectionError:
                log.exception("attempt %d", i)
            progress.on_samples(1)
        assert not guard.tripped.done()
        log.warning("a warning without an exception is not an error")
        for _ in range(3):
            try:
                raise ConnectionError("reward server unreachable")
            except ConnectionError:
                log.exception("again")
        assert isinstance(guard.tripped.exception(), RolloutStalledError)
