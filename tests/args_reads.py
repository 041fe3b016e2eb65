"""Which flags a package reads off a namespace (`<...>args.<flag>`, or `getattr(<...>args, "<flag>"...)`), by file:
the scan behind each package's "reads its flags from its config, not from args" test (issue #33)."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _is_args(node: ast.expr) -> bool:
    return ast.unparse(node).split(".")[-1].endswith("args")


def flag_reads(package: str, dests: Iterable[str], root: Path = ROOT) -> dict[str, set[str]]:
    """file (relative to `root`) -> the flags among `dests` that `root/<package>/**/*.py` reads off an `args`."""
    dests = set(dests)
    out: dict[str, set[str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Attribute) and node.attr in dests and _is_args(node.value):
                out.setdefault(rel, set()).add(node.attr)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and _is_args(node.args[0])
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value in dests
            ):
                out.setdefault(rel, set()).add(node.args[1].value)
    return out
