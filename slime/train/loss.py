"""slime's policy loss on plain tensors: advantages, PPO/GRPO clipping, TIS, KL, entropy, and the
per-rollout mean that makes a rollout count once however its samples were split.

Everything works on flat per-token tensors (the samples' response tokens concatenated in order)
plus the per-sample `response_lengths`, `loss_masks` and denominators, as slime's Megatron loss
does. Pure torch: no Ray, no model, so each formula is unit-testable.

Reduction (`sum_of_sample_mean`): sample i contributes `sum(x_i * mask_i) / max(denom_i, 1)` where
`denom_i` is `rollout_mask_sums[i]`, the loss-mask total of the sample's whole rollout. Summed over
every micro-batch and rank of a step and divided by the step's rollout count, that is the mean over
rollouts of each rollout's token mean, whatever the split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from slime.utils.misc import load_function

SUPPORTED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")


class LossConfigError(ValueError):
    """A flag combination the reference trainer cannot train; the message names the flag."""


def check_loss_args(args: Any) -> None:
    estimator = args.advantage_estimator
    if args.custom_advantage_function_path is None and estimator not in SUPPORTED_ESTIMATORS:
        raise LossConfigError(
            f"--advantage-estimator {estimator}: the reference trainer supports "
            f"{', '.join(SUPPORTED_ESTIMATORS)} (ppo needs a critic)"
        )
    if args.loss_type not in ("policy_loss", "custom_loss"):
        raise LossConfigError(
            f"--loss-type {args.loss_type}: the reference trainer trains policy_loss, or "
            f"custom_loss with --custom-loss-function-path"
        )
    if args.calculate_per_token_loss:
        raise LossConfigError("--calculate-per-token-loss is not supported by the reference trainer")
    if args.kl_loss_type not in ("k1", "k2", "k3", "low_var_kl"):
        raise LossConfigError(f"--kl-loss-type {args.kl_loss_type}: expected k1, k2, k3 or low_var_kl")
    if args.get_mismatch_metrics and not args.custom_tis_function_path:
        raise LossConfigError("--get-mismatch-metrics needs --custom-tis-function-path (the function computing them)")
    tis_function(args)  # a bad --custom-tis-function-path fails before the first step
    check_opd_args(args)


def check_opd_args(args: Any) -> None:
    """`--use-opd` needs the teacher's log-probs from the rollout (`--opd-type sglang`)."""
    if args.use_opd and args.opd_type != "sglang":
        raise LossConfigError(
            f"--opd-type {args.opd_type}: the reference trainer takes the "
            f"teacher's log-probs from the rollout (--opd-type sglang, teacher at --rm-url); "
            f"it loads no Megatron teacher"
        )


def needs_reference(args: Any) -> bool:
    """A frozen reference model is needed for the KL loss or a KL-shaped reward."""
    return bool(args.use_kl_loss) or (
        float(args.kl_coef) != 0.0
        and args.advantage_estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
    )


def approx_kl(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str, importance_ratio: torch.Tensor | None = None
) -> torch.Tensor:
    """Schulman's estimators of KL(pi || ref) per token (slime's `compute_approx_kl`)."""
    log_ratio = log_probs.float() - ref_log_probs.float()
    if kind == "k1":
        kl = log_ratio
    elif kind == "k2":
        kl = log_ratio**2 / 2.0
    elif kind in ("k3", "low_var_kl"):
        kl = torch.expm1(-log_ratio) + log_ratio
    else:
        raise LossConfigError(f"--kl-loss-type {kind}: expected k1, k2, k3 or low_var_kl")
    if importance_ratio is not None:
        kl = importance_ratio * kl
    return kl.clamp(-10, 10) if kind == "low_var_kl" else kl


def sample_reducer(
    response_lengths: list[int], loss_masks: list[torch.Tensor], denominators: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    """`x` (flat per-token) -> sum over samples of `sum(x_i * mask_i) / max(denom_i, 1)`."""
    masks = [m.to(torch.float32) for m in loss_masks]
    denoms = denominators.to(torch.float32).clamp_min(1.0)

    def reduce(x: torch.Tensor) -> torch.Tensor:
        parts = x.split(list(response_lengths), dim=0)
        total = x.new_zeros(())
        for part, mask, denom in zip(parts, masks, denoms):
            total = total + (part * mask).sum() / denom
        return total

    return reduce


def advantages_for(
    args: Any, rewards: list[float], loss_masks: list[torch.Tensor], kl: list[torch.Tensor] | None
) -> list[torch.Tensor]:
    """Per-token advantages from the batch's (already group-normalised) rewards, as slime computes them
    for `--advantage-estimator` (GRPO family: the sample's reward on every token; REINFORCE++: the
    discounted return of the KL-shaped token rewards; REINFORCE++-baseline: reward minus KL penalty)."""
    estimator = args.advantage_estimator
    kl_coef = float(args.kl_coef)
    out = []
    for i, (reward, mask) in enumerate(zip(rewards, loss_masks)):
        n = mask.numel()
        sample_kl = kl[i] if kl is not None else torch.zeros(n)
        if estimator in ("grpo", "gspo", "cispo"):
            out.append(torch.full((n,), float(reward)))
        elif estimator == "reinforce_plus_plus_baseline":
            out.append(torch.full((n,), float(reward)) - kl_coef * sample_kl * mask)
        elif estimator == "reinforce_plus_plus":
            token_rewards = -kl_coef * sample_kl * mask
            nz = mask.nonzero()
            if len(nz):
                token_rewards[int(nz[-1])] += float(reward)
            gamma = float(args.gamma)
            returns = torch.zeros(n)
            running = 0.0
            for t in range(n - 1, -1, -1):
                running = float(token_rewards[t]) + gamma * running
                returns[t] = running
            out.append(returns)
        else:
            raise LossConfigError(f"--advantage-estimator {estimator} is not supported by the reference trainer")
    return out


def apply_opd_kl_to_advantages(
    args: Any,
    advantages: list[torch.Tensor],
    student_log_probs: list[torch.Tensor],
    teacher_log_probs: list[torch.Tensor] | None,
) -> list[torch.Tensor]:
    """slime's on-policy distillation penalty (`--use-opd`), on top of any estimator: per token,
    advantage -= `--opd-kl-coef` * (log pi_student - log pi_teacher) of the sampled token, the one-sample
    estimate of the reverse KL(student || teacher). Replaces `advantages[i]` in place; returns the
    per-token reverse-KL estimates (logged as `opd_reverse_kl`)."""
    if teacher_log_probs is None:
        raise LossConfigError(
            "--use-opd needs teacher_log_probs in the batch: set --custom-rm-path "
            "slime.rollout.on_policy_distillation.reward_func and --custom-reward-post-process-path "
            "slime.rollout.on_policy_distillation.post_process_rewards with --rm-url at the teacher"
        )
    coef = float(args.opd_kl_coef)
    reverse_kls = []
    for i, (student, teacher) in enumerate(zip(student_log_probs, teacher_log_probs)):
        reverse_kl = student.float() - teacher.float()
        advantages[i] = advantages[i] - coef * reverse_kl
        reverse_kls.append(reverse_kl)
    return reverse_kls


def normalized_advantages(
    args: Any,
    advantages: list[torch.Tensor],
    masks: list[torch.Tensor],
    all_reduce: Callable[[torch.Tensor], Any] = lambda stats: None,
) -> list[torch.Tensor]:
    """slime's `--normalize-advantages`: masked whitening over every rank's tokens (`all_reduce` sums the
    three statistics across ranks in place: `dist.all_reduce` in the trainer); unchanged without the flag."""
    if not args.normalize_advantages:
        return advantages
    flat, m = torch.cat(advantages), torch.cat(masks)
    stats = torch.stack([(flat * m).sum(), m.sum(), (flat * flat * m).sum()]).to(torch.float64)
    all_reduce(stats)
    n = max(float(stats[1]), 1.0)
    mean = float(stats[0]) / n
    var = max(float(stats[2]) / n - mean * mean, 0.0)
    out = (flat - mean) / math.sqrt(var + 1e-8)
    return list(out.split([a.numel() for a in advantages]))


TisResult = tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]


def vanilla_tis(
    args: Any,
    *,
    pg_loss: torch.Tensor,
    train_log_probs: list[torch.Tensor],
    rollout_log_probs: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    **_: Any,
) -> TisResult:
    """slime's vanilla truncated importance sampling: pi_train(old) / pi_rollout, clipped to
    [--tis-clip-low, --tis-clip]; the masks stay as they are."""
    tis = torch.exp(torch.cat(train_log_probs) - torch.cat(rollout_log_probs))
    weights = tis.clamp(float(args.tis_clip_low), float(args.tis_clip))
    metrics = {"tis": tis, "tis_clipfrac": (weights != tis).float(), "tis_abs": (tis - 1).abs()}
    return pg_loss * weights, loss_masks, metrics


def tis_function(args: Any) -> Callable[..., TisResult]:
    """--custom-tis-function-path (slime's keywords: args, pg_loss, train_log_probs, rollout_log_probs,
    loss_masks, total_lengths, response_lengths -> pg_loss, loss masks, per-token metrics), else vanilla."""
    path = args.custom_tis_function_path
    return load_function(path, "--custom-tis-function-path") if path else vanilla_tis


@dataclass(frozen=True)
class LossHooks:
    """slime's loss hooks, resolved once (each None when its flag is not set), called as slime's
    Megatron trainer calls them:

    - `custom_loss` (`--loss-type custom_loss --custom-loss-function-path`):
      `fn(args, batch, logits, sum_of_sample_mean) -> (loss, {name: tensor})`, instead of the policy
      loss. `batch` has slime's per-sample lists for the micro-batch (`unconcat_tokens`/`tokens`,
      `total_lengths`, `response_lengths`, `loss_masks`, `advantages`, `log_probs` (old policy),
      `rollout_log_probs`, `ref_log_probs`, `rewards`); `logits` are the raw logits `[T, vocab]` at the
      positions predicting the micro-batch's response tokens, samples in order (Megatron's packed
      layout has no meaning here); `sum_of_sample_mean` reduces a flat per-token tensor.
    - `pg_loss_reducer` (`--custom-pg-loss-reducer-function-path`):
      `fn(total_lengths, response_lengths, loss_masks, calculate_per_token_loss) -> reducer`, the
      reducer of pg_loss alone (the other metrics keep `sum_of_sample_mean`).
    - `rollout_data_postprocess` (`--rollout-data-postprocess-path`): `fn(args, rollout_id, rollout_data)`
      after advantages are computed, before training; it may change `rollout_data` in place
      (`loss_masks`, `advantages`, ...), and the trainer trains on what it left there.
    - `custom_advantage` (`--custom-advantage-function-path`): `fn(args, rollout_data)` after the KL, instead
      of the estimator; it sets `rollout_data["advantages"]` (and `"returns"`), one tensor per sample
      (`advantages_of_rollout`).
    """

    custom_loss: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]] | None = None
    pg_loss_reducer: Callable[..., Callable[[torch.Tensor], torch.Tensor]] | None = None
    rollout_data_postprocess: Callable[..., None] | None = None
    custom_advantage: Callable[..., None] | None = None

    @classmethod
    def of(cls, args: Any) -> "LossHooks":
        custom = None
        if args.loss_type == "custom_loss":
            if not args.custom_loss_function_path:
                raise LossConfigError("--loss-type custom_loss needs --custom-loss-function-path")
            custom = load_function(args.custom_loss_function_path, "--custom-loss-function-path")
        reducer, post = args.custom_pg_loss_reducer_function_path, args.rollout_data_postprocess_path
        advantage = args.custom_advantage_function_path
        return cls(
            custom_loss=custom,
            pg_loss_reducer=load_function(reducer, "--custom-pg-loss-reducer-function-path") if reducer else None,
            rollout_data_postprocess=load_function(post, "--rollout-data-postprocess-path") if post else None,
            custom_advantage=(load_function(advantage, "--custom-advantage-function-path") if advantage else None),
        )


def advantages_of_rollout(args: Any, hooks: LossHooks, rollout_data: dict[str, Any]) -> list[torch.Tensor]:
    """Per-token advantages of a rank's samples, in slime's order: `--custom-advantage-function-path`
    (`fn(args, rollout_data)`, which must leave one tensor per sample, of its response length, in
    `rollout_data["advantages"]`), else `--advantage-estimator` over the rewards and the KL."""
    masks = rollout_data["loss_masks"]
    if hooks.custom_advantage is None:
        return advantages_for(args, rollout_data["rewards"], masks, rollout_data["kl"])
    hooks.custom_advantage(args, rollout_data)
    out = rollout_data.get("advantages")
    if not (
        isinstance(out, (list, tuple))
        and len(out) == len(masks)
        and all(isinstance(a, torch.Tensor) and a.numel() == m.numel() for a, m in zip(out, masks))
    ):
        raise LossConfigError(
            f"--custom-advantage-function-path {args.custom_advantage_function_path}: it must set "
            f"rollout_data['advantages'] to one tensor per sample ({len(masks)}), each of its "
            f"response length, as slime's hook does; got {type(out).__name__}"
        )
    return [a.detach().reshape(-1).to(torch.float32) for a in out]


def call_custom_loss(
    args: Any,
    hooks: LossHooks,
    batch: dict[str, Any],
    logits: torch.Tensor,
    reduce: Callable[[torch.Tensor], torch.Tensor],
) -> PolicyLossOutput:
    """`--custom-loss-function-path` on one micro-batch; its log values become the step's metrics."""
    result = hooks.custom_loss(args, batch, logits, reduce)
    if not (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], torch.Tensor)
        and isinstance(result[1], dict)
    ):
        raise LossConfigError(
            f"--custom-loss-function-path {args.custom_loss_function_path}: expected "
            f"(loss tensor, {{name: value}}) as slime's loss functions return, got "
            f"{type(result).__name__}"
        )
    loss, log = result
    metrics = {str(k): torch.as_tensor(v, dtype=torch.float32).detach().reshape(()) for k, v in log.items()}
    metrics.setdefault("loss", loss.detach())
    return PolicyLossOutput(loss, metrics)


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor
    metrics: dict[str, torch.Tensor]  # each a detached sum over samples (see module doc)


def policy_loss(
    args: Any,
    *,
    log_probs: torch.Tensor,
    entropy: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    rollout_log_probs: torch.Tensor | None,
    ref_log_probs: torch.Tensor | None,
    response_lengths: list[int],
    loss_masks: list[torch.Tensor],
    reduce: Callable[[torch.Tensor], torch.Tensor],
    denominators: torch.Tensor | None = None,
    total_lengths: list[int] | None = None,
    tis: Callable[..., TisResult] | None = None,
    pg_loss_reducer: Callable[..., Callable[[torch.Tensor], torch.Tensor]] | None = None,
) -> PolicyLossOutput:
    """slime's `policy_loss_function` for one micro-batch (flat per-token tensors, `reduce` from
    `sample_reducer` over `loss_masks` and `denominators`). The returned loss is the micro-batch's
    share of the step loss before the step's scaling (1 / rollouts in the step). `tis`: the TIS
    function the worker resolved once (`tis_function(args)`); a direct caller may leave it to this call."""
    estimator = args.advantage_estimator
    if estimator == "gspo":
        # sequence-level ratio: every token of a sample gets the sample's mean log-ratio
        parts = []
        for lp, olp, m in zip(log_probs.split(response_lengths), old_log_probs.split(response_lengths), loss_masks):
            mf = m.to(lp.dtype)
            seq = ((olp - lp) * mf).sum() / mf.sum().clamp_min(1)
            parts.append(seq.expand_as(lp))
        ppo_kl = torch.cat(parts) if parts else old_log_probs - log_probs
    else:
        ppo_kl = old_log_probs - log_probs
    ratio = torch.exp(-ppo_kl)
    eps_low, eps_high = float(args.eps_clip), float(args.eps_clip_high or args.eps_clip)
    if estimator == "cispo":
        clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
        pg_losses = -clipped.detach() * advantages * log_probs
        clipfrac = (clipped != ratio).float()
    else:
        loss1 = -ratio * advantages
        loss2 = -ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
        pg_losses = torch.maximum(loss1, loss2)
        clipfrac = (loss2 > loss1).float()
        eps_c = args.eps_clip_c
        if eps_c is not None:
            if eps_c <= 1.0:
                raise LossConfigError(f"--eps-clip-c must be > 1.0 for dual-clip PPO, got {eps_c}")
            pg_losses = torch.where(advantages < 0, torch.minimum(-eps_c * advantages, pg_losses), pg_losses)
    metrics: dict[str, torch.Tensor] = {}
    reduce_pg = reduce
    pg_masks = list(loss_masks)
    if args.use_tis or args.get_mismatch_metrics:
        if rollout_log_probs is None:
            raise LossConfigError("--use-tis needs the engines' log-probs (rollout_log_probs) in the batch")
        pg_losses, masks, tis_metrics = (tis or tis_function(args))(
            args=args,
            pg_loss=pg_losses,
            train_log_probs=list(old_log_probs.split(response_lengths)),
            rollout_log_probs=list(rollout_log_probs.split(response_lengths)),
            loss_masks=list(loss_masks),
            total_lengths=total_lengths,
            response_lengths=list(response_lengths),
        )
        # metrics over the original masks (a rejected token still counts in a rejection fraction)
        metrics.update({key: reduce(value.detach()).detach() for key, value in tis_metrics.items()})
        metrics["ois"] = reduce(ratio.detach()).detach()
        if masks is not loss_masks and any(not torch.equal(a, b) for a, b in zip(masks, loss_masks)):
            if denominators is None:
                raise LossConfigError(
                    "--custom-tis-function-path returned new loss masks; policy_loss needs "
                    "the samples' denominators to reduce with them"
                )
            reduce_pg = sample_reducer(response_lengths, masks, denominators)  # slime: same denominators
        pg_masks = list(masks)
    if pg_loss_reducer is not None:  # slime: the TIS-modified masks when TIS or mismatch metrics are on
        reduce_pg = pg_loss_reducer(
            total_lengths, list(response_lengths), pg_masks, bool(args.calculate_per_token_loss)
        )
    pg_loss = reduce_pg(pg_losses)
    entropy_loss = reduce(entropy)
    loss = pg_loss - float(args.entropy_coef) * entropy_loss
    if args.use_kl_loss:
        if ref_log_probs is None:
            raise LossConfigError("--use-kl-loss needs reference log-probs")
        ratio_for_kl = torch.exp(log_probs - old_log_probs) if args.use_unbiased_kl else None
        kl_loss = reduce(approx_kl(log_probs, ref_log_probs, args.kl_loss_type, ratio_for_kl))
        loss = loss + float(args.kl_loss_coef) * kl_loss
        metrics["kl_loss"] = kl_loss.detach()
    metrics.update(
        {
            "loss": loss.detach(),
            "pg_loss": pg_loss.detach(),
            "entropy_loss": entropy_loss.detach(),
            "pg_clipfrac": reduce(clipfrac).detach(),
            "ppo_kl": reduce(ppo_kl.detach()).detach(),
        }
    )
    return PolicyLossOutput(loss, metrics)
