"""Small helpers slime plugins import from `slime.utils.misc` (`load_function`, `SingletonMeta`,
`group_by`, ...) and port handling."""

from __future__ import annotations

import importlib
import socket
import subprocess
from collections import defaultdict
from typing import Any, Callable, Iterable, Iterator

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


def is_port_available(port: int, host: str = "127.0.0.1") -> bool:
    """Whether `port` can be bound on `host` right now (loopback by default: nothing here listens
    on every interface)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
            return True
        except (OSError, OverflowError):
            return False


def get_by_path(obj: Any, dotted: str) -> Any:
    """`get_by_path(row, "extra_info.answer")`; raises KeyError naming the missing part."""
    cur = obj
    for part in dotted.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            raise KeyError(part)
    return cur


class SingletonMeta(type):
    """slime's metaclass: the first `Cls(...)` builds the one instance, later calls return it and
    IGNORE their arguments. Kept for plugins written for slime; this project's own state lives on
    objects the controller owns (`RolloutRuntime`), never here."""

    _instances: dict[type, Any] = {}

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls not in cls._instances:
            cls._instances[cls] = super().__call__(*args, **kwargs)
        return cls._instances[cls]

    def clear_instances(cls) -> None:
        cls._instances = {}


def exec_command(cmd: str, capture_output: bool = False) -> str | None:
    """Run `cmd` with bash (echoed first); raises CalledProcessError on a non-zero exit."""
    print(f"EXEC: {cmd}", flush=True)
    result = subprocess.run(["bash", "-c", cmd], check=True, capture_output=capture_output, text=capture_output or None)
    return result.stdout if capture_output else None


def get_current_node_ip() -> str:
    """This node's address as Ray sees it (IPv6 brackets stripped)."""
    import ray  # here: CPU-only helpers of this module must not need Ray

    return ray._private.services.get_node_ip_address().strip("[]")


def get_free_port(start_port: int = 10000, consecutive: int = 1) -> int:
    """The first port >= `start_port` such that it and the next `consecutive - 1` are free."""
    port = start_port
    while not all(is_port_available(port + i) for i in range(consecutive)):
        port += 1
    return port


def should_run_periodic_action(
    rollout_id: int, interval: int | None, num_rollout_per_epoch: int | None = None, num_rollout: int | None = None
) -> bool:
    """slime's rule: every `interval` rollouts, at each epoch end, and at the last rollout when given."""
    if interval is None:
        return False
    if num_rollout is not None and rollout_id == num_rollout - 1:
        return True
    step = rollout_id + 1
    return step % interval == 0 or (num_rollout_per_epoch is not None and step % num_rollout_per_epoch == 0)


class Box:
    """slime's wrapper that hands a Ray object reference through an actor call unresolved."""

    def __init__(self, inner: Any):
        self._inner = inner

    @property
    def inner(self) -> Any:
        return self._inner


def group_by(iterable: Iterable[Any], key: Callable[[Any], Any] | None = None) -> dict[Any, list[Any]]:
    """Like `itertools.groupby` without needing sorted input: {key: [items in order]}."""
    out: dict[Any, list[Any]] = defaultdict(list)
    for item in iterable:
        out[key(item) if key is not None else item].append(item)
    return dict(out)


def chunk_named_params_by_size(named_params: Iterable[tuple[str, Any]], chunk_size: int) -> Iterator[list]:
    """`(name, tensor)` pairs in buckets of under `chunk_size` bytes (a larger tensor alone)."""
    bucket: list[tuple[str, Any]] = []
    size = 0
    for item in named_params:
        nbytes = item[1].nbytes
        if bucket and size + nbytes >= chunk_size:
            yield bucket
            bucket, size = [], 0
        bucket.append(item)
        size += nbytes
    if bucket:
        yield bucket
