"""Write tests/fixtures/sglang_contract.json: SGLang's server CLI and HTTP request shapes, read from its source.

Why a fixture and not `import sglang`: the pinned SGLang cannot be imported on a CPU-only machine with
our pinned stack. `sglang.srt.utils.common` (imported by every `sglang.srt` module through
`sglang/__init__.py`) imports `triton` (an 897 MB GPU compiler wheel) and `torchvision.io` (PyPI's
torchvision does not import beside torch 2.13.0+cpu), and `sglang.srt.configs` registers a `qwen3_asr`
config that transformers 5.23 (our pin; SGLang pins 5.12.1) already defines, which raises ValueError.
So this script reads the wheel's source with `ast`, never importing it, and records:

- `server_args`: every option `sglang.launch_server` accepts (the `A[T, Arg(...)]` fields of
  `ServerArgs`, derived the way `sglang.srt.arg_groups.arg_utils.add_cli_args_from_dataclass` does,
  plus the options `ServerArgs.add_cli_args` adds by hand): option strings, dest, nargs, value type,
  choices (when they are literals in the source), required.
- `requests`: the fields of each request class an HTTP route parses its body into
  (`sglang.srt.managers.io_struct`, with base classes) and of `SamplingParams` (what `/generate`'s
  `sampling_params` becomes), each with its annotation's source and whether it has a default.
- `routes`: HTTP path -> methods and the request class FastAPI parses the body into.

Usage: python tools/gen_sglang_contract.py [--wheel PATH] [--version 0.5.15.post1] [--out FILE]
(without --wheel it runs `pip download --no-deps sglang==VERSION` into a temporary directory).
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

# The version upstream slime runs (docker/Dockerfile: slimerl/sglang:v0.5.15.post1).
SGLANG_VERSION = "0.5.15.post1"
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "sglang_contract.json"

SERVER_ARGS = "sglang/srt/server_args.py"
IO_STRUCT = "sglang/srt/managers/io_struct.py"
HTTP_SERVER = "sglang/srt/entrypoints/http_server.py"
ACTIONS = "sglang/srt/arg_groups/argparse_actions.py"
SAMPLING_PARAMS = "sglang/srt/sampling/sampling_params.py"  # what `/generate`'s "sampling_params" dict becomes

SCALAR_TYPES = {"int": "int", "float": "float", "str": "str"}
FLAG_ACTIONS = {"store_true", "store_false", "store_const"}  # argparse actions that take no value
UNRESOLVED = object()


def download_wheel(version: str, dest: str) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"sglang=={version}", "-d", dest], check=True
    )
    wheels = sorted(Path(dest).glob(f"sglang-{version}-*.whl"))
    if not wheels:
        raise SystemExit(f"pip download produced no sglang-{version} wheel in {dest}")
    return wheels[0]


def wheel_version(wheel: zipfile.ZipFile) -> str:
    meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    for line in wheel.read(meta).decode().splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip()
    raise SystemExit("wheel METADATA has no Version")


class Literals:
    """Module-level assignments whose value is a literal, to resolve `choices=SOME_CONSTANT`."""

    def __init__(self, tree: ast.Module):
        self.names: dict[str, Any] = {}
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = self.eval(node.value)
                if value is not UNRESOLVED:
                    self.names[node.targets[0].id] = value

    def eval(self, node: ast.AST | None) -> Any:
        if node is None:
            return UNRESOLVED
        if isinstance(node, ast.Name):
            return self.names.get(node.id, UNRESOLVED)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left, right = self.eval(node.left), self.eval(node.right)
            if isinstance(left, list) and isinstance(right, list):
                return left + right
            return UNRESOLVED
        if isinstance(node, (ast.List, ast.Tuple)):
            items = [self.eval(e) for e in node.elts]
            return UNRESOLVED if any(i is UNRESOLVED for i in items) else list(items)
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError):
            return UNRESOLVED


def kwargs_of(call: ast.Call) -> dict[str, ast.AST]:
    return {k.arg: k.value for k in call.keywords if k.arg}


def name_of(node: ast.AST | None) -> str | None:
    """`int` -> "int", `argparse.BooleanOptionalAction` -> "BooleanOptionalAction", "x" -> "x"."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def subscript_parts(node: ast.AST) -> tuple[str | None, list[ast.AST]]:
    """`Optional[X]` -> ("Optional", [X]); `A[T, meta]` -> ("A", [T, meta])."""
    if not isinstance(node, ast.Subscript):
        return None, []
    sl = node.slice
    return name_of(node.value), list(sl.elts) if isinstance(sl, ast.Tuple) else [sl]


def unwrap_optional(node: ast.AST) -> ast.AST:
    head, parts = subscript_parts(node)
    if head == "Optional":
        return parts[0]
    if head == "Union":
        rest = [p for p in parts if not (isinstance(p, ast.Constant) and p.value is None)]
        return rest[0] if len(rest) == 1 else node
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        for a, b in ((node.left, node.right), (node.right, node.left)):
            if isinstance(b, ast.Constant) and b.value is None:
                return a
    return node


def action_nargs(actions_tree: ast.Module) -> dict[str, Any]:
    """Default `nargs` of SGLang's custom argparse actions (e.g. DeprecatedStoreTrueAction takes none)."""
    out: dict[str, Any] = {}
    for cls in actions_tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "__init__":
                names = [a.arg for a in fn.args.args]
                defaults = dict(zip(names[len(names) - len(fn.args.defaults) :], fn.args.defaults))
                defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
                if "nargs" in defaults:
                    out[cls.name] = ast.literal_eval(defaults["nargs"])
    return out


def option(
    names: list[str],
    dest: str,
    *,
    nargs: Any = None,
    type_: str = "str",
    choices: Any = UNRESOLVED,
    required: bool = False,
    kind: str = "value",
) -> dict[str, Any]:
    return {
        "option_strings": names,
        "dest": dest,
        "kind": kind,
        "nargs": nargs,
        "type": type_,
        "choices": None
        if choices is UNRESOLVED or choices is None
        else sorted(choices, key=str)
        if isinstance(choices, (set, frozenset))
        else list(choices),
        "required": required,
    }


def action_kind(action: str | None, nargs_of_action: dict[str, Any], nargs: Any) -> tuple[str, Any]:
    if action == "BooleanOptionalAction":
        return "boolean_optional", 0
    if action in FLAG_ACTIONS or (action in nargs_of_action and nargs_of_action[action] == 0 and nargs is None):
        return "flag", 0
    return "value", nargs


def dataclass_options(cls: ast.ClassDef, lits: Literals, nargs_of_action: dict[str, Any]) -> list[dict[str, Any]]:
    """The options `add_cli_args_from_dataclass` derives from `field: A[T, "help" | Arg(...)] = default`.

    A field declared twice in the class body is one dataclass field: the later declaration wins."""
    out: dict[str, dict[str, Any]] = {}
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        head, parts = subscript_parts(node.annotation)
        if head not in ("A", "Annotated") or len(parts) < 2:
            continue
        meta = next(
            (
                p
                for p in parts[1:]
                if isinstance(p, ast.Call)
                and name_of(p.func) == "Arg"
                or isinstance(p, ast.Constant)
                and isinstance(p.value, str)
            ),
            None,
        )
        if meta is None:
            continue
        kw = kwargs_of(meta) if isinstance(meta, ast.Call) else {}
        if lits.eval(kw.get("no_cli")) is True:
            continue
        field = node.target.id
        cli = lits.eval(kw.get("cli_name"))
        cli = cli if isinstance(cli, str) else "--" + field.replace("_", "-")
        aliases = lits.eval(kw.get("aliases"))
        names = [cli] + (aliases if isinstance(aliases, list) else [])
        has_default = node.value is not None
        nargs = lits.eval(kw.get("nargs"))
        nargs = None if nargs is UNRESOLVED else nargs
        choices = lits.eval(kw.get("choices"))
        has_type_parser = "type_parser" in kw
        if "action" in kw:
            extra = kw.get("action_kwargs")  # e.g. {"type": str, "nargs": "*"}, passed on to add_argument
            extra = (
                {ast.literal_eval(k): v for k, v in zip(extra.keys, extra.values) if k is not None}
                if isinstance(extra, ast.Dict)
                else {}
            )
            if "nargs" in extra and lits.eval(extra["nargs"]) is not UNRESOLVED:
                nargs = lits.eval(extra["nargs"])
            kind, n = action_kind(name_of(kw["action"]), nargs_of_action, nargs)
            t = SCALAR_TYPES.get(name_of(extra.get("type")) or "", "str")
            out[field] = option(names, field, nargs=n, kind=kind, choices=choices, type_=t)
            continue
        inner = unwrap_optional(parts[0])
        ihead, iparts = subscript_parts(inner)
        if ihead == "Literal":
            values = [lits.eval(p) for p in iparts]
            if choices is UNRESOLVED and all(v is not UNRESOLVED for v in values):
                choices = values
            t = type(values[0]).__name__ if values and values[0] is not UNRESOLVED else "str"
            out[field] = option(
                names, field, type_="str" if has_type_parser else SCALAR_TYPES.get(t, "str"), choices=choices
            )
        elif ihead in ("List", "list") and not has_type_parser:
            elem = name_of(iparts[0]) if iparts else "str"
            out[field] = option(
                names, field, nargs=nargs or "+", type_=SCALAR_TYPES.get(elem or "", "str"), choices=choices
            )
        elif name_of(inner) == "bool" and not isinstance(inner, ast.Subscript):
            out[field] = option(names, field, nargs=0, kind="flag")
        else:
            t = "str" if has_type_parser else SCALAR_TYPES.get(name_of(inner) or "", "str")
            req = lits.eval(kw.get("required"))
            required = req is True or (req is UNRESOLVED and not has_default)
            out[field] = option(names, field, nargs=nargs, type_=t, choices=choices, required=required)
    return list(out.values())


def manual_options(fn: ast.FunctionDef, lits: Literals, nargs_of_action: dict[str, Any]) -> list[dict[str, Any]]:
    """The `parser.add_argument(...)` calls written out in `ServerArgs.add_cli_args`."""
    out = []
    for node in ast.walk(fn):
        if not (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"
        ):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        kw = kwargs_of(node)
        dest = lits.eval(kw.get("dest"))
        dest = dest if isinstance(dest, str) else names[0].lstrip("-").replace("-", "_")
        nargs = lits.eval(kw.get("nargs"))
        nargs = None if nargs is UNRESOLVED else nargs
        kind, nargs = action_kind(name_of(kw.get("action")), nargs_of_action, nargs)
        t = SCALAR_TYPES.get(name_of(kw.get("type")) or "", "str")
        out.append(
            option(
                names,
                dest,
                nargs=nargs,
                type_=t,
                choices=lits.eval(kw.get("choices")),
                kind=kind,
                required=lits.eval(kw.get("required")) is True,
            )
        )
    return out


def server_args_contract(tree: ast.Module, nargs_of_action: dict[str, Any]) -> list[dict[str, Any]]:
    lits = Literals(tree)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    add_cli = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args")
    options = dataclass_options(cls, lits, nargs_of_action) + manual_options(add_cli, lits, nargs_of_action)
    seen: set[str] = set()
    for opt in options:
        dup = seen.intersection(opt["option_strings"])
        if dup:
            raise SystemExit(f"option {sorted(dup)} derived twice from {SERVER_ARGS}: the derivation is out of date")
        seen.update(opt["option_strings"])
    return sorted(options, key=lambda o: o["option_strings"][0])


def request_classes(tree: ast.Module, source: str) -> dict[str, dict[str, Any]]:
    """Fields (own and inherited from classes of the same module) of every class with annotated fields."""
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def fields(name: str) -> dict[str, dict[str, Any]]:
        cls = classes[name]
        out: dict[str, dict[str, Any]] = {}
        for base in cls.bases:
            b = name_of(base)
            if b in classes:
                out.update(fields(b))
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                ann = ast.get_source_segment(source, node.annotation) or ""
                if ann.startswith(("ClassVar", "typing.ClassVar")):
                    continue
                out[node.target.id] = {"annotation": ann, "has_default": node.value is not None}
        return out

    def kind(cls: ast.ClassDef) -> str:
        if any(name_of(d.func if isinstance(d, ast.Call) else d) == "dataclass" for d in cls.decorator_list):
            return "dataclass"
        return "msgspec.Struct"

    out = {}
    for name, cls in classes.items():
        f = fields(name)
        if f:
            out[name] = {"kind": kind(cls), "fields": f}
    return out


def routes(tree: ast.Module) -> dict[str, dict[str, Any]]:
    """`@app.post("/path")` / `@app.api_route("/path", methods=[...])` -> methods and the body's class."""
    out: dict[str, dict[str, Any]] = {}
    for fn in tree.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body_cls = None
        for a in fn.args.args:
            if a.arg != "obj" or a.annotation is None:
                continue
            ann = a.annotation
            while isinstance(ann, ast.Subscript) and subscript_parts(ann)[0] in ("Annotated", "Optional", "Union"):
                ann = subscript_parts(ann)[1][0]
            body_cls = name_of(ann)
        for dec in fn.decorator_list:
            if not (
                isinstance(dec, ast.Call) and isinstance(dec.func, ast.Attribute) and name_of(dec.func.value) == "app"
            ):
                continue
            verb = dec.func.attr
            if verb not in ("get", "post", "put", "delete", "api_route") or not dec.args:
                continue
            if not (isinstance(dec.args[0], ast.Constant) and isinstance(dec.args[0].value, str)):
                continue  # a computed path (e.g. versioned OpenAI routes): not one we call
            path = dec.args[0].value
            methods = ast.literal_eval(kwargs_of(dec)["methods"]) if verb == "api_route" else [verb.upper()]
            entry = out.setdefault(path, {"methods": [], "body": body_cls})
            entry["methods"] = sorted(set(entry["methods"]) | set(methods))
    return dict(sorted(out.items()))


def build(wheel_path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(wheel_path) as wheel:

        def parse(member: str) -> tuple[ast.Module, str]:
            text = wheel.read(member).decode()
            return ast.parse(text, member), text

        version = wheel_version(wheel)
        sa_tree, _ = parse(SERVER_ARGS)
        io_tree, io_src = parse(IO_STRUCT)
        http_tree, _ = parse(HTTP_SERVER)
        act_tree, _ = parse(ACTIONS)
        sp_tree, sp_src = parse(SAMPLING_PARAMS)
    route_table = routes(http_tree)
    bodies = {r["body"] for r in route_table.values() if r["body"]}
    requests = {name: spec for name, spec in request_classes(io_tree, io_src).items() if name in bodies}
    requests["SamplingParams"] = request_classes(sp_tree, sp_src)["SamplingParams"]
    return {
        "generated_by": "tools/gen_sglang_contract.py (ast over the wheel's source; sglang is never imported)",
        "sglang_version": version,
        "server_args": server_args_contract(sa_tree, action_nargs(act_tree)),
        "requests": dict(sorted(requests.items())),
        "routes": route_table,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheel", type=Path, help="an sglang wheel (default: pip download sglang==--version)")
    p.add_argument("--version", default=SGLANG_VERSION)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="sglang-wheel-") as tmp:
        contract = build(a.wheel or download_wheel(a.version, tmp))
    if contract["sglang_version"] != a.version:
        raise SystemExit(f"wheel is sglang {contract['sglang_version']}, expected {a.version} (--version)")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(contract, indent=1, sort_keys=False) + "\n")
    print(
        f"{a.out}: sglang {contract['sglang_version']}, {len(contract['server_args'])} server options, "
        f"{len(contract['requests'])} request classes, {len(contract['routes'])} routes"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
