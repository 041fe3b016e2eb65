"""transformers' import table read from slime's cache (slime.utils.hf_import_cache): the same lazy modules as
transformers' own scan, no scan when the cache is warm, a rescan on any change, and no harm when it fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from slime.utils import hf_import_cache as cache

# what a process's lazy `transformers` and `transformers.models` modules know, and how many directories it scanned
PROBE = textwrap.dedent(
    """
    import json, sys
    import slime  # installs the hook unless SLIME_HF_IMPORT_CACHE=0
    import transformers, transformers.models
    from transformers.utils import import_utils

    def table(m):
        return {
            "classes": sorted(m._class_to_module.items()),
            "modules": sorted(m._modules),
            "missing": sorted((k, sorted(v)) for k, v in getattr(m, "_object_missing_backend", {}).items()),
        }

    scan = import_utils.create_import_structure_from_path
    print(json.dumps({
        "transformers": table(sys.modules["transformers"]),
        "models": table(sys.modules["transformers.models"]),
        "scanned_dirs": scan.cache_info().misses,
        "hooked": type(scan).__name__ == "function",  # ours; transformers' own is an lru_cache wrapper
    }))
    """
)


def probe(cache_dir: Path, *, hook: bool = True) -> dict:
    env = {**os.environ, "SLIME_CACHE": str(cache_dir), "SLIME_HF_IMPORT_CACHE": "1" if hook else "0"}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_lazy_modules_are_transformers_own_and_a_warm_cache_scans_nothing(tmp_path):
    own = probe(tmp_path / "unused", hook=False)
    cold = probe(tmp_path)  # scans, writes the cache
    warm = probe(tmp_path)  # reads it
    assert not own["hooked"] and cold["hooked"] and warm["hooked"]
    assert own["scanned_dirs"] > 500  # the tree, twice (`transformers`, then `transformers.models`)
    for run in (cold, warm):
        assert run["transformers"] == own["transformers"]
        assert run["models"] == own["models"]
    assert cold["scanned_dirs"] > 250
    assert warm["scanned_dirs"] < 20  # only directories outside models/ (none of the ~550 under it)
    assert len(list((tmp_path / cache.CACHE_SUBDIR).glob("*.json"))) == 1


def fake_tree(root: Path) -> Path:
    models = root / "models"
    for name, body in {"a/__init__.py": "", "a/modeling_a.py": "x", "b/c/conf.py": "yy"}.items():
        (models / name).parent.mkdir(parents=True, exist_ok=True)
        (models / name).write_text(body)
    (models / "__init__.py").write_text("")
    return models


class CountingScan:
    """A stand-in for transformers' scan: a table naming the files it found, and how often it ran."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __call__(self, module_path):
        path = Path(module_path)
        path = path.parent if path.is_file() else path
        self.calls.append(str(path))
        files = sorted(str(p.relative_to(path)) for p in path.rglob("*.py"))
        return {"a": {frozenset({"torch"}): {"modeling_a": set(files)}}, frozenset(): {"top": {"X", "Y"}}}

    def cache_clear(self):
        pass


def test_a_changed_file_or_a_broken_cache_rescans_and_other_paths_go_the_original_way(tmp_path):
    models = fake_tree(tmp_path / "tf")
    scanner = tmp_path / "tf" / "import_utils.py"
    scanner.write_text("# scanner")
    store = tmp_path / "cache"

    def fresh() -> tuple[CountingScan, object]:
        scan = CountingScan()
        return scan, cache.cached_scan(scan, models, scanner, store)

    scan, wrapped = fresh()
    first = wrapped(models)
    assert first == scan(models) and len(scan.calls) == 2  # ours, then the comparison's
    assert wrapped(os.fspath(models / "__init__.py")) == first and len(scan.calls) == 2  # kept in the process
    assert wrapped(models) is not wrapped(models)  # a fresh copy each call, as a rescan gives

    scan, wrapped = fresh()  # another process: read from the file
    assert wrapped(models) == first and scan.calls == []
    assert wrapped(models / "a") == scan(models / "a") and len(scan.calls) == 2  # not models/: transformers' way

    (models / "b" / "c" / "conf.py").write_text("yyy")  # a file changed: its size (and mtime) differ
    scan, wrapped = fresh()
    assert wrapped(models) == scan(models) and len(scan.calls) == 2
    scan, wrapped = fresh()
    wrapped(models)
    assert scan.calls == []  # the rescan was written back

    (models / "d.py").write_text("")  # a file added
    scan, wrapped = fresh()
    wrapped(models)
    assert len(scan.calls) == 1

    for broken in ("not json", json.dumps({"format": cache.FORMAT, "fingerprint": "x", "table": 1}), "[]"):
        next((store / cache.CACHE_SUBDIR).glob("*.json")).write_text(broken)
        scan, wrapped = fresh()
        assert wrapped(models) == scan(models) and len(scan.calls) == 2


def test_a_cache_that_cannot_be_written_still_gives_the_table(tmp_path):
    models = fake_tree(tmp_path / "tf")
    scanner = tmp_path / "tf" / "import_utils.py"
    scanner.write_text("")
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    scan = CountingScan()
    wrapped = cache.cached_scan(scan, models, scanner, blocked)
    assert wrapped(models) == scan(models)


def test_install_after_transformers_is_imported_does_nothing():
    import transformers  # noqa: F401 - imported for its effect

    before = list(sys.meta_path)
    assert cache.install() is False
    assert sys.meta_path == before


names = st.text(alphabet="abcdefghij_", min_size=1, max_size=6)
leaf = st.dictionaries(names, st.sets(names, max_size=3), max_size=3)
level = st.dictionaries(st.frozensets(names, max_size=2), leaf, max_size=3)
tables = st.recursive(level, lambda inner: st.dictionaries(names, inner, max_size=3), max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(tables)
def test_encoding_round_trips_every_table_shape(table):
    text = json.dumps(cache.encode(table))
    assert cache.decode(json.loads(text)) == table
