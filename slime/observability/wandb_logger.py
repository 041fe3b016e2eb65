"""One wandb run shared by the manager (primary) and the controller (secondary) processes.

The primary creates the run and leaves a small sidecar file in the wandb dir with the run's
attach id and the address of its local wandb service. The secondary attaches to that service
(`wandb._attach`), so both processes write into the *same* run directory, in offline mode too
(wandb's own "shared" mode needs the server to merge writers, so it is only the fallback for
online runs whose secondary sits on another host). Each namespace is plotted against its own
step key (`rollout/step`, `perf/step`, `eval/step`, ...) via `define_metric`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

_run: Any = None
_role: str | None = None
_defined: set[str] = set()
_sidecar_path: Path | None = None
_pid: int | None = None  # process that set up `_run`; a forked child must not finish the run
_fallback_dir: str | None = None  # primary's run dir when attaching failed (metrics.jsonl still goes there)
_lock = threading.Lock()
STANDARD_STEP_KEYS = ("rollout/step", "perf/step", "eval/step")


def wandb_dir(args: Any) -> Path:
    """--wandb-dir, else $WANDB_DIR, else ./outputs/wandb (inside the work tree, never $HOME)."""
    d = getattr(args, "wandb_dir", None) or os.environ.get("WANDB_DIR") or os.path.join(os.getcwd(), "outputs", "wandb")
    return Path(d).resolve()


def _prepare_env(args: Any) -> Path:
    """Keep wandb's cache/staging/config dirs next to the runs unless the user set them."""
    d = wandb_dir(args)
    d.mkdir(parents=True, exist_ok=True)
    for var, sub in (("WANDB_CACHE_DIR", ".cache"), ("WANDB_DATA_DIR", ".data"), ("WANDB_CONFIG_DIR", ".config")):
        os.environ.setdefault(var, str(d / sub))
    return d


def _sidecar(args: Any, run_id: str) -> Path:
    return wandb_dir(args) / f"slime-wandb-{run_id}.json"


def _mode(args: Any) -> str:
    return getattr(args, "wandb_mode", None) or "offline"


def _config(args: Any) -> dict:
    """The JSON-friendly part of the args namespace (wandb chokes on arbitrary objects)."""
    out = {}
    for k, v in vars(args).items() if hasattr(args, "__dict__") else []:
        if isinstance(v, (str, int, float, bool)) or v is None:
            out[k] = v
        elif isinstance(v, (list, tuple)) and all(isinstance(x, (str, int, float, bool)) for x in v):
            out[k] = list(v)
    return out


def is_active() -> bool:
    return _run is not None


def run_dir() -> str | None:
    """The run's directory (`.../offline-run-<time>-<id>`), or None without an active run."""
    return run_dir_of(_run) or _fallback_dir


def run_dir_of(run: Any) -> str | None:
    if run is None:
        return None
    try:
        return str(Path(run.dir).parent)
    except Exception:  # noqa: BLE001 - attached runs may not know their dir on old wandb
        return None


def init_wandb_primary(args: Any) -> str | None:
    """Create the run (manager process); returns its id for `init_wandb_secondary`, or None when off."""
    global _run, _role, _sidecar_path, _pid
    if not getattr(args, "use_wandb", False) or _mode(args) == "disabled":
        return None
    import wandb

    d = _prepare_env(args)
    run = wandb.init(
        project=getattr(args, "wandb_project", None) or "slime",
        group=getattr(args, "wandb_group", None),
        name=getattr(args, "wandb_run_name", None),
        dir=str(d), mode=_mode(args), config=_config(args),
        settings=wandb.Settings(x_label="manager", console="off"),
    )
    _run, _role, _pid = run, "primary", os.getpid()
    _defined.clear()
    for key in STANDARD_STEP_KEYS:
        _define(key)
    info = {"run_id": run.id, "attach_id": getattr(run, "_attach_id", None) or run.id,
            "service": os.environ.get("WANDB_SERVICE"), "run_dir": run_dir(), "mode": _mode(args),
            "pid": os.getpid()}
    _sidecar_path = _sidecar(args, run.id)
    tmp = _sidecar_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, _sidecar_path)
    return run.id


def init_wandb_secondary(args: Any, run_id: str | None) -> None:
    """Join the primary's run from another process (controller); a no-op in the primary's own process."""
    global _run, _role, _pid, _fallback_dir
    if not getattr(args, "use_wandb", False) or not run_id or _mode(args) == "disabled":
        return
    if _run is not None and _run.id == run_id:
        if _pid != os.getpid():  # forked from the primary: wandb re-attaches the inherited run itself
            _role, _pid = "secondary", os.getpid()
        return
    import wandb

    _prepare_env(args)
    try:
        info = json.loads(_sidecar(args, run_id).read_text())
    except (OSError, ValueError):
        info = {}
    if info.get("service") and not os.environ.get("WANDB_SERVICE"):
        os.environ["WANDB_SERVICE"] = info["service"]  # the service a Ray actor did not inherit
    try:
        # media (tables) are written by this process: point it at the primary's run directory
        wandb.setup(settings=wandb.Settings(root_dir=str(wandb_dir(args))))
        run = wandb._attach(attach_id=info.get("attach_id") or run_id)
        if run is None:
            raise RuntimeError("wandb._attach returned None")
        if info.get("run_dir") and Path(run.dir).parent != Path(info["run_dir"]):
            logger.warning("wandb: attached run writes media to %s, primary's run dir is %s", run.dir, info["run_dir"])
    except Exception as e:  # noqa: BLE001 - fall back below, never crash the controller for a dashboard
        if _mode(args) != "online":
            logger.warning("wandb: cannot attach to run %s (%s); this process logs to metrics.jsonl only", run_id, e)
            _fallback_dir = info.get("run_dir")
            return
        logger.warning("wandb: attach to run %s failed (%s); joining it in wandb 'shared' mode", run_id, e)
        run = wandb.init(
            id=run_id, project=getattr(args, "wandb_project", None) or "slime", dir=str(wandb_dir(args)),
            mode="shared", settings=wandb.Settings(x_primary=False, x_label="controller",
                                                   x_update_finish_state=False, console="off"),
        )
    _run, _role, _pid = run, "secondary", os.getpid()
    _defined.clear()


def _define(step_key: str) -> None:
    ns = step_key.split("/", 1)[0]
    if step_key in _defined or _run is None:
        return
    _run.define_metric(step_key)
    _run.define_metric(f"{ns}/*", step_metric=step_key)
    _defined.add(step_key)


def log(args: Any, metrics: dict, step_key: str, step: int | None = None) -> None:
    """Log `metrics` (keys `<ns>/...`) against `step_key`, which must be in `metrics` or given as `step`."""
    if _run is None or not metrics:
        return
    if step_key not in metrics:
        if step is None:
            raise ValueError(f"wandb log: metrics have no {step_key!r} and no step was given")
        metrics = {**metrics, step_key: step}
    with _lock:
        try:
            _define(step_key)
            _run.log(metrics)
        except Exception as e:  # noqa: BLE001 - a dead dashboard must not stop training
            logger.warning("wandb: dropping %d metrics for %s: %s: %s", len(metrics), step_key, type(e).__name__, e)


def make_table(columns: list[str], rows: list[list[Any]]) -> Any:
    import wandb

    return wandb.Table(columns=columns, data=rows)


def finish() -> None:
    """Primary: close the run and remove the sidecar. Secondary: detach only (the run lives on)."""
    global _run, _role, _sidecar_path, _pid, _fallback_dir
    with _lock:
        run, role, sidecar, owner_pid = _run, _role, _sidecar_path, _pid
        _run, _role, _sidecar_path, _pid, _fallback_dir = None, None, None, None, None
        _defined.clear()
    if run is None:
        return
    if role == "primary" and owner_pid == os.getpid():
        rdir = run_dir_of(run)
        run.finish()
        if rdir and run.settings.mode == "offline":
            # wandb-core flushes the transaction log after finish() returns; wait so that the
            # run directory is complete when we return (callers read it or exit right away)
            from slime.observability.wandb_reader import wait_closed

            if not wait_closed(rdir, timeout=30):
                logger.warning("wandb: run %s not closed on disk after 30 s", run.id)
        if sidecar is not None and sidecar.exists():
            sidecar.unlink()
