"""The default rollout function against scripted engines behind the real sglang-router:
exact token accounting, concurrency bound, classified retries, statuses, filters and buffer."""

from __future__ import annotations

import json
import threading

import pytest

from slime.testing.scripted_engine import default_log_prob
from slime.testing.scripted_fleet import scripted_fleet
from slime.rollout.data_source import DataSource
from slime.rollout.runtime import unbind
from slime.rollout.sglang_rollout import GenerateState
from slime.rollout.sglang_rollout import generate_rollout
from slime.cli.args import parse_args
from slime.utils.types import Sample


class Script:
    """Answers each prompt with ids derived from it, so the test can predict every token."""

    def __init__(self):
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.fail_next = 0
        self.calls = 0

    @staticmethod
    def expected(prompt_ids, max_new):
        n = min(3 + prompt_ids[-1] % 4, max_new)
        return [100 + (prompt_ids[-1] + i) % 50 for i in range(n)], ("length" if n == max_new else "stop")

    async def __call__(self, body):
        import asyncio

        from fastapi import HTTPException

        with self.lock:
            self.calls += 1
            if self.fail_next:
                self.fail_next -= 1
                raise HTTPException(status_code=503, detail="engine restarting")
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.01)
            ids, finish = self.expected(body["input_ids"], body["sampling_params"]["max_new_tokens"])
            return {"output_ids": ids, "finish_type": finish, "text": " ".join(map(str, ids))}
        finally:
            with self.lock:
                self.in_flight -= 1


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    script = Script()
    with scripted_fleet([script, script], tiny_model_dir) as (router, engines):
        yield router, engines, script


def make_args(tmp_path, router, tiny_model_dir, *extra):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"question number {i}", "label": str(i)}) + "\n" for i in range(10)))
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            str(tiny_model_dir),
            "--prompt-data",
            str(data),
            "--label-key",
            "label",
            "--sglang-router-ip",
            router.host,
            "--sglang-router-port",
            str(router.port),
            "--rm-type",
            "exact",
            "--rollout-batch-size",
            "4",
            "--n-samples-per-prompt",
            "3",
            "--rollout-max-response-len",
            "5",
            *extra,
        ]
    )
    return args


def data_source(args, tok):
    return DataSource.from_args(args, tok), tok


def test_exact_tokens_masks_logprobs_and_statuses(tmp_path, cluster, tiny_model_dir, tiny_tokenizer):
    router, engines, script = cluster
    args = make_args(tmp_path, router, tiny_model_dir)
    src, tok = data_source(args, tiny_tokenizer)
    out = generate_rollout(args, 0, src)
    groups = out.samples
    assert [len(g) for g in groups] == [3, 3, 3, 3]
    for g in groups:
        assert len({s.group_index for s in g}) == 1
        for s in g:
            prompt = tok(s.prompt, add_special_tokens=False)["input_ids"]
            ids, finish = Script.expected(prompt, 5)
            assert s.tokens == prompt + ids
            assert s.response_length == len(ids) and s.loss_mask == [1] * len(ids)
            assert s.rollout_log_probs == [default_log_prob(i) for i in range(len(ids))]
            assert s.status == (Sample.Status.TRUNCATED if finish == "length" else Sample.Status.COMPLETED)
            assert s.reward == 0.0 and s.response == " ".join(map(str, ids))
    assert sorted(s.index for g in groups for s in g) == list(range(12))
    # both engines served traffic through the router
    assert all(e.requests for e in engines)
    assert out.metrics["perf/engine_retries"] == 0


def test_concurrency_bound_holds(tmp_path, cluster, tiny_model_dir, tiny_tokenizer):
    router, _, script = cluster
    args = make_args(tmp_path, router, tiny_model_dir, "--sglang-server-concurrency", "2", "--rollout-batch-size", "6")
    src, _ = data_source(args, tiny_tokenizer)
    script.max_in_flight = 0
    generate_rollout(args, 0, src)
    assert script.max_in_flight == 2


def test_5xx_retried_and_counted_4xx_not(tmp_path, cluster, tiny_model_dir, tiny_tokenizer):
    router, _, script = cluster
    args = make_args(tmp_path, router, tiny_model_dir, "--rollout-batch-size", "1", "--n-samples-per-prompt", "1")
    src, _ = data_source(args, tiny_tokenizer)
    script.fail_next = 2
    out = generate_rollout(args, 0, src)
    assert out.metrics["perf/engine_retries"] == 2
    assert GenerateState.get(args).stats.retries["http_503"] >= 2
    assert out.samples[0][0].status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
    # a retry budget of 0 turns the same fault into a FAILED sample, reported with its error
    args.request_max_retries = 0
    unbind()  # a new runtime picks up the new retry budget
    script.fail_next = 1
    out = generate_rollout(args, 1, src)
    s = out.samples[0][0]
    assert s.status == Sample.Status.FAILED and "503" in s.metadata["error"]
    assert s.response_length == 0 and s.loss_mask == []


async def test_4xx_is_not_retried(cluster):
    from slime.utils.http_retry import HttpError, HttpStats, post

    router, _, _ = cluster
    stats = HttpStats()
    with pytest.raises(HttpError) as e:
        await post(f"{router.url}/generate", {"sampling_params": "not a dict"}, timeout=5, stats=stats)
    assert 400 <= e.value.status < 500 and stats.total_retries == 0


def test_max_context_len_caps_new_tokens(tmp_path, cluster, tiny_model_dir, tiny_tokenizer):
    router, engines, _ = cluster
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        "--rollout-max-context-len",
        "8",
        "--rollout-batch-size",
        "1",
        "--n-samples-per-prompt",
        "1",
    )
    src, tok = data_source(args, tiny_tokenizer)
    for e in engines:
        e.requests.clear()
    s = generate_rollout(args, 0, src).samples[0][0]
    assert len(s.tokens) == 8 and s.status == Sample.Status.TRUNCATED
    [sent] = [r for e in engines for r in e.requests]
    assert sent["input_ids"] == s.tokens[: s.prompt_length]
    assert sent["sampling_params"]["max_new_tokens"] == 8 - s.prompt_length


@pytest.mark.parametrize("deterministic", [True, False])
def test_deterministic_inference_seeds_each_sample_of_a_group(
    tmp_path, cluster, tiny_model_dir, deterministic, tiny_tokenizer
):
    """slime's `--sglang-enable-deterministic-inference`: the i-th sample of every group is sent with
    `sampling_seed = --rollout-seed + i`; without it no request names a seed."""
    router, engines, _ = cluster
    flags = ["--sglang-enable-deterministic-inference"] if deterministic else []
    args = make_args(tmp_path, router, tiny_model_dir, "--rollout-seed", "7", *flags)
    src, _ = data_source(args, tiny_tokenizer)
    for e in engines:
        e.requests.clear()
    generate_rollout(args, 0, src)
    seeds: dict[tuple[int, ...], list] = {}
    for r in (r for e in engines for r in e.requests):
        seeds.setdefault(tuple(r["input_ids"]), []).append(r["sampling_params"].get("sampling_seed"))
    assert len(seeds) == 4
    assert all(sorted(v, key=str) == ([7, 8, 9] if deterministic else [None] * 3) for v in seeds.values()), seeds


def test_dynamic_filter_keeps_target_and_returns_leftovers(tmp_path, cluster, tiny_model_dir, tiny_tokenizer):
    router, _, _ = cluster
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        "--rollout-batch-size",
        "2",
        "--over-sampling-batch-size",
        "4",
        "--n-samples-per-prompt",
        "2",
        "--dynamic-sampling-filter-path",
        "tests.test_rollout_scripted.keep_even_groups",
    )
    src, _ = data_source(args, tiny_tokenizer)
    out = generate_rollout(args, 0, src)
    assert len(out.samples) == 2
    assert all(g[0].group_index % 2 == 0 for g in out.samples)
    dropped = out.metrics.get("rollout/dropped_groups_odd", 0)
    # prompts never lost: kept + dropped + buffered = every group handed out
    handed = src.group_counter
    assert handed >= 4 and len(out.samples) + dropped + src.get_buffer_length() == handed
    odd_buffered = sum(g[0].group_index % 2 for g in src.buffer)
    assert dropped + odd_buffered == handed // 2
    for g in src.buffer:
        assert all(s.status == Sample.Status.PENDING and s.response_length == 0 for s in g)


def keep_even_groups(args, group):
    from slime.rollout.base_types import DynamicFilterOutput

    keep = group[0].group_index % 2 == 0
    return DynamicFilterOutput(keep=keep, reason=None if keep else "odd")


def test_slime_style_module_runs_unchanged(tmp_path, cluster, tiny_model_dir, tiny_tokenizer):
    from slime.rollout.controller import flatten_groups
    from slime.utils.misc import load_function

    router, _, _ = cluster
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        "--rollout-function-path",
        "tests.plugins.slime_style_rollout.generate_rollout",
    )
    src, tok = data_source(args, tiny_tokenizer)
    fn = load_function(args.rollout_function_path, "--rollout-function-path")
    samples, _ = flatten_groups(fn(args, 0, src))
    assert len(samples) == 12 and all(s.metadata["custom"] for s in samples)
    s = samples[0]
    prompt = tok(s.prompt, add_special_tokens=False)["input_ids"]
    assert s.tokens == prompt + Script.expected(prompt, 5)[0]


def test_failed_rollout_returns_its_prompts_to_the_buffer(tmp_path, cluster, tiny_model_dir, tiny_tokenizer):
    router, _, _ = cluster
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        "--custom-generate-function-path",
        "tests.test_rollout_scripted.broken_generate",
        "--rollout-batch-size",
        "3",
        "--n-samples-per-prompt",
        "2",
    )
    src, _ = data_source(args, tiny_tokenizer)
    with pytest.raises(ZeroDivisionError):
        generate_rollout(args, 0, src)
    assert src.group_counter == 3 and src.get_buffer_length() == 3
    assert sorted(g[0].group_index for g in src.buffer) == [0, 1, 2]
    assert all(s.response_length == 0 and s.status == Sample.Status.PENDING for g in src.buffer for s in g)


async def broken_generate(args, sample, sampling_params):
    """A custom generate function with a bug: the rollout fails (unlike a reward bug, which fails one sample)."""
    from slime.rollout.sglang_rollout import generate

    if sample.group_index == 1:
        raise ZeroDivisionError("generate bug")
    return await generate(args, sample, sampling_params)


# ---- slime's rollout hooks, each called where slime calls it ----
CALLS: dict[str, list] = {}


def tag_hook(args, sample, *, rollout_id=None):
    CALLS.setdefault("hook", []).append((sample.index, rollout_id))
    sample.metadata["hooked"] = rollout_id


def remove_odd_groups(args, groups):
    CALLS["filter"] = [g[0].group_index for g in groups]
    for g in groups:
        for s in g:
            s.remove_sample = g[0].group_index % 2 == 1


def record_all(args, all_groups, data_source):
    CALLS["all"] = sorted(g[0].group_index for g in all_groups)


def take_last(args, rollout_id, buffer, num_groups):
    taken = buffer[-num_groups:]
    del buffer[-num_groups:]
    return taken


def custom_log(rollout_id, args, samples, metrics, seconds):
    CALLS["log"] = (rollout_id, len(samples))
    return True


def custom_eval_log(rollout_id, args, data, extra_metrics):
    CALLS["eval_log"] = (rollout_id, {name: len(d["rewards"]) for name, d in data.items()})
    return True


class CountingSource:
    """A data source class given by --data-source-path (built as cls(args), as slime does)."""

    def __init__(self, args):
        from slime.rollout.data_source import DataSource

        self.inner = DataSource.from_args(args, None)
        CALLS["source"] = True

    def __len__(self):
        return len(self.inner)

    def get_samples(self, n):
        return self.inner.get_samples(n)

    def add_samples(self, groups):
        self.inner.add_samples(groups)


def test_slime_hooks_are_called_where_slime_calls_them(tmp_path, cluster, tiny_model_dir):
    from slime.rollout.controller import RolloutController
    from slime.utils.endpoints import Endpoints

    router, engines, _ = cluster
    me = "tests.test_rollout_scripted."
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        "--rollout-sample-hook-path",
        me + "tag_hook",
        "--rollout-sample-filter-path",
        me + "remove_odd_groups",
        "--rollout-all-samples-process-path",
        me + "record_all",
        "--dynamic-sampling-filter-path",
        me + "keep_even_groups",
        "--over-sampling-batch-size",
        "6",
        "--custom-rollout-log-function-path",
        me + "custom_log",
        "--data-source-path",
        me + "CountingSource",
        "--rollout-batch-size",
        "2",
        "--eval-prompt-data",
        "held_out",
        str(tmp_path / "prompts.jsonl"),
        "--custom-eval-rollout-log-function-path",
        me + "custom_eval_log",
    )
    CALLS.clear()
    controller = RolloutController(args, Endpoints(router.url, [e.url for e in engines]))
    try:
        batch = controller.generate(5)
        assert "eval_log" not in CALLS
        controller.eval(5)
    finally:
        controller.close()
    assert CALLS["source"] is True and CALLS["log"] == (5, 6)
    assert CALLS["eval_log"] == (5, {"held_out": 10})  # the eval's own log function, with its data
    # the sample hook saw every generated sample, with the rollout id
    assert len(CALLS["hook"]) >= 6 and {rid for _, rid in CALLS["hook"]} == {5}
    # the sample filter saw exactly the kept (even) groups, in index order; the all-samples hook saw every
    # finished group, the dropped odd ones included (which groups finish first depends on timing)
    kept = CALLS["filter"]
    assert len(kept) == 2 and kept == sorted(kept) and all(g % 2 == 0 for g in kept)
    assert set(kept) <= set(CALLS["all"]) and all(g not in kept for g in CALLS["all"] if g % 2)
    assert batch["loss_masks"] == [[1] * n for n in batch["response_lengths"]]  # even groups: kept trainable


def test_two_rollouts_at_once_each_see_their_own_rollout_id(tmp_path, cluster, tiny_model_dir, tiny_tokenizer):
    """Two rollouts generated at the same time on one runtime (as two rollout functions may be, or a rollout and
    an eval): every segment and every sample hook of each records its own id, never the other's."""
    import asyncio

    from slime.rollout.flags import RolloutRunConfig
    from slime.rollout.rollout_loop import collect_rollout
    from slime.rollout.sglang_rollout import generate_and_rm_group
    from slime.utils.async_utils import run

    router, _, _ = cluster
    args = make_args(
        tmp_path,
        router,
        tiny_model_dir,
        "--rollout-sample-hook-path",
        "tests.test_rollout_scripted.tag_hook",
        "--rollout-batch-size",
        "3",
    )
    first, _ = data_source(args, tiny_tokenizer)
    second, _ = data_source(args, tiny_tokenizer)

    async def both():
        return await asyncio.gather(
            collect_rollout(RolloutRunConfig.from_args(args), args, 7, first, generate_and_rm_group),
            collect_rollout(RolloutRunConfig.from_args(args), args, 8, second, generate_and_rm_group),
        )

    CALLS.clear()
    outs = run(both())
    for rollout_id, out in zip((7, 8), outs):
        samples = [s for g in out.samples for s in g]
        assert len(samples) == 9
        assert {seg["rollout_id"] for s in samples for seg in s.metadata["segments"]} == {rollout_id}
        assert {s.metadata["hooked"] for s in samples} == {rollout_id}
    assert sorted(rid for _, rid in CALLS["hook"]) == [7] * 9 + [8] * 9


def test_buffer_filter_path_chooses_from_the_buffer(tmp_path, cluster, tiny_model_dir, tiny_tokenizer):
    router, _, _ = cluster
    args = make_args(tmp_path, router, tiny_model_dir, "--buffer-filter-path", "tests.test_rollout_scripted.take_last")
    src, _ = data_source(args, tiny_tokenizer)
    groups = src.get_samples(3)
    src.add_samples(groups)
    assert [g[0].group_index for g in src.get_samples(1)] == [2]
    assert [g[0].group_index for g in src.get_samples(2)] == [0, 1]
