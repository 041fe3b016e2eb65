"""slime's loss hooks in `slime-train` (`--custom-loss-function-path` with `--loss-type custom_loss`,
`--custom-pg-loss-reducer-function-path`, `--rollout-data-postprocess-path`), each with slime's call
shape, on the real `TrainWorker` (tiny model, a one-rank gloo group, in a Ray actor as slime-train runs it): each changes the
step's loss and the change is observed in the step's metrics and gradient. Each run builds a fresh worker of its own
command line in the session's train-worker host process (tests/train_worker_host.py)."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from slime.cli.honest_flags import ACTED_ON
from slime.cli.train import parse_train_args
from slime.ray.box import Box
from slime.train_batch.flags import TrainBatchConfig
from slime.train_batch.rank_batches import split_for_data_parallel

HOOK_FLAGS = ("custom_loss_function_path", "custom_pg_loss_reducer_function_path", "rollout_data_postprocess_path")


@pytest.fixture(scope="module")
def base(train_worker_host, tiny_model_dir, data_file) -> dict:
    """The same step with slime's default policy loss."""
    return _train(train_worker_host, tiny_model_dir, data_file)[0]


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text(json.dumps({"input": "hi", "label": "1"}) + "\n")
    return path


def _batch(n: int = 4, seed: int = 0) -> dict:
    """Two rollouts of two samples, rewards of both signs (a non-zero policy gradient)."""
    rng = random.Random(seed)
    batch = {
        k: []
        for k in (
            "tokens",
            "response_lengths",
            "total_lengths",
            "rewards",
            "raw_reward",
            "rollout_ids",
            "loss_masks",
            "rollout_log_probs",
            "rollout_mask_sums",
            "sample_indices",
        )
    }
    for i in range(n):
        prompt, resp = 3, 4 + i
        batch["tokens"].append([rng.randrange(1, 200) for _ in range(prompt + resp)])
        batch["response_lengths"].append(resp)
        batch["total_lengths"].append(prompt + resp)
        batch["rewards"].append(1.0 if i % 2 else -1.0)
        batch["raw_reward"].append(float(i % 2))
        batch["rollout_ids"].append(i // 2)
        batch["loss_masks"].append([1] * resp)
        batch["rollout_log_probs"].append([-1.0] * resp)
        batch["sample_indices"].append(i)
    sums: dict = {}
    for rid, m in zip(batch["rollout_ids"], batch["loss_masks"]):
        sums[rid] = sums.get(rid, 0) + sum(m)
    batch["rollout_mask_sums"] = [sums[r] for r in batch["rollout_ids"]]
    return batch


def _train(host, tiny_model_dir, data_file, *flags: str) -> tuple[dict, object]:
    from tests.train_worker_host import in_host

    argv = [
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--rollout-backend",
        "hf",
        "--prompt-data",
        str(data_file),
        "--label-key",
        "label",
        "--rollout-batch-size",
        "2",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "2",
        "--lr",
        "1e-3",
        *flags,
    ]
    ranks, _ = split_for_data_parallel(TrainBatchConfig.from_args(parse_train_args(argv)), _batch(), {"dp_size": 1})

    # in an actor process, as slime-train runs it: freeing a gloo group in the test process joins gloo's threads
    # while holding the GIL one of them may wait for (a deadlock seen in a whole-suite run)
    def body(make):
        import ray

        from tests.plugins import loss_hooks as hooks

        hooks.zero_pg_loss_reducer.calls.clear()  # what this run's reducer was given, not an earlier run's
        worker = make(argv)
        out = worker.train(0, [Box(ray.put(ranks[0]))])
        return out, _what_the_hooks_saw(worker)

    return in_host(host, body)


def _what_the_hooks_saw(worker) -> SimpleNamespace:
    """Run in the worker: what the hooks recorded there (on its args, and the reducer's calls)."""
    from tests.plugins import loss_hooks as hooks

    return SimpleNamespace(
        custom_loss_seen=getattr(worker.hooks.args, "custom_loss_seen", None),
        postprocess_seen=getattr(worker.hooks.args, "postprocess_seen", None),
        reducer_calls=list(hooks.zero_pg_loss_reducer.calls),
    )


def test_the_hooks_are_acted_on():
    assert set(HOOK_FLAGS) <= ACTED_ON


def test_custom_loss_replaces_the_policy_loss(train_worker_host, tiny_model_dir, data_file, base):
    out, args = _train(
        train_worker_host,
        tiny_model_dir,
        data_file,
        "--loss-type",
        "custom_loss",
        "--custom-loss-function-path",
        "tests.plugins.loss_hooks.custom_loss",
    )
    step = out["steps"][0]
    assert "pg_loss" in base["steps"][0] and "pg_loss" not in step
    assert step["custom_marker"] > 0  # the hook's own log values are the step's metrics
    assert step["loss"] == pytest.approx(step["custom_lse"]) and step["custom_lse"] > 0
    assert step["grad_norm"] > 0
    seen = args.custom_loss_seen
    assert {
        "advantages",
        "log_probs",
        "loss_masks",
        "response_lengths",
        "total_lengths",
        "unconcat_tokens",
        "rollout_log_probs",
    } <= set(seen["keys"])
    assert seen["logits_shape"][0] == sum(seen["response_lengths"])  # one logit row per response token


def test_custom_loss_type_needs_the_function(train_worker_host, tiny_model_dir, data_file):
    from slime.train.loss import LossConfigError

    with pytest.raises(LossConfigError, match="--custom-loss-function-path"):
        _train(train_worker_host, tiny_model_dir, data_file, "--loss-type", "custom_loss")


def test_pg_loss_reducer_reduces_pg_loss_alone(train_worker_host, tiny_model_dir, data_file, base):
    zero, zero_seen = _train(
        train_worker_host,
        tiny_model_dir,
        data_file,
        "--custom-pg-loss-reducer-function-path",
        "tests.plugins.loss_hooks.zero_pg_loss_reducer",
    )
    b, z = base["steps"][0], zero["steps"][0]
    assert b["pg_loss"] != 0 and z["pg_loss"] == 0 and z["grad_norm"] == 0
    assert z["ppo_kl"] == pytest.approx(b["ppo_kl"])  # the other metrics keep sum_of_sample_mean
    totals, lengths, masks, per_token = zero_seen.reducer_calls[0]
    assert lengths == [len(m) for m in masks] and all(t > r for t, r in zip(totals, lengths))
    assert per_token is False
    summed, _ = _train(
        train_worker_host,
        tiny_model_dir,
        data_file,
        "--custom-pg-loss-reducer-function-path",
        "tests.plugins.loss_hooks.sum_pg_loss_reducer",
    )
    assert summed["steps"][0]["pg_loss"] != pytest.approx(b["pg_loss"])


def test_rollout_data_postprocess_changes_what_is_trained(train_worker_host, tiny_model_dir, data_file, base):
    out, args = _train(
        train_worker_host,
        tiny_model_dir,
        data_file,
        "--rollout-data-postprocess-path",
        "tests.plugins.loss_hooks.mask_nothing",
    )
    assert base["steps"][0]["grad_norm"] > 0
    assert out["steps"][0]["pg_loss"] == 0 and out["steps"][0]["grad_norm"] == 0
    rollout_id, keys = args.postprocess_seen
    assert rollout_id == 0 and {"advantages", "log_probs", "loss_masks", "tokens", "rewards"} <= set(keys)
