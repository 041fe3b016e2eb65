"""`WandbRun`: one wandb run, as an object the manager creates and passes to whoever logs.

The rollout side lives in one process (the RolloutManager actor), so one run handle is enough;
another process (a trainer) joins the same run through wandb's public API,
`wandb.init(id=run.id, resume="allow")` (`WandbRun.join`). Each namespace is plotted against its
own step key (`rollout/step`, `perf/step`, `eval/step`, ...) via `define_metric`. A dashboard that
fails never stops a rollout: errors are logged and the metrics dropped.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from slime.observability.flags import ObservabilityConfig

logger = logging.getLogger(__name__)

STANDARD_STEP_KEYS = ("rollout/step", "perf/step", "eval/step")


def wandb_dir(config: ObservabilityConfig) -> Path:
    """--wandb-dir, else $WANDB_DIR, else ./outputs/wandb (inside the work tree, never $HOME)."""
    d = config.wandb_dir or os.environ.get("WANDB_DIR") or os.path.join(os.getcwd(), "outputs", "wandb")
    return Path(d).resolve()


def _prepare_env(config: ObservabilityConfig) -> Path:
    """Keep wandb's cache/staging/config dirs next to the runs unless the user set them."""
    d = wandb_dir(config)
    d.mkdir(parents=True, exist_ok=True)
    for var, sub in (("WANDB_CACHE_DIR", ".cache"), ("WANDB_DATA_DIR", ".data"), ("WANDB_CONFIG_DIR", ".config")):
        os.environ.setdefault(var, str(d / sub))
    return d


def _config(args: Any) -> dict:
    """The JSON-friendly part of the args namespace (wandb chokes on arbitrary objects)."""
    out = {}
    for k, v in vars(args).items() if hasattr(args, "__dict__") else []:
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) for x in v):
            out[k] = list(v)
    return out


class WandbRun:
    def __init__(self, run: Any):
        self.run = run
        self._defined: set[str] = set()
        self._lock = threading.Lock()
        for key in STANDARD_STEP_KEYS:
            self._define(key)

    @classmethod
    def start(cls, args: Any, label: str = "rollout") -> "WandbRun | None":
        """A new run from `--use-wandb` and friends; None when wandb is off. (`args`: the whole namespace, which
        the run records as its config; the run's own flags are read from it once, as `ObservabilityConfig`.)"""
        return cls._init(args, label=label)

    @classmethod
    def join(cls, args: Any, run_id: str, label: str = "trainer") -> "WandbRun | None":
        """Another process's handle on an existing run (wandb's documented resume)."""
        return cls._init(args, label=label, id=run_id, resume="allow")

    @classmethod
    def _init(cls, args: Any, *, label: str, **kw: Any) -> "WandbRun | None":
        config = ObservabilityConfig.from_args(args)
        if not config.use_wandb or config.wandb_mode == "disabled":
            return None
        import wandb

        d = _prepare_env(config)
        run = wandb.init(
            project=config.wandb_project,
            group=config.wandb_group,
            name=config.wandb_run_name,
            dir=str(d),
            mode=config.wandb_mode,
            config=_config(args),
            settings=wandb.Settings(x_label=label, console="off"),
            **kw,
        )
        return cls(run)

    @property
    def id(self) -> str:
        return self.run.id

    @property
    def dir(self) -> str:
        """The run's directory (`.../offline-run-<time>-<id>`)."""
        return str(Path(self.run.dir).parent)

    def _define(self, step_key: str) -> None:
        if step_key in self._defined:
            return
        ns = step_key.split("/", 1)[0]
        self.run.define_metric(step_key)
        self.run.define_metric(f"{ns}/*", step_metric=step_key)
        self._defined.add(step_key)

    def log(self, metrics: dict, step_key: str, step: int | None = None) -> None:
        """Log `metrics` (keys `<ns>/...`) against `step_key`, which must be in `metrics` or given as `step`."""
        if not metrics:
            return
        if step_key not in metrics:
            if step is None:
                raise ValueError(f"wandb log: metrics have no {step_key!r} and no step was given")
            metrics = {**metrics, step_key: step}
        with self._lock:
            try:
                self._define(step_key)
                self.run.log(metrics)
            except Exception as e:  # noqa: BLE001 - a dead dashboard must not stop training
                logger.warning("wandb: dropping %d metrics for %s: %s: %s", len(metrics), step_key, type(e).__name__, e)

    @staticmethod
    def table(columns: list[str], rows: list[list[Any]]) -> Any:
        import wandb

        return wandb.Table(columns=columns, data=rows)

    def finish(self, timeout: float = 30.0, *, end_session: bool = False) -> None:
        """Close the run; offline, wait until its files are complete (callers read them or exit).

        `end_session`: also stop this process's wandb service (`wandb.teardown`, which finishes any
        other run of the process too). A command's orderly stop does this: it kills its leftover
        child processes at exit, the service among them, and wandb's own atexit teardown would then
        print a `ConnectionResetError` traceback."""
        rdir, offline = self.dir, self.run.settings.mode == "offline"
        try:
            self.run.finish()
            if offline:
                from slime.observability.wandb_reader import wait_closed

                if not wait_closed(rdir, timeout=timeout):
                    logger.warning("wandb: run %s not closed on disk after %.0f s", self.id, timeout)
        finally:
            if end_session:
                end_wandb_session()


def end_wandb_session() -> None:
    """Stop this process's wandb service in order (nothing is left for wandb's atexit hook); a
    failure is logged, never raised: the run's data is already written."""
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is None:  # never imported: no service
        return
    try:
        wandb.teardown()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - stopping; wandb calls sys.exit on a service error
        logger.warning("wandb: stopping the service: %s: %s", type(e).__name__, e)
