"""PNG plots from `metrics.jsonl`, for people without a wandb account.

Produces `eval_<dataset>.png` (mean reward, pass@k, truncation per dataset over eval steps),
`reward.png` (reward mean ± std, zero-variance groups over rollouts), `response_length.png`
(mean/median/p90/max and truncation), `perf.png` (tokens/s, rollout time) and, for a training run
(`slime-train`), `train.png` (reward per rollout and the trainer/engine log-prob gap per step, log
scale, next to the loss terms) when present.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from slime.observability.metrics_log import read_metrics

_DERIVED = re.compile(r"-(truncated_ratio|pass@\d+|response_len_\w+|turns_mean)$|/step$|-samples$")


def _series(records: list[dict], step_key: str) -> dict[str, list[tuple[float, float]]]:
    """metric -> sorted [(step, value)] for records logged against `step_key`."""
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for rec in records:
        m = rec["metrics"]
        step = m.get(step_key, rec.get("step"))
        if rec.get("step_key") != step_key or step is None:
            continue
        for k, v in m.items():
            if k != step_key and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k].append((float(step), float(v)))
    return {k: sorted(v) for k, v in out.items()}


def _plot(ax: Any, series: dict, key: str, label: str | None = None, **kw: Any) -> bool:
    pts = series.get(key)
    if not pts:
        return False
    xs, ys = zip(*pts)
    ax.plot(xs, ys, marker="o", markersize=3, label=label or key, **kw)
    return True


def make_report(metrics_path: str | Path, out_dir: str | Path) -> list[Path]:
    """Write the PNGs for one metrics.jsonl (or a dir holding it); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(read_metrics(metrics_path))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        p = out / name
        fig.savefig(p, dpi=90)
        plt.close(fig)
        written.append(p)

    ev = _series(records, "eval/step")
    datasets = sorted(k[len("eval/") :] for k in ev if k.startswith("eval/") and not _DERIVED.search(k))
    for name in datasets:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
        _plot(a1, ev, f"eval/{name}", "mean reward")
        for k in sorted(k for k in ev if k.startswith(f"eval/{name}-pass@")):
            _plot(a1, ev, k, k.split("-")[-1], linestyle="--")
        _plot(a1, ev, f"eval/{name}-truncated_ratio", "truncated ratio", linestyle=":")
        a1.set_title(f"eval/{name}")
        a1.set_xlabel("eval/step")
        a1.legend(fontsize=7)
        for stat in ("mean", "median", "max"):
            _plot(a2, ev, f"eval/{name}-response_len_{stat}", stat)
        a2.set_title(f"{name}: response length")
        a2.set_xlabel("eval/step")
        a2.legend(fontsize=7)
        save(fig, f"eval_{name.replace('/', '_')}.png")

    ro = _series(records, "rollout/step")
    if "rollout/reward_mean" in ro:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        _plot(ax, ro, "rollout/reward_mean", "reward mean")
        pts, std = ro["rollout/reward_mean"], dict(ro.get("rollout/reward_std", []))
        if std:
            xs = [x for x, _ in pts]
            ax.fill_between(xs, [y - std.get(x, 0) for x, y in pts], [y + std.get(x, 0) for x, y in pts], alpha=0.2)
        _plot(ax, ro, "rollout/zero_std_group_ratio", "zero-std groups", linestyle=":")
        ax.set_title("reward over rollouts")
        ax.set_xlabel("rollout/step")
        ax.legend(fontsize=7)
        save(fig, "reward.png")
    if "rollout/response_len_mean" in ro:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
        for stat in ("mean", "median", "p90", "max"):
            _plot(a1, ro, f"rollout/response_len_{stat}", stat)
        a1.set_title("response length")
        a1.set_xlabel("rollout/step")
        a1.legend(fontsize=7)
        for k in (
            "rollout/truncated_ratio",
            "rollout/aborted_ratio",
            "rollout/tool_calls_per_sample",
            "rollout/turns_mean",
        ):
            _plot(a2, ro, k, k.split("/", 1)[1])
        a2.set_title("truncation, turns, tool calls")
        a2.set_xlabel("rollout/step")
        a2.legend(fontsize=7)
        save(fig, "response_length.png")

    pf = _series(records, "perf/step")
    if "perf/tokens_per_s" in pf or "perf/rollout_time" in pf:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
        _plot(a1, pf, "perf/tokens_per_s", "tokens/s")
        a1.set_title("throughput")
        _plot(a2, pf, "perf/rollout_time", "rollout time (s)")
        _plot(a2, pf, "perf/tool_time_total", "time in tools (s)")
        a2.set_title("time")
        for a in (a1, a2):
            a.set_xlabel("perf/step")
            a.legend(fontsize=7)
        save(fig, "perf.png")
    tr = _series(records, "train/step")
    if tr:
        plot_training(ro, tr, pf, save)
    return written


def plot_training(ro: dict, tr: dict, pf: dict, save: Any) -> None:
    """`train.png`: reward over rollouts (what the policy learns), the mean |trainer - engine| log-prob
    per step (log scale; should stay at float32 noise), the loss terms, and the time split."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    a_reward, a_diff, a_loss, a_time = axes.flat
    if not _plot(a_reward, ro, "rollout/raw_reward", "raw reward (trainer)"):
        _plot(a_reward, ro, "rollout/reward_mean", "reward mean")
    a_reward.set_title("reward over rollouts")
    a_reward.set_xlabel("rollout")
    if _plot(a_diff, tr, "train/train_rollout_logprob_abs_diff", "mean |trainer - engine| log-prob"):
        _plot(a_diff, tr, "train/train_rollout_logprob_abs_diff_max", "max", linestyle=":")
        a_diff.set_yscale("log")
    a_diff.set_title("train/rollout log-prob difference")
    a_diff.set_xlabel("train/step")
    for key in ("train/loss", "train/pg_loss", "train/pg_clipfrac", "train/ppo_kl", "train/grad_norm"):
        _plot(a_loss, tr, key, key.split("/", 1)[1])
    a_loss.set_title("loss terms")
    a_loss.set_xlabel("train/step")
    for key in ("perf/rollout_time", "perf/train_time", "perf/update_weights_time"):
        _plot(a_time, pf, key, key.split("/", 1)[1] + " (s)")
    a_time.set_title("time per rollout")
    a_time.set_xlabel("rollout")
    for a in axes.flat:
        if a.lines:
            a.legend(fontsize=7)
    save(fig, "train.png")
