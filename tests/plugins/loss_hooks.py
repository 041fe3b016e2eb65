"""slime's loss hooks as slime users write them (slime's call shapes), for tests/test_loss_hooks.py.
Each records what it was given on `args` (slime's own contract test does the same)."""

import torch


def custom_loss(args, batch, logits, sum_of_sample_mean):
    """A loss that is not the policy loss: the mean of the response logits' log-sum-exp."""
    args.custom_loss_seen = {
        "keys": sorted(batch),
        "logits_shape": tuple(logits.shape),
        "response_lengths": list(batch["response_lengths"]),
    }
    lse = torch.logsumexp(logits, dim=-1)
    loss = sum_of_sample_mean(lse)
    return loss, {"custom_lse": loss.detach(), "custom_marker": torch.tensor(7.0)}


def zero_pg_loss_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss=False):
    args_seen = (
        list(total_lengths),
        list(response_lengths),
        [m.tolist() for m in loss_masks],
        calculate_per_token_loss,
    )
    zero_pg_loss_reducer.calls.append(args_seen)
    return lambda x: x.sum() * 0.0


zero_pg_loss_reducer.calls = []


def sum_pg_loss_reducer(total_lengths, response_lengths, loss_masks, calculate_per_token_loss=False):
    """Dr.GRPO-like: the masked sum over tokens, divided by a constant instead of each rollout's tokens."""

    def reduce(x):
        parts = x.split(list(response_lengths))
        return sum((p * m).sum() for p, m in zip(parts, loss_masks)) / 1000.0

    return reduce


def mask_nothing(args, rollout_id, rollout_data):
    """Post-process: train on no token at all."""
    args.postprocess_seen = (rollout_id, sorted(rollout_data))
    rollout_data["loss_masks"] = [torch.zeros_like(m) for m in rollout_data["loss_masks"]]


def kl_shaped_advantage(args, rollout_data):
    """slime's --custom-advantage-function-path shape: fills rollout_data["advantages"] and ["returns"] from
    the rewards and the KL (here: reward minus twice the per-token KL, a shape no estimator gives)."""
    rollout_data["advantages"] = [
        torch.full_like(kl, float(r)) - 2.0 * kl for r, kl in zip(rollout_data["rewards"], rollout_data["kl"])
    ]
    rollout_data["returns"] = rollout_data["advantages"]


def advantage_of_wrong_length(args, rollout_data):
    rollout_data["advantages"] = [torch.zeros(1) for _ in rollout_data["rewards"]]
