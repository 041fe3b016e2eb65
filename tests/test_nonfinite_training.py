"""A non-finite loss term, gradient or weight stops the run before the optimizer step and before any
push (slime/train/finite_guard.py): the real `TrainWorker` (tiny model, a one-rank gloo group) on a
batch put in Ray's object store as the rollout manager would."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from slime.cli.train import parse_train_args
from slime.train.finite_guard import NonFiniteError, check_step


@pytest.fixture
def worker(tiny_model_dir, tmp_path, ray_cluster):
    from slime.train.worker import TrainWorker
    from slime.utils.misc import find_free_port

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"input": "hi"}) + "\n")
    args = parse_train_args(["--rollout-backend", "hf", "--hf-checkpoint", str(tiny_model_dir), "--prompt-data",
                             str(data), "--rollout-batch-size", "1", "--n-samples-per-prompt", "2",
                             "--global-batch-size", "2", "--lr", "1e-2"])
    w = TrainWorker(args, 1, 0)
    w.init("127.0.0.1", find_free_port("127.0.0.1"))
    yield w
    w.shutdown()


class Box:
    def __init__(self, ref):
        self.inner = ref


def batch(rewards: list[float]) -> list[Box]:
    """Two samples of one rollout, one micro-batch, one step."""
    import ray

    data = {"tokens": [torch.tensor([11, 12, 13, 14, 15]), torch.tensor([21, 22, 23, 24])],
            "response_lengths": [2, 2], "loss_masks": [torch.ones(2), torch.ones(2)],
            "rollout_mask_sums": torch.tensor([4.0, 4.0]), "micro_batch_indices": [[0, 1]],
            "num_microbatches": [1], "global_batch_sizes": [1], "rewards": rewards, "raw_reward": rewards}
    return [Box(ray.put(data))]


def weights(worker) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in worker.model.state_dict().items()}


def test_a_nan_reward_stops_the_step_naming_the_terms_and_leaves_the_weights(worker):
    before = weights(worker)
    with pytest.raises(NonFiniteError) as e:
        worker.train(0, batch([float("nan"), 1.0]))
    message = str(e.value)
    assert message.startswith("rollout 0, step 1: pg_loss=nan, loss=nan, grad_norm=nan is not finite; the step "
                              "was not taken and no weights were pushed"), message
    after = weights(worker)
    assert all(torch.equal(before[k], after[k]) for k in before)  # no optimizer step
    assert worker.global_step == 0
    assert worker.train(1, batch([0.0, 1.0]))["steps"][0]["step"] == 1  # a finite batch trains on


def test_a_nan_coefficient_set_by_a_plugin_is_named_in_the_loss(worker):
    worker.args.entropy_coef = float("inf")  # past the flag check: a plugin's doing
    with pytest.raises(NonFiniteError, match=r"step 1: loss=-?(inf|nan)"):
        worker.train(0, batch([0.0, 1.0]))


class Unreachable:
    """A rollout manager that must not be asked anything."""

    def __getattr__(self, name):
        raise AssertionError(f"the manager was asked for {name} with NaN weights")


def test_nan_weights_are_never_pushed(worker):
    name, param = next(iter(worker.model.named_parameters()))
    with torch.no_grad():
        param.view(-1)[0] = float("nan")
    with pytest.raises(NonFiniteError) as e:
        worker.update_weights(Unreachable(), "1", "distributed")
    assert str(e.value).startswith(f"the weight {name} holds NaN/inf: not pushed to the engines")


@pytest.mark.parametrize("values, named", [
    ({"pg_loss": 0.5, "kl_loss": float("nan"), "loss": float("nan"), "grad_norm": 1.0}, "kl_loss=nan, loss=nan"),
    ({"pg_loss": 0.5, "opd_reverse_kl": float("-inf"), "loss": 1.0, "grad_norm": 1.0}, "opd_reverse_kl=-inf"),
    ({"pg_loss": 0.5, "entropy_loss": float("inf"), "loss": 1.0, "grad_norm": float("inf")},
     "entropy_loss=inf, grad_norm=inf"),
])
def test_each_term_is_named(values, named):
    with pytest.raises(NonFiniteError, match=rf"^rollout 3, step 7: {named} is not finite"):
        check_step(3, 7, values)
    check_step(3, 7, {k: 0.0 if not math.isfinite(v) else v for k, v in values.items()})
