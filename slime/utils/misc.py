"""Small helpers slime plugins import (`load_function`) and port handling."""

from __future__ import annotations

import importlib
import socket
from typing import Any, Callable

from slime.utils.types import decode_int32_meta_array  # noqa: F401 - slime plugins import it from here


class PluginLoadError(ValueError):
    """A `--*-path` flag points at something that cannot be imported."""


def load_function(path: str, flag: str | None = None) -> Callable[..., Any]:
    """Import `pkg.module.attr` and return the attribute (slime's contract).

    Errors name the flag (when given) and the underlying import failure, instead of a bare
    ModuleNotFoundError from deep inside importlib.
    """
    where = f"{flag} {path!r}" if flag else repr(path)
    if not isinstance(path, str) or "." not in path:
        raise PluginLoadError(f"{where}: expected a dotted path 'package.module.attribute'")
    module_path, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_path)
    except Exception as e:  # noqa: BLE001 - any import failure is reported the same way
        raise PluginLoadError(f"{where}: cannot import module {module_path!r}: {type(e).__name__}: {e}") from e
    try:
        return getattr(module, attr)
    except AttributeError as e:
        raise PluginLoadError(f"{where}: module {module_path!r} has no attribute {attr!r}") from e


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port that is free right now on `host` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def get_by_path(obj: Any, dotted: str) -> Any:
    """`get_by_path(row, "extra_info.answer")`; raises KeyError naming the missing part."""
    cur = obj
    for part in dotted.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise KeyError(part)
    return cur
