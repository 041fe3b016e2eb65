"""Issue 20, items 1-6 and 9, through the real sglang-router: one engine answers badly, the rest are
healthy. A bad answer is retried onto a good one (fresh rid, no abort: the engine answered), or with
the budget spent the sample is FAILED naming the field; the rollout never raises, and no NaN or
out-of-vocabulary id reaches a sample."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
import math

import pytest

from slime.cli.args import parse_args
from slime.fleet.router import unregister_worker
from slime.rollout.data_source import DataSource
from slime.rollout.engine_client import EngineClient
from slime.rollout.runtime import RolloutRuntime, unbind
from slime.rollout.sglang_rollout import generate_rollout
from slime.testing.scripted_fleet import scripted_fleet
from slime.utils.async_utils import run
from slime.utils.endpoints import Endpoints
from slime.utils.types import Sample

GOOD = [7, 8, 9]
MAX_NEW = 5  # --rollout-max-response-len


def sglang(ids, lps, finish="stop", **meta):
    """An SGLang-shaped /generate answer with exactly these ids and log-probs."""
    return {
        "answer": {
            "text": "x",
            "output_ids": list(ids),
            "meta_info": {
                "id": "r",
                "finish_reason": {"type": finish, "matched": None},
                "weight_version": "default",
                "output_token_logprobs": [[lp, t, None] for lp, t in zip(lps, ids)],
                **meta,
            },
        }
    }


NAN, INF = float("nan"), float("inf")
FAULTS = {  # item: (the bad engine's answer, the field named in the reason)
    "1-truncated-json": ({"raw": '{"text": "x", "output_ids": [7, 8', "media_type": "application/json"}, "body"),
    "1-json-list": ({"answer": [7, 8, 9]}, "body"),
    "1-html-page": ({"raw": "<html><body>Service Unavailable</body></html>"}, "body"),
    "2-no-meta-info": ({"answer": {"text": "x", "output_ids": GOOD}}, "meta_info"),
    "3-nan-logprob": (sglang(GOOD, [-0.1, NAN, -0.1]), "logprob"),
    "3-minus-inf-logprob": (sglang(GOOD, [-0.1, -INF, -0.1]), "logprob"),
    "3-positive-logprob": (sglang(GOOD, [-0.1, 0.7, -0.1]), "logprob"),
    "3-null-logprob": (sglang(GOOD, [-0.1, None, -0.1]), "logprob"),
    "4-huge-id": (sglang([7, 10**9, 9], [-0.1] * 3), "token_id"),
    "4-negative-id": (sglang([7, -5, 9], [-0.1] * 3), "token_id"),
    "5-logprobs-shorter-than-ids": (
        {"answer": {**sglang(GOOD, [-0.1, -0.1])["answer"], "output_ids": GOOD}},
        "output_ids",
    ),
    "5-more-than-max-new-tokens": (sglang([7] * 11, [-0.1] * 11, "length"), "output_ids"),
    "unknown-finish-reason": (sglang(GOOD, [-0.1] * 3, "finished"), "finish_reason"),
}


CUT = {"cut": '{"text": "x", "output_ids": [7, 8'}  # item 6: the answer breaks off mid-way


class BadEngineScript:
    """While `faults` is set, answers them in turn (recording the reason each should be counted
    under) instead of a good answer."""

    def __init__(self):
        self.faults: list[str] = []
        self.served: Counter = Counter()

    def __call__(self, body):
        if not self.faults:
            return healthy(body)
        case = self.faults[sum(self.served.values()) % len(self.faults)]
        self.served["answer_cut" if case == "cut" else f"engine_bad_answer:{FAULTS[case][1]}"] += 1
        return CUT if case == "cut" else FAULTS[case][0]


def healthy(body):
    return {"output_ids": GOOD, "finish_type": "stop", "text": "7 8 9"}


@pytest.fixture(scope="module")
def fleet(tiny_model_dir):
    """Three scripted engines behind one real router; the first one is the misbehaving one."""
    bad = BadEngineScript()
    with scripted_fleet([bad, healthy, healthy], tiny_model_dir) as (router, engines):
        yield router, engines, bad


@pytest.fixture(scope="module")
def tok(tiny_tokenizer):
    return tiny_tokenizer  # the session's (tests/conftest.py): loaded once


def rollout(tmp_path, router, engines, tok, *extra, n_prompts=3):
    """One rollout of `n_prompts` x 2 samples through `router`; returns (samples, engine client)."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"input": f"question {i}", "label": "7 8 9"}) + "\n" for i in range(n_prompts)))
    args = parse_args(
        [
            "--rollout-backend",
            "hf",
            "--hf-checkpoint",
            tok.name_or_path,
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
            str(n_prompts),
            "--n-samples-per-prompt",
            "2",
            "--rollout-max-response-len",
            str(MAX_NEW),
            *extra,
        ]
    )
    client = EngineClient.from_args(args, Endpoints(router.url, [e.url for e in engines]), tokenizer=tok)
    client.retry_policy.base_delay = client.retry_policy.max_delay = 0.0  # nothing here waits on a clock
    runtime = RolloutRuntime(args, client).bind()
    try:
        out = generate_rollout(args, 0, DataSource.from_args(args, tok))  # the bound runtime (slime's 4 parameters)
    finally:
        run(client.close())
        unbind(runtime)
    return [s for g in out.samples for s in g], client


def assert_clean(samples, vocab_size):
    """What the trainer would get: every id inside the vocabulary, every log-prob a finite log(p)."""
    for s in samples:
        assert all(0 <= t < vocab_size for t in s.tokens)
        assert len(s.rollout_log_probs) == s.response_length
        assert all(math.isfinite(lp) and lp <= 0 for lp in s.rollout_log_probs)


def misbehave(engines, bad, faults):
    for e in engines:
        e.requests.clear()
        e.aborts.clear()
    bad.faults, bad.served = list(faults), Counter()


def test_bad_answers_of_every_kind_are_retried_onto_healthy_engines(tmp_path, fleet, tok):
    router, engines, bad = fleet
    misbehave(engines, bad, [*sorted(FAULTS), "cut"])
    try:
        samples, client = rollout(tmp_path, router, engines, tok, n_prompts=24)
    finally:
        bad.faults = []
    assert [s.status for s in samples] == [Sample.Status.COMPLETED] * 48
    assert all(s.tokens[-3:] == GOOD and s.rollout_log_probs == [-0.01, -0.02, -0.03] for s in samples)
    assert sum(bad.served.values()) > len(FAULTS), "the bad engine did not serve every kind of fault"
    assert client.stats.retries == bad.served and client.stats.failures == 0  # each counted by its field
    assert [e.aborts for e in engines] == [[], [], []]  # item 9: an answered request is aborted nowhere
    assert_clean(samples, client.vocab_size)


def test_with_the_budget_spent_samples_fail_with_the_field_and_an_excerpt(tmp_path, fleet, tok):
    router, engines, bad = fleet
    misbehave(engines, bad, ["1-json-list", "2-no-meta-info", "3-nan-logprob", "4-huge-id"])
    try:
        samples, client = rollout(tmp_path, router, engines, tok, "--request-max-retries", "0", n_prompts=6)
    finally:
        bad.faults = []
    failed = [s for s in samples if s.status == Sample.Status.FAILED]
    assert Counter(s.metadata["failure_reason"] for s in failed) == bad.served and failed
    for s in failed:
        field = s.metadata["failure_reason"].split(":")[1]
        assert f"bad engine answer ({field})" in s.metadata["error"]
        assert s.metadata["error"].endswith(f"(engine: one of 3 engines behind the router {router.url})")
        assert s.response_length == 0 and s.rollout_log_probs == []
    assert all(s.tokens[-3:] == GOOD for s in samples if s.status != Sample.Status.FAILED)
    assert_clean(samples, client.vocab_size)


def test_an_engine_that_cuts_its_answer_and_dies_is_reported_by_the_cut(tmp_path, fleet_of, tok):
    """Item 6: the fleet takes the dead engine out of the router, which then refuses with
    `503 no_available_workers`; the failure is still reported as the cut, naming the engine."""
    holder = {"arrived": 0}
    both_arrived = asyncio.Event()

    async def cut_and_die(body):
        # Both samples' first requests must reach the engine before it leaves the router: a request
        # sent after would see only the 503, and its sample would rightly fail as http_503.
        holder["arrived"] += 1
        if holder["arrived"] == 2:
            both_arrived.set()
        await asyncio.wait_for(both_arrived.wait(), 30)
        if not holder.get("gone"):
            holder["gone"] = True
            unregister_worker(holder["router"].url, holder["engine"].url)
        return CUT

    router, engines = fleet_of(cut_and_die, 1)
    holder.update(router=router, engine=engines[0])
    samples, client = rollout(
        tmp_path, router, engines, tok, "--request-retry-window", "2", "--request-max-retries", "1000", n_prompts=1
    )
    assert [s.metadata["failure_reason"] for s in samples] == ["answer_cut"] * 2
    error = samples[0].metadata["error"]
    assert "cause: answer_cut: " in error and "last: http_503: " in error and "no_available_workers" in error
    assert error.endswith(f"(engine: {engines[0].url})")
    assert client.stats.failure_reasons == {"answer_cut": 2} and client.stats.retries["http_503"] >= 1
