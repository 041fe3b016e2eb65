"""Where user code is imported from, the same on the driver and on every Ray worker: the working
directory, then the user's `PYTHONPATH` in its order, then (only when `slime` is not installed in the
interpreter) the checkout holding the `slime` package.

Why this order: a slime user keeps plugins in a repository of their own (often in an `examples/`
package, slime's layout) and names them by dotted path. Python puts the working directory before
`PYTHONPATH`, and Ray puts the driver's working directory first on its workers; our checkout goes
last so nothing in it shadows the user's modules. Our own bundled recipes (`examples/` of this
checkout) are a namespace package, without `__init__.py`: a user's `examples` package with one wins
wherever it sits on the path. The CLI's import check runs with this path (`apply_to_sys_path`), so a
plugin that a worker could not import fails before Ray starts, naming its flag.
"""

from __future__ import annotations

import json
import os
import sys
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "slime-rollout"


def package_root() -> str:
    """The directory holding this `slime` package (a checkout, or site-packages)."""
    return str(Path(__file__).resolve().parents[2])


def _installed_root() -> str | None:
    """The directory this interpreter imports `slime` from without any `PYTHONPATH` (an editable or
    a regular install of the distribution), or None when it is not installed."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    direct = dist.read_text("direct_url.json")
    if direct:
        info = json.loads(direct)
        if info.get("dir_info", {}).get("editable") and str(info.get("url", "")).startswith("file://"):
            return str(Path(info["url"][len("file://") :]).resolve())
    init = next((f for f in dist.files or () if str(f).replace("\\", "/") == "slime/__init__.py"), None)
    return str(Path(dist.locate_file(init)).resolve().parents[1]) if init is not None else None


def user_pythonpath(environ: dict[str, str] | None = None) -> list[str]:
    """The user's `PYTHONPATH` entries, absolute, in their order (empty entries dropped)."""
    value = (os.environ if environ is None else environ).get("PYTHONPATH", "")
    return [os.path.abspath(p) for p in value.split(os.pathsep) if p]


def worker_path(cwd: str | None = None, environ: dict[str, str] | None = None) -> list[str]:
    """The import path user code sees: working directory, the user's `PYTHONPATH`, then our checkout
    when the interpreter would not find `slime` otherwise. No entry twice (the first one stays)."""
    cwd = os.path.abspath(cwd or os.getcwd())
    entries = [cwd, *user_pythonpath(environ)]
    root = package_root()
    if root not in entries and _installed_root() != root:
        entries.append(root)
    return list(dict.fromkeys(entries))


def worker_pythonpath(cwd: str | None = None, environ: dict[str, str] | None = None) -> str:
    """`worker_path` as the `PYTHONPATH` value Ray's workers are started with."""
    return os.pathsep.join(worker_path(cwd, environ))


def apply_to_sys_path(cwd: str | None = None, environ: dict[str, str] | None = None) -> None:
    """Put `worker_path` first on this process's `sys.path`, in its order, so the driver imports a
    plugin from where the workers will (a console script's `sys.path` starts with its `bin/`, not
    the working directory). Later duplicates of those entries are removed."""
    entries = worker_path(cwd, environ)
    rest = [p for p in sys.path if (os.path.abspath(p) if p else os.path.abspath(os.getcwd())) not in entries]
    sys.path[:] = entries + rest
