"""transformers' lazy import table, read from a file instead of rebuilt from its source tree in every process.

Why: `import transformers` builds the table behind its lazy module by reading every source file under
`transformers/models/` (~2,500 files: their `__all__` lines and backend decorators), ~0.45 CPU s; importing
`transformers.models` (any model load) rebuilds it, since the scan's `lru_cache` (128 entries) is smaller
than the tree's ~550 directories. A cold start paid it three times on its critical path (the engines'
preload twice, the manager's tokenizer once), as does every trainer and test process. The table depends
only on those files and the scanning code, so it is kept under `slime_cache_dir()`, with a fingerprint
of every file's path, size and mtime (~30 ms to check) and of the scanner's own file; any change rescans.

`install()` adds a one-shot import hook: when `transformers.utils.import_utils` loads, its
`create_import_structure_from_path` is wrapped for the `models/` directory only; any other path, a
transformers without that function, or a cache that cannot be read or written goes the original way.
Once transformers is imported, `install()` does nothing.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path
from typing import Any, Callable

from slime.utils.cache_dir import slime_cache_dir

# hashlib and json are imported when transformers is: `install()` runs on every `import slime`

SCANNER = "transformers.utils.import_utils"
SCAN_FUNCTION = "create_import_structure_from_path"
CACHE_SUBDIR = "transformers-import"
FORMAT = 1  # the file's layout below; bump on a change


def install(cache_dir: Path | None = None) -> bool:
    """Hook the next import of transformers (True), or do nothing because it is imported already (False)."""
    if SCANNER in sys.modules:
        return False
    if not any(isinstance(f, _ScannerFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _ScannerFinder(cache_dir))
    return True


class _ScannerFinder:
    """Finds transformers' scanner module the normal way and hands back its spec with a loader that wraps
    the scan once the module has run; leaves `sys.meta_path` on first use."""

    def __init__(self, cache_dir: Path | None):
        self.cache_dir = cache_dir

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != SCANNER:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None  # the import system goes on to the other finders
        spec.loader = _WrappingLoader(spec.loader, self.cache_dir)
        return spec


class _WrappingLoader:
    def __init__(self, loader: Any, cache_dir: Path | None):
        self.loader = loader
        self.cache_dir = cache_dir

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        module.__loader__ = module.__spec__.loader = self.loader  # the module keeps its own loader
        self.loader.exec_module(module)
        scan = getattr(module, SCAN_FUNCTION, None)
        if callable(scan) and getattr(module, "__file__", None):
            models_dir = Path(module.__file__).parent.parent / "models"  # as transformers spells it: compared as text
            setattr(module, SCAN_FUNCTION, cached_scan(scan, models_dir, Path(module.__file__), self.cache_dir))


def cached_scan(scan: Callable[[Any], Any], models_dir: Path, scanner_file: Path, cache_dir: Path | None) -> Callable:
    """`scan`, except for `models_dir` (or its `__init__.py`, as transformers passes either): that table is
    read from the cache file when the fingerprint matches, else scanned and written there (once a process)."""
    import functools

    own = {os.fspath(models_dir), os.fspath(models_dir / "__init__.py")}
    kept: list[Any] = []  # the table's encoded form: each call decodes a fresh copy, as a rescan would give

    @functools.wraps(scan)
    def wrapper(module_path: Any) -> Any:
        if os.fspath(module_path) not in own:
            return scan(module_path)
        if not kept:
            encoded = _load_or_scan(scan, module_path, models_dir, scanner_file, cache_dir or slime_cache_dir())
            if encoded is None:  # a table this module cannot encode: transformers' own way, every time
                return scan(module_path)
            kept.append(encoded)
        return decode(kept[0])

    def cache_clear() -> None:
        kept.clear()
        scan.cache_clear()

    wrapper.cache_clear = cache_clear  # type: ignore[attr-defined]
    if hasattr(scan, "cache_info"):
        wrapper.cache_info = scan.cache_info  # type: ignore[attr-defined]
    return wrapper


def fingerprint(models_dir: Path, scanner_file: Path) -> str:
    """Every source file under `models_dir` (path, size, mtime) and the scanner's own file."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    st = scanner_file.stat()
    h.update(f"{scanner_file}\0{st.st_mtime_ns}\0{st.st_size}\n".encode())
    stack = [os.fspath(models_dir)]
    while stack:
        d = stack.pop()
        with os.scandir(d) as entries:
            for e in sorted(entries, key=lambda e: e.name):
                if e.is_dir(follow_symlinks=False):
                    if e.name != "__pycache__":
                        stack.append(e.path)
                elif e.name.endswith(".py"):
                    st = e.stat()
                    h.update(f"{e.path}\0{st.st_mtime_ns}\0{st.st_size}\n".encode())
    return h.hexdigest()


def _load_or_scan(scan: Callable, module_path: Any, models_dir: Path, scanner_file: Path, cache_dir: Path) -> Any:
    """The table's encoded form, from the cache file or from a scan (then written there); None if the scan
    holds something `encode` does not know."""
    import hashlib
    import json

    from slime.utils.atomic_file import write_atomic

    try:
        mark = fingerprint(models_dir, scanner_file)
    except OSError:
        mark = None
    name = hashlib.blake2b(os.fsencode(models_dir), digest_size=8).hexdigest()
    path = cache_dir / CACHE_SUBDIR / f"{name}.json"
    if mark is not None:
        try:
            kept = json.loads(path.read_text())
            if kept.get("format") == FORMAT and kept.get("fingerprint") == mark:
                return kept["table"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    try:
        table = encode(scan(module_path))
    except TypeError:
        return None
    if mark is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # processes starting together each write a whole file
            write_atomic(path, json.dumps({"format": FORMAT, "fingerprint": mark, "table": table}))
        except OSError:
            pass
    return table


def encode(x: Any) -> Any:
    """The table as JSON: dicts as [key, value] pairs (keys are names or frozensets of backends), sets as
    sorted lists, each tagged so `decode` rebuilds the same types."""
    if isinstance(x, dict):
        return {"d": [[encode(k), encode(v)] for k, v in x.items()]}
    if isinstance(x, frozenset):
        return {"f": sorted(x)}
    if isinstance(x, set):
        return {"s": sorted(x)}
    if isinstance(x, str):
        return x
    raise TypeError(f"unexpected {type(x).__name__} in transformers' import table")


def decode(x: Any) -> Any:
    if isinstance(x, str):
        return x
    if "d" in x:
        return {decode(k): decode(v) for k, v in x["d"]}
    if "f" in x:
        return frozenset(x["f"])
    return set(x["s"])
