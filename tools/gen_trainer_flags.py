"""Generate slime/cli/upstream_flags.json: every command-line flag of upstream slime and Megatron-LM.

Why: a slime run script passes slime's rollout flags *and* Megatron's trainer flags on one command line.
`slime-rollout` and `slime-train` accept the whole list: each flag is stored on `args` with upstream's
default instead of being rejected. The flags are read from upstream *source* with `ast` (nothing is
imported, no GPU stack needed):

- slime: `slime/utils/arguments.py` (every `add_argument` / `reset_arg`, grouped by the `add_*_arguments`
  function that holds it) and `slime/backends/sglang_utils/arguments.py` (its own literal flags);
- Megatron-LM: `megatron/training/arguments.py`, including the groups it builds from dataclasses with
  `ArgumentGroupFactory` (field name -> flag, annotation -> arity, `argparse_meta` overrides, bool fields
  with a True default become `--no-X/--disable-X`), exactly as `argument_utils.py` does at run time.

Sources are bare git mirrors (`fetch` output) read at a commit, or plain checkouts:

    python tools/gen_trainer_flags.py \
        --slime /work/.mirror/THUDM+slime/repo --megatron /work/.mirror/NVIDIA+Megatron-LM/repo \
        [--megatron-commit <sha>]   # default: the MEGATRON_COMMIT pinned in slime's docker/Dockerfile
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

OUT = Path(__file__).resolve().parents[1] / "slime" / "cli" / "upstream_flags.json"


# ------------------------------------------------------------------ source trees


class Tree:
    """Read files of a bare git mirror at one commit, or of a plain directory."""

    def __init__(self, root: str, commit: str | None = None):
        self.root = Path(root)
        self.bare = not (self.root / ".git").exists() and (self.root / "HEAD").exists()
        self.commit = commit or ("HEAD" if self.bare else None)
        if self.bare:
            self.commit = self._git("rev-parse", self.commit).strip()

    def _git(self, *a: str) -> str:
        return subprocess.run(["git", "-C", str(self.root), *a], check=True, capture_output=True, text=True).stdout

    def read(self, path: str) -> str:
        if self.bare:
            return self._git("show", f"{self.commit}:{path}")
        return (self.root / path).read_text(encoding="utf-8")

    def grep(self, pattern: str, under: str) -> list[str]:
        """Paths of .py files under `under` with a line matching the (extended) regex."""
        if self.bare:
            r = subprocess.run(
                ["git", "-C", str(self.root), "grep", "-l", "-E", pattern, self.commit, "--", f"{under}/*.py"],
                capture_output=True,
                text=True,
            )
            return [line.split(":", 1)[1] for line in r.stdout.splitlines()]
        rx = re.compile(pattern)
        return [
            str(p.relative_to(self.root))
            for p in sorted((self.root / under).rglob("*.py"))
            if any(rx.search(line) for line in p.read_text(encoding="utf-8").splitlines())
        ]


# ------------------------------------------------------------------ literal evaluation

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Pow: operator.pow,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}
_UNSET = object()


def literal(node: ast.AST | None) -> Any:
    """Value of a constant expression (literals, arithmetic, list/dict displays); _UNSET otherwise."""
    if node is None:
        return _UNSET
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = literal(node.left), literal(node.right)
        if a is not _UNSET and b is not _UNSET:
            return _BINOPS[type(node.op)](a, b)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = literal(node.operand)
        return _UNSET if v is _UNSET else -v
    if isinstance(node, (ast.List, ast.Tuple)):
        vals = [literal(e) for e in node.elts]
        return _UNSET if _UNSET in vals else vals
    return _UNSET


def dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def jsonable(v: Any) -> Any:
    if v is _UNSET:
        return None
    if isinstance(v, tuple):
        return [jsonable(x) for x in v]
    if isinstance(v, list):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return repr(v)


# ------------------------------------------------------------------ one flag


def flag_entry(options: list[str], kw: dict[str, ast.AST], origin: str, group: str) -> dict[str, Any] | None:
    """Normalize one add_argument call into {options, dest, arity, type, default, choices, ...}."""
    options = [o for o in options if o.startswith("--")]
    if not options:
        return None
    action = kw.get("action")
    action_name = (
        literal(action)
        if action is not None and literal(action) is not _UNSET
        else dotted(action)
        if action is not None
        else None
    )
    if action_name and action_name.endswith("BooleanOptionalAction"):
        action_name = "boolean_optional"
    nargs = literal(kw.get("nargs"))
    typ = kw.get("type")
    type_name = None
    if typ is not None:
        type_name = dotted(typ) or ("lambda" if isinstance(typ, ast.Lambda) else "callable")
    default = literal(kw.get("default"))
    default_src = None
    if "default" in kw and default is _UNSET:
        default_src = ast.unparse(kw["default"])  # e.g. os.getenv(...): recorded, stored as None
    if action_name in (
        "store_true",
        "store_false",
        "store_const",
        "count",
        "help",
        "version",
        "append_const",
        "boolean_optional",
    ):
        arity = action_name
        if default is _UNSET and "default" not in kw:
            default = {"store_true": False, "store_false": True, "count": None}.get(action_name)
    elif action_name == "append" or action_name == "extend":
        arity = action_name
        nargs_v = nargs if nargs is not _UNSET else None
        if nargs_v is not None:
            arity = f"{action_name}:{nargs_v}"
    elif action_name is not None:
        arity = "?"  # a custom Action class: accept an optional value
        default_src = default_src or f"custom action {action_name}"
    else:
        arity = "1" if nargs is _UNSET or nargs is None else str(nargs)
    choices = literal(kw.get("choices"))
    dest = literal(kw.get("dest"))
    if dest is _UNSET:
        dest = options[0][2:].replace("-", "_")
    entry = {
        "options": options,
        "dest": dest,
        "arity": arity,
        "type": type_name,
        "default": jsonable(default if default is not _UNSET else None),
        "origin": origin,
        "group": group,
    }
    if choices is not _UNSET and isinstance(choices, list):
        entry["choices"] = jsonable(choices)
    if action_name == "store_const":
        entry["const"] = jsonable(literal(kw.get("const")))
    if default_src:
        entry["default_source"] = default_src
    return entry


def call_options_kwargs(call: ast.Call) -> tuple[list[str], dict[str, ast.AST]] | None:
    opts = [literal(a) for a in call.args]
    if not opts or not all(isinstance(o, str) for o in opts):
        return None
    return opts, {k.arg: k.value for k in call.keywords if k.arg}


def argument_calls(
    fn: ast.AST, origin: str, group: str, skipped: list[str] | None = None
) -> Iterator[tuple[str, ast.Call, dict[str, Any] | None]]:
    """Every call under `fn` as (dotted name, call, flag entry): the entry is set for an
    `add_argument` call with literal options (one whose options are not literal goes to `skipped`),
    None for other calls, which the caller may read (`reset_arg`, `ArgumentGroupFactory`)."""
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func) or ""
        entry = None
        if name.endswith("add_argument"):
            parsed = call_options_kwargs(node)
            if parsed is None:
                if skipped is not None:
                    skipped.append(ast.unparse(node)[:80])
                continue
            entry = flag_entry(parsed[0], parsed[1], origin, group)
            if entry is None:
                continue
        yield name, node, entry


# ------------------------------------------------------------------ slime


def slime_flags(tree: Tree) -> tuple[list[dict], list[dict]]:
    """(slime's own flags, slime's reset_arg overrides of Megatron flags)."""
    flags, resets = [], []

    def walk_file(path: str, default_group: str) -> None:
        mod = ast.parse(tree.read(path))
        for fn in ast.walk(mod):
            if not isinstance(fn, ast.FunctionDef):
                continue
            group = (
                fn.name.removeprefix("add_").removesuffix("_arguments") if fn.name.startswith("add_") else default_group
            )
            for name, node, entry in argument_calls(fn, "slime", group):
                if entry is not None:
                    flags.append(entry)
                elif name == "reset_arg" and len(node.args) >= 2:
                    opt = literal(node.args[1])
                    kw = {k.arg: k.value for k in node.keywords if k.arg}
                    e = flag_entry([opt], kw, "slime", group)
                    if e:
                        e["reset"] = True
                        resets.append(e)

    walk_file("slime/utils/arguments.py", "slime")
    walk_file("slime/backends/sglang_utils/arguments.py", "sglang")
    # an add_argument nested in two add_* functions is seen twice: keep the innermost (last) one
    seen: dict[str, dict] = {}
    for e in flags:
        seen[e["options"][0]] = e
    return list(seen.values()), resets


# ------------------------------------------------------------------ Megatron

_PRIMS = {"int": "int", "float": "float", "str": "str", "bool": "bool"}


class DataclassFlags:
    """What Megatron's ArgumentGroupFactory registers for a dataclass, read from source."""

    def __init__(self, tree: Tree):
        self.tree = tree
        self.cache: dict[str, tuple[ast.ClassDef, str] | None] = {}
        self.unresolved: list[str] = []

    def find_class(self, name: str) -> tuple[ast.ClassDef, str] | None:
        if name not in self.cache:
            found = None
            for path in self.tree.grep(rf"^class {name}\b", "megatron"):
                for node in ast.parse(self.tree.read(path)).body:
                    if isinstance(node, ast.ClassDef) and node.name == name:
                        found = (node, path)
                        break
                if found:
                    break
            self.cache[name] = found
        return self.cache[name]

    def fields(self, name: str) -> list[tuple[str, ast.AST, ast.AST | None]]:
        """(field name, annotation, value) in dataclass order: base classes first, overrides in place."""
        found = self.find_class(name)
        if not found:
            self.unresolved.append(name)
            return []
        cls, _ = found
        out: dict[str, tuple[str, ast.AST, ast.AST | None]] = {}
        for base in cls.bases:
            bname = dotted(base)
            if bname and bname.split(".")[-1] not in ("object", "Generic", "ABC"):
                for f in self.fields(bname.split(".")[-1]):
                    out[f[0]] = f
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                ann = ast.unparse(node.annotation)
                if ann.startswith(("ClassVar", "typing.ClassVar", "InitVar")):
                    continue
                out[node.target.id] = (node.target.id, node.annotation, node.value)
        return list(out.values())

    def is_enum(self, name: str) -> bool:
        found = self.find_class(name)
        return bool(found) and any(
            (dotted(b) or "").split(".")[-1] in ("Enum", "IntEnum", "StrEnum") for b in found[0].bases
        )

    def type_of(self, ann: ast.AST) -> dict[str, Any] | None:
        """argument_utils._extract_type on an annotation node; None = TypeInferenceError."""
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            ann = ast.parse(ann.value, mode="eval").body
        if isinstance(ann, ast.BinOp) and isinstance(ann.op, ast.BitOr):  # X | None
            if isinstance(ann.right, ast.Constant) and ann.right.value is None:
                return self.type_of(ann.left)
            return None
        if isinstance(ann, ast.Subscript):
            head = (dotted(ann.value) or "").split(".")[-1]
            inner = ann.slice
            elts = inner.elts if isinstance(inner, ast.Tuple) else [inner]
            if head == "Optional":
                return self.type_of(elts[0])
            if head == "Union":
                if len(elts) == 2 and isinstance(elts[1], ast.Constant) and elts[1].value is None:
                    return self.type_of(elts[0])
                return None
            if head in ("list", "List"):
                t = self.type_of(elts[0]) if len(elts) == 1 else None
                return None if t is None else {**t, "nargs": "+"}
            if head == "Literal":
                vals = [literal(e) for e in elts]
                return {"type": type(vals[0]).__name__, "choices": vals}
            return None
        name = (dotted(ann) or "").split(".")[-1]
        if name in _PRIMS:
            return {"type": _PRIMS[name]}
        if name and self.is_enum(name):
            return {"type": "enum"}
        return None

    def flags(self, cls_name: str, exclude: set[str], group: str) -> list[dict]:
        out = []
        for fname, ann, value in self.fields(cls_name):
            if fname in exclude:
                continue
            default: Any = _UNSET
            meta: dict[str, ast.AST] = {}
            init = True
            if isinstance(value, ast.Call) and (dotted(value.func) or "").split(".")[-1] == "field":
                kw = {k.arg: k.value for k in value.keywords if k.arg}
                if literal(kw.get("init")) is False:
                    init = False
                if "default" in kw:
                    default = literal(kw["default"])
                elif "default_factory" in kw:
                    fac = kw["default_factory"]
                    fac_name = dotted(fac)
                    if fac_name in ("list", "dict", "tuple", "set"):
                        default = {"list": [], "dict": {}, "tuple": [], "set": []}[fac_name]
                    elif isinstance(fac, ast.Lambda):
                        default = literal(fac.body)
                md = kw.get("metadata")
                if isinstance(md, ast.Dict):
                    for k, v in zip(md.keys, md.values):
                        if literal(k) == "argparse_meta" and isinstance(v, ast.Dict):
                            meta = {literal(mk): mv for mk, mv in zip(v.keys, v.values)}
            elif value is not None:
                default = literal(value)
            if not init:
                continue
            default = None if default is _UNSET else default
            names = ["--" + fname.replace("_", "-")]
            kwargs: dict[str, ast.AST] = {
                "dest": ast.Constant(fname),
                "default": ast.Constant(default)
                if not isinstance(default, (list, dict))
                else ast.parse(repr(default), mode="eval").body,
            }
            t = self.type_of(ann)
            if t is not None:
                if t["type"] == "bool":
                    act = "store_true" if default is False else "store_false"
                    kwargs["action"] = ast.Constant(act)
                    if act == "store_false":
                        names = ["--no-" + fname.replace("_", "-"), "--disable-" + fname.replace("_", "-")]
                else:
                    kwargs["type"] = ast.Name(t["type"] if t["type"] != "enum" else "str")
                    if "nargs" in t:
                        kwargs["nargs"] = ast.Constant(t["nargs"])
                    if "choices" in t:
                        kwargs["choices"] = ast.parse(repr(t["choices"]), mode="eval").body
            elif not meta:
                continue  # Megatron itself would raise TypeInferenceError: such fields are always excluded
            for k, v in meta.items():
                if k == "arg_names":
                    names = literal(v)
                else:
                    kwargs[k] = v
            e = flag_entry(names, kwargs, "megatron", group)
            if e:
                e["dataclass"] = cls_name
                out.append(e)
        return out


def megatron_flags(tree: Tree) -> tuple[list[dict], list[str]]:
    src = tree.read("megatron/training/arguments.py")
    mod = ast.parse(src)
    dc = DataclassFlags(tree)
    flags: list[dict] = []
    skipped: list[str] = []
    for fn in mod.body:
        if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("_add_"):
            continue
        group = fn.name.removeprefix("_add_").removesuffix("_args").removesuffix("_arguments")
        lists: dict[str, Any] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                v = literal(node.value)
                if isinstance(v, list):
                    lists[node.targets[0].id] = v
        for name, node, entry in argument_calls(fn, "megatron", group, skipped):
            if entry is not None:
                flags.append(entry)
            elif name.split(".")[-1] == "ArgumentGroupFactory" and node.args:
                cls = (dotted(node.args[0]) or "").split(".")[-1]
                excl_node = {k.arg: k.value for k in node.keywords}.get("exclude")
                excl = literal(excl_node) if excl_node is not None else []
                if excl is _UNSET and isinstance(excl_node, ast.Name):
                    excl = lists.get(excl_node.id, [])
                flags.extend(dc.flags(cls, set(excl or []), group))
    if dc.unresolved:
        skipped.extend(f"dataclass {c} not found" for c in dc.unresolved)
    return flags, skipped


def patch_flags(slime: Tree) -> list[dict]:
    """Flags slime's docker patches add to Megatron's arguments.py (e.g. --use-gated-attention)."""
    paths = (
        [
            p
            for p in slime._git("ls-tree", "-r", "--name-only", slime.commit, "docker/patch").splitlines()
            if re.search(r"/megatron[^/]*\.patch$", p)
        ]
        if slime.bare
        else [str(p.relative_to(slime.root)) for p in sorted((slime.root / "docker/patch").glob("*/megatron*.patch"))]
    )
    out: dict[str, dict] = {}
    for path in paths:
        in_args, added = False, []
        for line in slime.read(path).splitlines():
            if line.startswith("diff --git"):
                in_args = line.endswith("megatron/training/arguments.py")
            elif in_args and line.startswith("+") and not line.startswith("+++"):
                added.append(line[1:])
        buf: list[str] = []
        for line in added:  # accumulate each add_argument(...) statement until it parses
            if not buf and ".add_argument(" not in line:
                continue
            buf.append(line.strip())
            try:
                node = ast.parse(" ".join(buf), mode="eval").body
            except SyntaxError:
                if len(buf) > 30:
                    buf = []
                continue
            buf = []
            if isinstance(node, ast.Call):
                parsed = call_options_kwargs(node)
                e = parsed and flag_entry(parsed[0], parsed[1], "megatron", "slime_patch")
                if e:
                    e["patch"] = path
                    out.setdefault(e["options"][0], e)
    return list(out.values())


def pinned_megatron_commit(slime: Tree) -> str | None:
    try:
        m = re.search(r"MEGATRON_COMMIT=([0-9a-f]{40})", slime.read("docker/Dockerfile"))
    except subprocess.CalledProcessError:
        return None
    return m.group(1) if m else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slime", default="/work/.mirror/THUDM+slime/repo")
    ap.add_argument("--slime-commit", default=None)
    ap.add_argument("--megatron", default="/work/.mirror/NVIDIA+Megatron-LM/repo")
    ap.add_argument("--megatron-commit", default=None, help="default: the commit slime's Dockerfile pins")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)

    slime = Tree(a.slime, a.slime_commit)
    megatron = Tree(a.megatron, a.megatron_commit or pinned_megatron_commit(slime))
    s_flags, resets = slime_flags(slime)
    m_flags, skipped = megatron_flags(megatron)
    known = {o for e in m_flags for o in e["options"]}
    m_flags += [e for e in patch_flags(slime) if not set(e["options"]) & known]

    by_opt: dict[str, dict] = {}
    for e in m_flags:
        by_opt.setdefault(e["options"][0], e)
    for r in resets:  # reset_arg: change the default of an existing Megatron flag, or add the flag
        m = next((by_opt[o] for o in r["options"] if o in by_opt), None)
        if m is not None:
            m["default"] = r["default"]
            m["slime_default"] = True
            m["slime_group"] = r["group"]
        else:
            r.pop("reset")
            by_opt[r["options"][0]] = r
    for e in s_flags:
        by_opt[e["options"][0]] = e  # slime's own definition wins (it is registered last, conflict-free)
    flags = sorted(by_opt.values(), key=lambda e: (e["origin"] != "slime", e["options"][0]))

    doc = {
        "generated_by": "tools/gen_trainer_flags.py",
        "sources": {
            "THUDM/slime": slime.commit or str(slime.root),
            "NVIDIA/Megatron-LM": megatron.commit or str(megatron.root),
        },
        "unparsed": skipped,
        "flags": flags,
    }
    Path(a.out).write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n")
    n_s = sum(e["origin"] == "slime" for e in flags)
    print(
        f"{a.out}: {len(flags)} flags ({n_s} slime, {len(flags) - n_s} Megatron), {len(skipped)} unparsed",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
