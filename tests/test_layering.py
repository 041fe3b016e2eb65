"""The architecture holds: every folder has its layer, no file imports a higher layer (but the shims at slime's
public paths, named below with their reason), and no files import each other in a circle."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# lower number = lower layer; a folder may import its own layer and the ones below (README "How it fits together")
LAYERS = {
    "train_batch": 0,  # pure computation over lengths and tensors: imports nothing of ours
    "utils": 1,
    "backends": 1,
    "weights": 2,  # both sides of weight sync: the engine's routes, the fleet and the trainer import it
    "tools": 3,
    "engine": 3,
    "sandbox": 3,
    "observability": 3,
    "interactions": 4,
    "fleet": 4,
    "rollout": 5,
    "agent": 6,
    "rollout_plugins": 6,
    "ray": 7,
    "train": 8,
    "cli": 9,
    "testing": 9,
    "slime": 10,  # slime/__main__.py, the package's entry
}
# (file, imported module) -> why it may import upward
UPWARD_SHIMS = {
    (
        "slime/utils/http_utils.py",
        "slime.rollout.runtime",
    ): "slime's public http_utils is a view over the process's bound rollout runtime (imported when called)",
    ("slime/train/__main__.py", "slime.cli.train"): "`python -m slime.train` is the slime-train command",
    (
        "slime/utils/plugin_args.py",
        "slime.cli.parser",
    ): "a hand-built namespace entering at a slime plugin path gets the parser's defaults (imported when called)",
}
# circles still to break, each with what ties it (this list only shrinks)
KNOWN_CIRCLES: list[frozenset[str]] = []
# slime/agent/'s two wings: the gateway serves any agent, sandboxed or not; agents in sandboxes reach the model only
# through its URL. Neither imports the other, nor the files above them in slime/agent/ (rollout, adapters, shims),
# but the agent's flags and the crossings named here.
AGENT_WINGS = ("slime/agent/gateway/", "slime/agent/sandboxes/")
WING_CROSSINGS = {
    (
        "slime/agent/sandboxes/command_agent.py",
        "slime.agent.gateway.protocols.common",
    ): "flatten_content: an agent's final message as text, read as the gateway reads message content",
}
# slime's public paths whose code moved into a wing: each name is bound to the very module it names
MOVED_SLIME_PATHS = {
    "slime.agent.sandbox": "slime.agent.sandboxes.sandbox",
    "slime.agent.harness": "slime.agent.sandboxes.harness",
    "slime.agent.harness.common": "slime.agent.sandboxes.harness.common",
    "slime.agent.harness.claude_code": "slime.agent.sandboxes.harness.claude_code",
    "slime.agent.harness.codex": "slime.agent.sandboxes.harness.codex",
    "slime.agent.trajectory": "slime.agent.gateway.trajectory",
    "slime.agent.parsing": "slime.agent.gateway.parsing",
}


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
            modules = [
                f"{node.module}.{a.name}" if module_file(f"{node.module}.{a.name}") else node.module for a in node.names
            ]
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


def test_the_agent_wings_do_not_import_each_other():
    crossing = []
    for path in source_files():
        here = path.relative_to(ROOT).as_posix()
        wing = next((w for w in AGENT_WINGS if here.startswith(w)), None)
        if wing is None:
            continue
        for module, target in imports(path):
            other_wing = target.startswith("slime/agent/") and not target.startswith(wing)
            if other_wing and target != "slime/agent/flags.py" and (here, module) not in WING_CROSSINGS:
                crossing.append(f"{here} imports {module}")
    assert crossing == []


def test_every_named_exception_is_still_an_import():
    """A shim or crossing that no longer exists leaves the list (it only shrinks)."""
    found = {(path.relative_to(ROOT).as_posix(), module) for path in source_files() for module, _ in imports(path)}
    assert set(UPWARD_SHIMS) - found == set() and set(WING_CROSSINGS) - found == set()


def test_slimes_moved_paths_are_the_very_modules():
    """A plugin or slime's own test that patches `slime.agent.sandbox.asyncio` patches the code that runs."""
    for old, new in MOVED_SLIME_PATHS.items():
        assert importlib.import_module(old) is importlib.import_module(new), old


def stated_layers(text: str) -> list[set[str]]:
    """The layering rule as a page states it: `a` < `b`, `c` < ... (after "Lower layers never import upper ones")."""
    rule = re.search(r"Lower layers never import upper ones[^:]*:(.*?)[;.]", text, re.S)
    assert rule, "the page states no layering rule"
    return [set(re.findall(r"`(\w+)`", step)) for step in rule.group(1).split("<")]


def test_the_readme_maps_every_folder_and_the_docs_state_the_layers_the_test_holds():
    readme = (ROOT / "README.md").read_text()
    mapped = set(re.findall(r"^\| `slime/(\w+)/` \|", readme, re.M))
    folders = {p.name for p in (ROOT / "slime").iterdir() if p.is_dir() and any(p.glob("*.py"))}
    assert folders - mapped == set()
    layers = [{f for f, n in LAYERS.items() if n == number and f != "slime"} for number in sorted(set(LAYERS.values()))]
    layers = [step for step in layers if step]
    assert stated_layers(readme) == layers
    assert stated_layers((ROOT / "docs" / "design" / "architecture.md").read_text()) == layers
