"""slime's policy loss on plain tensors: advantages, PPO/GRPO clipping, TIS, KL, entropy, and the
per-rollout mean that makes a rollout count once however its samples were split.

The flags come as `LossConfig` (`slime.train.flags`), read once from the parsed namespace; slime's plugins
(custom loss, advantage, TIS, pg-loss reducer, rollout-data post-process) are resolved once into
`LossHooks`, which keeps the namespace slime gives them. Everything works on flat per-token tensors (the samples' response tokens concatenated in order)
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

from slime.train.flags import LossConfig, LossConfigError, check_opd_args  # noqa: F401 - importable from here
from slime.utils.misc import load_function

SUPPORTED_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")


def check_loss_args(config: LossConfig) -> None:
    estimator = config.advantage_estimator
    if config.custom_advantage_function_path is None and estimator not in SUPPORTED_ESTIMATORS:
        raise LossConfigError(
            f"--advantage-estimator {estimator}: the reference trainer supports "
            f"{', '.join(SUPPORTED_ESTIMATORS)} (ppo needs a critic)"
        )
    if config.loss_type not in ("policy_loss", "custom_loss"):
        raise LossConfigError(
            f"--loss-type {config.loss_type}: the reference trainer trains policy_loss, or "
            f"custom_loss with --custom-loss-function-path"
        )
    if config.calculate_per_token_loss:
        raise LossConfigError("--calculate-per-token-loss is not supported by the reference trainer")
    if config.kl_loss_type not in ("k1", "k2", "k3", "low_var_kl"):
        raise LossConfigError(f"--kl-loss-type {config.kl_loss_type}: expected k1, k2, k3 or low_var_kl")
    if config.get_mismatch_metrics and not config.custom_tis_function_path:
        raise LossConfigError("--get-mismatch-metrics needs --custom-tis-function-path (the function computing them)")
    custom_tis_function(config)  # a bad --custom-tis-function-path fails before the first step
    check_opd_args(config)


def needs_reference(config: LossConfig) -> bool:
    """A frozen reference model is needed for the KL loss or a KL-shaped reward."""
    return bool(config.use_kl_loss) or (
        float(config.kl_coef) != 0.0
        and config.advantage_estimator in ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
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
    config: LossConfig, rewards: list[float], loss_masks: list[torch.Tensor], kl: list[torch.Tensor] | None
) -> list[torch.Tensor]:
    """Per-token advantages from the batch's (already group-normalised) rewards, as slime computes them
    for `--advantage-estimator` (GRPO family: the sample's reward on every token; REINFORCE++: the
    discounted return of the KL-shaped token rewards; REINFORCE++-baseline: reward minus KL penalty)."""
    estimator = config.advantage_estimator
    kl_coef = float(config.kl_coef)
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
            gamma = float(config.gamma)
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
    config: LossConfig,
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
    coef = float(config.opd_kl_coef)
    reverse_kls = []
    for i, (student, teacher) in enumerate(zip(student_log_probs, teacher_log_probs)):
        reverse_kl = student.float() - teacher.float()
        advantages[i] = advantages[i] - coef * reverse_kl
        reverse_kls.append(reverse_kl)
    return reverse_kls


def normalized_advantages(
    config: LossConfig,
    advantages: list[torch.Tensor],
    masks: list[torch.Tensor],
    all_reduce: Callable[[torch.Tensor], Any] = lambda stats: None,
) -> list[torch.Tensor]:
    """slime's `--normalize-advantages`: masked whitening over every rank's tokens (`all_reduce` sums the
    three statistics across ranks in place: `dist.all_reduce` in the trainer); unchanged without the flag."""
    if not config.normalize_advantages:
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
    config: LossConfig,
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
    weights = tis.clamp(float(config.tis_clip_low), float(config.tis_clip))
    metrics = {"tis": tis, "tis_clipfrac": (weights != tis).float(), "tis_abs": (tis - 1).abs()}
    return pg_loss * weights, loss_masks, metrics


def custom_tis_function(config: LossConfig) -> Callable[..., TisResult] | None:
    """--custom-tis-function-path (slime's keywords: args, pg_loss, train_log_probs, rollout_log_probs,
    loss_masks, total_lengths, response_lengths -> pg_loss, loss masks, per-token metrics), else None."""
    path = config.custom_tis_function_path
    return load_function(path, "--custom-tis-function-path") if path else None


@dataclass(frozen=True)
class LossHooks:
    """slime's loss hooks, resolved once (each None when its flag is not set), called as slime's
    Megatron trainer calls them, with `args`, the namespace slime gives its plugins (built by our parser,
    so its defaults are the parser's):

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
    - `custom_tis` (`--custom-tis-function-path`): `fn(args=, pg_loss=, train_log_probs=, rollout_log_probs=,
      loss_masks=, total_lengths=, response_lengths=)` instead of the vanilla TIS (`tis`).
    """

    args: Any = None
    custom_loss: Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]] | None = None
    pg_loss_reducer: Callable[..., Callable[[torch.Tensor], torch.Tensor]] | None = None
    rollout_data_postprocess: Callable[..., None] | None = None
    custom_advantage: Callable[..., None] | None = None
    custom_tis: Callable[..., TisResult] | None = None

    @classmethod
    def of(cls, config: LossConfig, args: Any) -> "LossHooks":
        """The hooks `config` names, loaded; `args` is what they are called with."""
        custom = None
        if config.loss_type == "custom_loss":
            if not config.custom_loss_function_path:
                raise LossConfigError("--loss-type custom_loss needs --custom-loss-function-path")
            custom = load_function(config.custom_loss_function_path, "--custom-loss-function-path")
        reducer, post = config.custom_pg_loss_reducer_function_path, config.rollout_data_postprocess_path
        advantage = config.custom_advantage_function_path
        return cls(
            args=args,
            custom_loss=custom,
            pg_loss_reducer=load_function(reducer, "--custom-pg-loss-reducer-function-path") if reducer else None,
            rollout_data_postprocess=load_function(post, "--rollout-data-postprocess-path") if post else None,
            custom_advantage=(load_function(advantage, "--custom-advantage-function-path") if advantage else None),
            custom_tis=custom_tis_function(config),
        )

    def tis(self, config: LossConfig, **tensors: Any) -> TisResult:
        """TIS of one micro-batch: slime's custom function given `args`, else the vanilla one given `config`."""
        if self.custom_tis is None:
            return vanilla_tis(config, **tensors)
        return self.custom_tis(args=self.args, **tensors)


def _check_resolved(path: str | None, hook: Callable[..., Any] | None, flag: str) -> None:
    """A plugin the config names must come resolved in the hooks: never the built-in one in its place, silently."""
    if path and hook is None:
        raise LossConfigError(f"{flag} {path} is set but not resolved: pass hooks=LossHooks.of(config, args)")


def advantages_of_rollout(config: LossConfig, hooks: LossHooks, rollout_data: dict[str, Any]) -> list[torch.Tensor]:
    """Per-token advantages of a rank's samples, in slime's order: `--custom-advantage-function-path`
    (`fn(args, rollout_data)`, which must leave one tensor per sample, of its response length, in
    `rollout_data["advantages"]`), else `--advantage-estimator` over the rewards and the KL."""
    masks = rollout_data["loss_masks"]
    _check_resolved(config.custom_advantage_function_path, hooks.custom_advantage, "--custom-advantage-function-path")
    if hooks.custom_advantage is None:
        return advantages_for(config, rollout_data["rewards"], masks, rollout_data["kl"])
    hooks.custom_advantage(hooks.args, rollout_data)
    out = rollout_data.get("advantages")
    if not (
        isinstance(out, (list, tuple))
        and len(out) == len(masks)
        and all(isinstance(a, torch.Tensor) and a.numel() == m.numel() for a, m in zip(out, masks))
    ):
        raise LossConfigError(
            f"--custom-advantage-function-path {config.custom_advantage_function_path}: it must set "
            f"rollout_data['advantages'] to one tensor per sample ({len(masks)}), each of its "
            f"response length, as slime's hook does; got {type(out).__name__}"
        )
    return [a.detach().reshape(-1).to(torch.float32) for a in out]


def call_custom_loss(
    config: LossConfig,
    hooks: LossHooks,
    batch: dict[str, Any],
    logits: torch.Tensor,
    reduce: Callable[[torch.Tensor], torch.Tensor],
) -> PolicyLossOutput:
    """`--custom-loss-function-path` on one micro-batch; its log values become the step's metrics."""
    result = hooks.custom_loss(hooks.args, batch, logits, reduce)
    if not (
        isinstance(result, tuple)
        and len(result) == 2
        and isinstance(result[0], torch.Tensor)
        and isinstance(result[1], dict)
    ):
        raise LossConfigError(
            f"--custom-loss-function-path {config.custom_loss_function_path}: expected "
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
    config: LossConfig,
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
    hooks: LossHooks | None = None,
) -> PolicyLossOutput:
    """slime's `policy_loss_function` for one micro-batch (flat per-token tensors, `reduce` from
    `sample_reducer` over `loss_masks` and `denominators`). The returned loss is the micro-batch's
    share of the step loss before the step's scaling (1 / rollouts in the step). `hooks`: slime's TIS
    function and pg-loss reducer, resolved once by the worker (`LossHooks.of`); none by default."""
    hooks = hooks or LossHooks()
    _check_resolved(config.custom_tis_function_path, hooks.custom_tis, "--custom-tis-function-path")
    _check_resolved(
        config.custom_pg_loss_reducer_function_path, hooks.pg_loss_reducer, "--custom-pg-loss-reducer-function-path"
    )
    estimator = config.advantage_estimator
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
    eps_low, eps_high = float(config.eps_clip), float(config.eps_clip_high or config.eps_clip)
    if estimator == "cispo":
        clipped = ratio.clamp(1 - eps_low, 1 + eps_high)
        pg_losses = -clipped.detach() * advantages * log_probs
        clipfrac = (clipped != ratio).float()
    else:
        loss1 = -ratio * advantages
        loss2 = -ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
        pg_losses = torch.maximum(loss1, loss2)
        clipfrac = (loss2 > loss1).float()
        eps_c = config.eps_clip_c
        if eps_c is not None:
            if eps_c <= 1.0:
                raise LossConfigError(f"--eps-clip-c must be > 1.0 for dual-clip PPO, got {eps_c}")
            pg_losses = torch.where(advantages < 0, torch.minimum(-eps_c * advantages, pg_losses), pg_losses)
    metrics: dict[str, torch.Tensor] = {}
    reduce_pg = reduce
    pg_masks = list(loss_masks)
    if config.use_tis or config.get_mismatch_metrics:
        if rollout_log_probs is None:
            raise LossConfigError("--use-tis needs the engines' log-probs (rollout_log_probs) in the batch")
        pg_losses, masks, tis_metrics = hooks.tis(
            config,
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
    if hooks.pg_loss_reducer is not None:  # slime: the TIS-modified masks when TIS or mismatch metrics are on
        reduce_pg = hooks.pg_loss_reducer(
            total_lengths, list(response_lengths), pg_masks, bool(config.calculate_per_token_loss)
        )
    pg_loss = reduce_pg(pg_losses)
    entropy_loss = reduce(entropy)
    loss = pg_loss - float(config.entropy_coef) * entropy_loss
    if config.use_kl_loss:
        if ref_log_probs is None:
            raise LossConfigError("--use-kl-loss needs reference log-probs")
        ratio_for_kl = torch.exp(log_probs - old_log_probs) if config.use_unbiased_kl else None
        kl_loss = reduce(approx_kl(log_probs, ref_log_probs, config.kl_loss_type, ratio_for_kl))
        loss = loss + float(config.kl_loss_coef) * kl_loss
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
