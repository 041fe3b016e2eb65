"""Upstream slime's and Megatron-LM's flags, registered from the generated `upstream_flags.json`.

Why: a slime run script passes slime's rollout flags and Megatron's trainer flags on one command line.
Every flag upstream defines is accepted and stored on `args` under upstream's `dest` with upstream's
default (slime's `reset_arg` defaults win over Megatron's), so plugins and `slime-train` read what they
expect; a flag nobody defines is still an error. The JSON is regenerated from upstream source by
`tools/gen_trainer_flags.py` (no upstream code is imported here or there).

Flags this project defines itself keep their own definition; when an upstream flag with the same option
string stores under another `dest` (e.g. slime's `--disable-rewards-normalization` ->
`rewards_normalization`), `apply_aliases` fills the upstream attribute from ours after parsing.
"""

from __future__ import annotations

import argparse
import ast
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

FLAGS_FILE = Path(__file__).with_name("upstream_flags.json")

# Megatron flags are numerous: kept out of --help (they are stored, not used by the rollout service).
_HIDDEN_ORIGINS = {"megatron"}


def json_value(text: str) -> Any:
    """argparse type for JSON-valued flags (upstream uses json.loads); the error names the flag."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {e}") from None


json_value.__name__ = "JSON"


def _bool_value(text: str) -> bool:
    low = str(text).strip().lower()
    if low in ("1", "true", "yes", "y", "on"):
        return True
    if low in ("0", "false", "no", "n", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")


def moe_freq_value(text: str) -> int | list[int]:
    """Megatron's `moe_freq_type`: an int (every N-th layer is MoE) or a per-layer list written as a
    list expression (`[1,0,1,0]`, `([1]*3+[0]*1)`), read without evaluating code."""

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            return [value(e) for e in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add)):
            left, right = value(node.left), value(node.right)
            return left * right if isinstance(node.op, ast.Mult) else left + right
        raise ValueError(ast.dump(node))

    try:
        out = value(ast.parse(str(text).strip(), mode="eval").body)
    except (SyntaxError, ValueError, TypeError):
        out = None
    if isinstance(out, int) or (isinstance(out, list) and all(type(x) is int for x in out)):
        return out
    raise argparse.ArgumentTypeError(f"expected an int or a list of 0/1 per layer such as ([1]*3+[0]*1), got {text!r}")


moe_freq_value.__name__ = "MoE layer frequency"

_TYPES: dict[str | None, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    None: str,
    "json.loads": json_value,
    "bool": _bool_value,
    "moe_freq_type": moe_freq_value,
}


@dataclass(frozen=True)
class Alias:
    """After parsing, `args.<upstream_dest>` = `args.<our_dest>` (negated when `invert`)."""

    upstream_dest: str
    our_dest: str
    invert: bool


def load_upstream_flags(path: Path = FLAGS_FILE) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["flags"]


def _kwargs(entry: dict[str, Any]) -> dict[str, Any]:
    """add_argument keyword arguments for one JSON entry."""
    arity, default = entry["arity"], entry.get("default")
    kw: dict[str, Any] = {"dest": entry["dest"], "default": default}
    conv = _TYPES.get(entry.get("type"), str)  # Megatron's custom parsers (tuple_type, ...): keep the string
    if arity in ("store_true", "store_false"):
        kw["action"] = arity
    elif arity == "store_const":
        kw.update(action="store_const", const=entry.get("const"))
    elif arity == "count":
        kw["action"] = "count"
    elif arity == "boolean_optional":
        kw["action"] = argparse.BooleanOptionalAction
    elif arity.startswith(("append", "extend")):
        action, _, nargs = arity.partition(":")
        kw.update(action=action, type=conv, default=list(default) if isinstance(default, list) else default)
        if nargs:
            kw["nargs"] = int(nargs) if nargs.isdigit() else nargs
    else:
        kw["type"] = conv
        if arity != "1":
            kw["nargs"] = int(arity) if arity.isdigit() else arity
        choices = entry.get("choices")
        if choices and all(isinstance(c, (str, int, float)) for c in choices):
            kw["choices"] = choices
    return kw


def add_upstream_flags(parser: argparse.ArgumentParser, entries: list[dict[str, Any]] | None = None) -> list[Alias]:
    """Register every upstream flag the parser does not define yet; returns the aliases to apply."""
    entries = load_upstream_flags() if entries is None else entries
    taken = parser._option_string_actions  # noqa: SLF001 - the only way to ask argparse what exists
    groups: dict[str, argparse._ArgumentGroup] = {}
    aliases: list[Alias] = []
    for entry in entries:
        ours = [taken[o] for o in entry["options"] if o in taken]
        if ours:  # ours wins (also over the remaining names of the same upstream flag)
            alias = _alias(entry, ours[0])
            if alias:
                aliases.append(alias)
            continue
        options, kw = entry["options"], _kwargs(entry)
        origin = entry.get("origin", "slime")
        title = f"upstream {origin}: {entry.get('group', '')}".rstrip(": ")
        if title not in groups:
            groups[title] = parser.add_argument_group(title)
        kw["help"] = (
            argparse.SUPPRESS
            if origin in _HIDDEN_ORIGINS
            else f"upstream slime flag, stored on args (default: {entry.get('default')!r})"
        )
        groups[title].add_argument(*options, **kw)
    return aliases


def _alias(entry: dict[str, Any], ours: argparse.Action) -> Alias | None:
    if ours.dest == entry["dest"]:
        return None
    upstream_false = entry["arity"] == "store_false"
    ours_false = isinstance(ours, argparse._StoreFalseAction)  # noqa: SLF001
    ours_true = isinstance(ours, argparse._StoreTrueAction)  # noqa: SLF001
    invert = (upstream_false and ours_true) or (entry["arity"] == "store_true" and ours_false)
    return Alias(entry["dest"], ours.dest, invert)


def apply_aliases(args: argparse.Namespace, aliases: list[Alias]) -> None:
    for a in aliases:
        if hasattr(args, a.our_dest) and not hasattr(args, a.upstream_dest):
            value = getattr(args, a.our_dest)
            setattr(args, a.upstream_dest, (not value) if a.invert else value)
