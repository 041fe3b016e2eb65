"""The two calls the rollout loop makes per rollout: compute metrics once, send them everywhere.

Each namespace gets its own step key (`rollout/step`, `perf/step`, `eval/step`): the rollout id,
or slime's train step with --wandb-always-use-train-step. Destinations: `metrics.jsonl` (see
`metrics_log.metrics_dir`) and wandb when --use-wandb.
"""

from __future__ import annotations

import logging
from typing import Any

from slime.observability import metrics as M
from slime.observability import metrics_log
from slime.observability.flags import ReportConfig
from slime.observability.wandb_logger import WandbRun
from slime.utils.trajectory import TrajectoryRecord
from slime.observability.rollout_dump import render_prompt

logger = logging.getLogger(__name__)

TABLE_COLUMNS = ["prompt", "response", "label", "reward", "status", "turns"]
EVAL_TABLE_ROWS = 64  # samples of each eval dataset in its wandb table


def _emit(
    config: ReportConfig,
    wandb_run: WandbRun | None,
    kind: str,
    rollout_id: int,
    metrics: dict,
    step_key: str,
    step: int,
) -> dict:
    payload = {**metrics, step_key: step}
    d = metrics_log.metrics_dir(config.observability, wandb_run)
    if d is not None:
        metrics_log.append_metrics(
            d / metrics_log.FILENAME, payload, kind=kind, rollout_id=rollout_id, step_key=step_key, step=step
        )
    if wandb_run is not None:
        wandb_run.log(payload, step_key)
    return payload


def log_rollout(
    config: ReportConfig, rollout_id: int, samples: list, perf: dict | None = None, wandb_run: WandbRun | None = None
) -> dict:
    """Log `rollout/*` against rollout/step and `perf/*` against perf/step; returns all metrics."""
    metrics = M.compute_rollout_metrics(config, rollout_id, samples, perf or {})
    step = M.log_step(config, rollout_id)
    rollout = {k: v for k, v in metrics.items() if k.startswith("rollout/")}
    perf_m = {k: v for k, v in metrics.items() if k.startswith("perf/")}
    out = {}
    out.update(_emit(config, wandb_run, "rollout", rollout_id, rollout, "rollout/step", step))
    out.update(_emit(config, wandb_run, "perf", rollout_id, perf_m, "perf/step", step))
    logger.info(
        "rollout %s: reward %.4f, response_len %.1f, truncated %.3f",
        rollout_id,
        metrics.get("rollout/reward_mean", float("nan")),
        metrics.get("rollout/response_len_mean", 0.0),
        metrics.get("rollout/truncated_ratio", 0.0),
    )
    return out


def log_fleet(config: ReportConfig, rollout_id: int, metrics: dict, wandb_run: WandbRun | None = None) -> dict:
    """`fleet/*` (what node losses did, slime.observability.node_losses) against fleet/step."""
    return _emit(config, wandb_run, "fleet", rollout_id, metrics, "fleet/step", M.log_step(config, rollout_id))


def eval_table_rows(config: ReportConfig, samples: list, limit: int) -> list[list[Any]]:
    rows = []
    for s in M.flatten_samples(samples)[:limit]:
        rec = TrajectoryRecord.of(s)
        rows.append(
            [
                render_prompt(s.prompt),
                s.response,
                "" if s.label is None else str(s.label),
                M.reward_value(config, s),
                s.status.value,
                rec.turns if rec else 1,
            ]
        )
    return rows


def log_eval(config: ReportConfig, rollout_id: int, eval_data: dict, wandb_run: WandbRun | None = None) -> dict:
    """Log `eval/*` against eval/step, plus one `eval/<name>-samples` wandb.Table per dataset."""
    metrics = M.compute_eval_metrics(config, rollout_id, eval_data)
    step = M.log_step(config, rollout_id)
    payload = {**metrics, "eval/step": step}
    d = metrics_log.metrics_dir(config.observability, wandb_run)
    if d is not None:
        metrics_log.append_metrics(
            d / metrics_log.FILENAME, payload, kind="eval", rollout_id=rollout_id, step_key="eval/step", step=step
        )
    if wandb_run is not None:
        limit = EVAL_TABLE_ROWS
        tables = {}
        for name, data in (eval_data or {}).items():
            rows = eval_table_rows(config, (data or {}).get("samples") or [], limit)
            if rows:
                tables[f"eval/{name}-samples"] = WandbRun.table(TABLE_COLUMNS, rows)
        wandb_run.log({**payload, **tables}, "eval/step")
    for name in eval_data or {}:
        if f"eval/{name}" in metrics:
            logger.info("eval %s @ %s: %.4f", name, rollout_id, metrics[f"eval/{name}"])
    return payload
