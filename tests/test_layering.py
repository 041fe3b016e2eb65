"""The architecture holds: every folder has its layer, no file imports a higher layer (but the shims at slime's
public paths, named below with their reason), and no files import each other in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# lower number = lower layer; a folder may import its own layer and the ones below (README "How it fits together")
LAYERS = {
    "utils": 0, "backends": 0,
    "tools": 1, "engine": 1, "sandbox": 1, "observability": 1, "train_batch": 1,
    "interactions": 2, "fleet": 2,
    "rollout": 3,
    "agent": 4, "rollout_plugins": 4,
    "ray": 5,
    "train": 6,
    "cli": 7, "testing": 7, "slime": 8,  # slime/__main__.py, the package's entry
}
# (file, imported module) -> why it may import upward
UPWARD_SHIMS = {
    ("slime/utils/http_utils.py", "slime.rollout.runtime"):
        "slime's public http_utils is a view over the process's bound rollout runtime (imported when called)",
    ("slime/utils/dp_schedule.py", "slime.train_batch.schedule"):
        "slime's public dp_schedule path over our schedule (imported when called)",
    ("slime/train/__main__.py", "slime.cli.train"): "`python -m slime.train` is the slime-train command",
    ("slime/utils/plugin_args.py", "slime.cli.parser"):
        "a hand-built namespace entering at a slime plugin path gets the parser's defaults (imported when called)",
}
# circles still to break, each with what ties it (this list only shrinks)
KNOWN_CIRCLES: list[frozenset[str]] = []


def source_files() -> list[Path]:
    return sorted([*ROOT.glob("slime/**/*.py"), *ROOT.glob("rollout_plugins/**/*.py")])


def module_file(module: str) -> str | None:
    base = ROOT / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate.relative_to(ROOT).as_posix()
    return None


def folder(path: str) -> str:
    parts = path.split("/")
    if parts[0] == "rollout_plugins":
        return "rollout_plugins"
    return parts[1] if len(parts) > 2 else "slime"


def imports(path: Path) -> list[tuple[str, str]]:
    """(imported module, its file) for every import of ours in the file, at any depth (lazy ones too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import sub` imports the submodule when there is one
            modules = [f"{node.module}.{a.name}" if module_file(f"{node.module}.{a.name}") else node.module
                       for a in node.names]
        else:
            continue
        for module in modules:
            if module.split(".")[0] in ("slime", "rollout_plugins") and (target := module_file(module)):
                out.append((module, target))
    return out


def graph() -> dict[str, set[str]]:
    return {path.relative_to(ROOT).as_posix(): {target for _, target in imports(path)} for path in source_files()}


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.add(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_every_folder_has_a_layer():
    folders = {folder(p.relative_to(ROOT).as_posix()) for p in source_files()}
    assert folders - set(LAYERS) == set()


def test_no_file_imports_a_higher_layer():
    upward = []
    for path in source_files():
        here = path.relative_to(ROOT).as_posix()
        for module, target in imports(path):
            if LAYERS[folder(target)] > LAYERS[folder(here)] and (here, module) not in UPWARD_SHIMS:
                upward.append(f"{here} ({folder(here)}) imports {module} ({folder(target)})")
    assert upward == []


def test_no_import_circle():
    assert [sorted(c) for c in circles(graph()) if c not in KNOWN_CIRCLES] == []


def test_the_circle_finder_finds_a_circle_and_the_layering_an_upward_import():
    edges = {"a.py": {"b.py"}, "b.py": {"c.py"}, "c.py": {"a.py"}, "d.py": {"a.py"}, "e.py": set()}
    assert circles(edges) == [frozenset({"a.py", "b.py", "c.py"})]
    assert folder("slime/utils/misc.py") == "utils" and folder("rollout_plugins/multi_turn/x.py") == "rollout_plugins"
    assert LAYERS["utils"] < LAYERS["rollout"]  # so http_utils -> rollout.runtime is upward, and named above
