"""A non-finite loss term, gradient or weight stops the run before the optimizer step and before any
push (slime/train/finite_guard.py): the real `TrainWorker` (tiny model, a one-rank gloo group) on a
batch put in Ray's object store as the rollout manager would. The worker runs in a Ray actor, as slime-train
runs it, and each test's body runs there (`in_worker`): freeing a gloo group in the test process joins gloo's
threads while holding the GIL one of them may wait for (a deadlock seen in a whole-suite run)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from slime.train.finite_guard import NonFiniteError, check_step


@pytest.fixture
def worker(train_worker_host, tiny_model_dir, tmp_path):
    """(the session's train-worker host, a command line): each test's TrainWorker is built fresh in that actor's
    process (tests/train_worker_host.py), so what one test breaks (NaN weights, a coefficient) no other sees."""
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"input": "hi"}) + "\n")
    return train_worker_host, [
        "--rollout-backend",
        "hf",
        "--hf-checkpoint",
        str(tiny_model_dir),
        "--prompt-data",
        str(data),
        "--rollout-batch-size",
        "1",
        "--n-samples-per-prompt",
        "2",
        "--global-batch-size",
        "2",
        "--lr",
        "1e-2",
    ]


def in_worker(worker, body):
    """`body(a fresh TrainWorker)` run in the host's process; its return value."""
    from tests.train_worker_host import in_host

    host, argv = worker
    return in_host(host, lambda make: body(make(argv)))


def raised(fn) -> str | None:
    """The NonFiniteError message `fn()` raised (None: it raised nothing)."""
    try:
        fn()
    except NonFiniteError as e:
        return str(e)
    return None


class Box:
    def __init__(self, ref):
        self.inner = ref


def batch(rewards: list[float]) -> list[Box]:
    """Two samples of one rollout, one micro-batch, one step."""
    import ray

    data = {
        "tokens": [torch.tensor([11, 12, 13, 14, 15]), torch.tensor([21, 22, 23, 24])],
        "response_lengths": [2, 2],
        "loss_masks": [torch.ones(2), torch.ones(2)],
        "rollout_mask_sums": torch.tensor([4.0, 4.0]),
        "micro_batch_indices": [[0, 1]],
        "num_microbatches": [1],
        "global_batch_sizes": [1],
        "rewards": rewards,
        "raw_reward": rewards,
    }
    return [Box(ray.put(data))]


def weights(worker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in worker.model.state_dict().items()}


def test_a_nan_reward_stops_the_step_naming_the_terms_and_leaves_the_weights(worker):
    def body(w):
        before = weights(w)
        message = raised(lambda: w.train(0, batch([float("nan"), 1.0])))
        after = weights(w)
        unchanged = all(torch.equal(before[k], after[k]) for k in before)  # no optimizer step
        return message, unchanged, w.global_step, w.train(1, batch([0.0, 1.0]))["steps"][0]["step"]

    message, unchanged, step, next_step = in_worker(worker, body)
    assert message and message.startswith(
        "rollout 0, step 1: pg_loss=nan, loss=nan, grad_norm=nan is not finite; "
        "the step was not taken and no weights were pushed"
    ), message
    assert unchanged and step == 0
    assert next_step == 1  # a finite batch trains on


def test_an_infinite_coefficient_past_the_flag_check_is_named_in_the_loss(worker):
    def body(w):
        import dataclasses

        # a config built past the parser's range check (by hand, not from the command line)
        w.config = dataclasses.replace(w.config, loss=dataclasses.replace(w.config.loss, entropy_coef=float("inf")))
        return raised(lambda: w.train(0, batch([0.0, 1.0])))

    message = in_worker(worker, body)
    assert message is not None and re.search(r"step 1: loss=-?(inf|nan)", message), message


class Unreachable:
    """A rollout manager that must not be asked anything."""

    def __getattr__(self, name):
        raise AssertionError(f"the manager was asked for {name} with NaN weights")


def test_nan_weights_are_never_pushed(worker):
    def body(w):
        name, param = next(iter(w.model.named_parameters()))
        with torch.no_grad():
            param.view(-1)[0] = float("nan")
        return name, raised(lambda: w.update_weights(Unreachable(), "1", "distributed"))

    name, message = in_worker(worker, body)
    assert message is not None and message.startswith(f"the weight {name} holds NaN/inf: not pushed to the engines")


@pytest.mark.parametrize(
    "values, named",
    [
        ({"pg_loss": 0.5, "kl_loss": float("nan"), "loss": float("nan"), "grad_norm": 1.0}, "kl_loss=nan, loss=nan"),
        ({"pg_loss": 0.5, "opd_reverse_kl": float("-inf"), "loss": 1.0, "grad_norm": 1.0}, "opd_reverse_kl=-inf"),
        (
            {"pg_loss": 0.5, "entropy_loss": float("inf"), "loss": 1.0, "grad_norm": float("inf")},
            "entropy_loss=inf, grad_norm=inf",
        ),
    ],
)
def test_each_term_is_named(values, named):
    with pytest.raises(NonFiniteError, match=rf"^rollout 3, step 7: {named} is not finite"):
        check_step(3, 7, values)
    check_step(3, 7, {k: 0.0 if not math.isfinite(v) else v for k, v in values.items()})
