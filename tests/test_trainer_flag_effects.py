"""The trainer flags that need a model to show their effect (tests/test_flag_effects.py lists them here):
--clip-grad, --seed, --use-rollout-logprobs, --ref-load, --no-save-optim and --no-load-optim, each changed
on the real `TrainWorker` (the tiny model, a one-rank gloo group) and the difference observed.

Every worker of this file lives in one Ray actor's process, the session's train-worker host (as slime-train runs
them; freeing a gloo group in the test process can deadlock, see tests/test_nonfinite_training.py): each test's
body builds the workers it compares there, so the model loads a few times but Ray and gloo start once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

FLAGS = ("--clip-grad", "--seed", "--use-rollout-logprobs", "--ref-load", "--no-save-optim", "--no-load-optim")


@pytest.fixture(scope="module")
def host(train_worker_host, tiny_model_dir, tmp_path_factory):
    """(the session's train-worker host actor, the base command line)."""
    data = tmp_path_factory.mktemp("trainer-flags") / "train.jsonl"
    data.write_text(json.dumps({"input": "hi"}) + "\n")
    argv = [
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
    return train_worker_host, argv


def in_host(host, body):
    """`body(make)` run in the actor's process, where `make(extra_argv)` is an initialised TrainWorker
    of the base command line plus `extra_argv` (parsed there: a --load directory exists by then)."""
    from tests.train_worker_host import in_host as run_in_host

    actor, argv = host
    return run_in_host(actor, lambda make_worker: body(lambda extra: make_worker([*argv, *extra])))


def train_once(worker, rollout_log_probs=None) -> dict:
    """One step on two samples of one rollout (4 response tokens, one micro-batch); the step's metrics."""
    import ray
    import torch

    data = {
        "tokens": [torch.tensor([11, 12, 13, 14, 15]), torch.tensor([21, 22, 23, 24])],
        "response_lengths": [2, 2],
        "loss_masks": [torch.ones(2), torch.ones(2)],
        "rollout_mask_sums": torch.tensor([4.0, 4.0]),
        "micro_batch_indices": [[0, 1]],
        "num_microbatches": [1],
        "global_batch_sizes": [1],
        "rewards": [1.0, 0.0],
        "raw_reward": [1.0, 0.0],
    }
    if rollout_log_probs is not None:
        data["rollout_log_probs"] = rollout_log_probs

    class Box:
        inner = ray.put(data)

    return worker.train(0, [Box()])["steps"][0]


def applied_grad_norm(worker) -> float:
    """The norm of the gradients the optimizer stepped with (they stay until the next step zeroes them)."""
    import torch

    grads = [p.grad for p in worker.model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


def test_clip_grad_bounds_the_gradient_the_step_applies(host):
    def body(make):
        out = {}
        for clip in ("0", "1e-3"):
            worker = make(["--clip-grad", clip])
            step = train_once(worker)
            out[clip] = (step["grad_norm"], applied_grad_norm(worker))
        return out

    out = in_host(host, body)
    (raw_reported, raw_applied), (clipped_reported, clipped_applied) = out["0"], out["1e-3"]
    assert raw_reported == pytest.approx(clipped_reported, rel=1e-5)  # logged: the norm before clipping
    assert raw_reported > 1e-2 and raw_applied == pytest.approx(raw_reported, rel=1e-4)  # 0: not clipped
    assert clipped_applied == pytest.approx(1e-3, rel=1e-3)


def test_seed_seeds_the_trainers_random_numbers(host):
    """Megatron's --seed: what a loss or post-process plugin draws in the trainer repeats under the same seed."""

    def body(make):
        import torch

        draws = []
        for seed in ("1", "2", "1"):
            make(["--seed", seed])
            draws.append(torch.rand(4).tolist())
        return draws

    first, other, again = in_host(host, body)
    assert first == again and first != other


def test_use_rollout_logprobs_takes_the_engines_log_probs_as_the_old_policy(host):
    """The first step's ratio is new/old: 1 against the trainer's own recomputed log-probs, not against the
    engine's (here the trainer's minus 1: ppo_kl = old - new = -1 per token)."""

    def body(make):
        import torch

        from slime.train.model import pack

        tokens = [torch.tensor([11, 12, 13, 14, 15]), torch.tensor([21, 22, 23, 24])]
        with torch.no_grad():
            lp, _ = make([]).policy.run(pack(tokens, [2, 2]), with_entropy=False)
        rollout_lp = [part - 1.0 for part in lp.split([2, 2])]
        return {
            flag: train_once(make(["--use-rollout-logprobs"] if flag else []), rollout_lp)["ppo_kl"]
            for flag in (False, True)
        }

    out = in_host(host, body)
    assert out[False] == pytest.approx(0.0, abs=1e-6)
    assert out[True] == pytest.approx(-1.0, rel=1e-4)


def test_ref_load_is_the_reference_the_kl_loss_is_measured_against(host, tmp_path_factory):
    from slime.testing.tiny_model import build_tiny_model

    other = build_tiny_model(tmp_path_factory.mktemp("reference"), seed=7)

    def body(make):
        kl = ["--use-kl-loss", "--kl-loss-coef", "0.5"]
        return (train_once(make(kl))["kl_loss"], train_once(make([*kl, "--ref-load", str(other)]))["kl_loss"])

    same, against_other = in_host(host, body)
    assert same == pytest.approx(0.0, abs=1e-6)  # the reference is --hf-checkpoint, the policy before its step
    assert abs(against_other) > 1e-3


def test_no_save_optim_and_no_load_optim_leave_the_optimizer_state_out(host, tmp_path):
    full, bare = tmp_path / "full", tmp_path / "bare"

    def body(make):
        from slime.train.checkpoint import CheckpointError

        def moments(worker) -> int:
            return sum(len(s) for s in worker.optimizer.state_dict()["state"].values())

        saved = make(["--save", str(full)])
        train_once(saved)
        saved.save_model(0)
        unsaved = make(["--save", str(bare), "--no-save-optim"])
        train_once(unsaved)
        unsaved.save_model(0)
        files = {
            name: sorted(p.name for p in (root / "iter_0000000").iterdir())
            for name, root in (("full", full), ("bare", bare))
        }
        resumed, fresh = make(["--load", str(full)]), make(["--load", str(full), "--no-load-optim"])
        try:
            make(["--load", str(bare)])
            refused = None
        except CheckpointError as e:
            refused = str(e)
        return (
            files,
            moments(saved),
            moments(resumed),
            moments(fresh),
            resumed.global_step,
            fresh.global_step,
            refused,
            moments(make(["--load", str(bare), "--no-load-optim"])),
        )

    files, saved, resumed, fresh, resumed_step, fresh_step, refused, bare_fresh = in_host(host, body)
    assert "optimizer.pt" in files["full"] and "optimizer.pt" not in files["bare"]
    assert saved > 0 and resumed == saved  # Adam's step, exp_avg and exp_avg_sq of every parameter, restored
    assert fresh == 0 and bare_fresh == 0  # --no-load-optim: a fresh optimizer, the model and step still loaded
    assert resumed_step == fresh_step == 1
    assert refused is not None and "optimizer.pt is missing" in refused and "--no-load-optim" in refused


def test_this_file_changes_every_flag_it_proves():
    text = Path(__file__).read_text()
    assert all(text.count(f'"{flag}"') >= 2 for flag in FLAGS)
