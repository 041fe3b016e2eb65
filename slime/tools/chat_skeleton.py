"""`Skeletons`: a chat template's render reused for conversations that differ only in their messages'
text and take the same path through the template.

A gateway renders each session's first prompt whole: every session has a task of its own, but the
template runs the same way for each (same roles, same tools), and only the text differs. Rendering
it again costs a Jinja run per session; here it runs once per path.

How it stays exact. A render is traced once: each message's `content` is replaced by a `Symbolic`
string whose characters are a marker, and the template runs in a tracing copy of its sandbox.
Whatever the template does with such a text is either
  - emitted, concatenated or stripped (`+`, `~`, a macro's or a block's text, `strip`, `trim`): it
    stays symbolic, and lands in the output where the text (stripped, joined) will be filled in;
  - asked a question with a bool or int answer (`startswith`, `==`, `in`, `length`, truthiness): the
    answer is computed on the real text and kept as a guard;
  - moved about by a filter that reads nothing of it (`first`, `selectattr`, `default`...);
  - anything else (a slice, `tojson`, `join`, `split`, a hash, any other filter, test or call, a
    literal's method given the text): the trace stops and the template keeps rendering whole for
    that path.
A skeleton serves a later conversation with the same shape only if every guard gives the same
answer on its texts; then the template would run exactly the same steps and emit the same pieces.
Jinja's own operators that would read the marker's characters where the trace cannot see them
(`~` and `in`) are compiled to the tracing functions in the tracing copy; a trace is kept only if
its skeleton, filled with the texts it was traced on, gives the real render's text. Templates that
read the clock or random numbers (`strftime_now`, `lipsum`, `random`) stop the trace.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jinja2.compiler
import jinja2.runtime
import jinja2.utils

from slime.utils.json_text import acyclic_dumps

MARK_OPEN, MARK_CLOSE = "\ue000", "\ue001"  # private-use characters around a text's index
SHAPES = 256  # conversation shapes kept per template
PATHS_PER_SHAPE = 4  # skeletons per shape (texts whose answers differ take other paths)
TRACES_PER_SHAPE = 8  # after these, a shape whose paths keep differing is rendered whole
FAILED_TRACES_PER_SHAPE = 2  # after these, a shape the trace cannot follow is rendered whole (no more traces)
_KEY_JSON = acyclic_dumps()  # (a cycle is a RecursionError: no key, rendered whole)

# tests a text may meet: the answer is its type's, or a comparison (the text's own, traced `==`, `<`...)
_TESTS = frozenset(
    {"string", "defined", "undefined", "none", "mapping", "number", "integer", "float", "boolean", "true", "false"}
    | {"equalto", "eq", "==", "ne", "!=", "lt", "<", "le", "<=", "gt", ">", "ge", ">="}
)
# filters a text may meet: they move values about, or use only a text's traced operations (`len`,
# `==`, `strip`); none hands a text's characters to C code (as `tojson`, `join` or `int` would)
_FILTERS = frozenset(
    {"length", "count", "string", "trim", "default", "d", "first", "last", "list", "items", "reverse"}
    | {"select", "reject", "selectattr", "rejectattr", "map"}
)
_NONDETERMINISTIC = ("strftime_now", "lipsum")  # globals whose answer changes between renders
_NONDETERMINISTIC_FILTERS = ("random",)


class Untraceable(BaseException):
    """The template used a text in a way the trace does not follow. A BaseException so that no
    `except Exception` in the template's helpers takes another path on it."""


class Trace:
    """One traced render: its texts (by index) and the guards asked of them, in order."""

    def __init__(self, texts: tuple[str, ...]) -> None:
        self.texts = texts
        self.guards: list[tuple[tuple[Part, ...], str, tuple[Any, ...], Any]] = []

    def ask(self, parts: tuple[Part, ...], op: str, args: tuple[Any, ...]) -> Any:
        if any(_has_symbolic(a) for a in args):
            raise Untraceable(f"{op} between two texts")
        answer = GUARDS[op](_fill(parts, self.texts), *args)
        if type(answer) not in (bool, int):
            raise Untraceable(f"{op} answered {type(answer).__name__}")
        self.guards.append((parts, op, args, answer))
        return answer


# a part of a symbolic text: a literal (str), the index of a text (int), or a text method applied to
# parts (`(name, args, parts)`: `strip` of a text, or of a text joined with literals)
Part = Any


def _fill(parts: tuple[Part, ...], texts: tuple[str, ...]) -> str:
    return "".join(_fill_part(p, texts) for p in parts)


def _fill_part(part: Part, texts: tuple[str, ...]) -> str:
    if type(part) is str:
        return part
    if type(part) is int:
        return texts[part]
    name, args, parts = part
    return _DERIVED[name](_fill(parts, texts), *args)


def _marked(parts: tuple[Part, ...]) -> str:
    return "".join(p if type(p) is str else f"{MARK_OPEN}{p if type(p) is int else ''}{MARK_CLOSE}" for p in parts)


# text -> text methods a template may call on a text: the result is symbolic, its text computed per filling
_DERIVED = {"strip": str.strip, "lstrip": str.lstrip, "rstrip": str.rstrip}

GUARDS: dict[str, Callable[..., Any]] = {
    "startswith": str.startswith,
    "endswith": str.endswith,
    "contains": lambda text, x: x in text,  # `x in text`
    "in": lambda text, container: text in container,  # `text in "a literal"`
    "eq": lambda text, x: text == x,
    "ne": lambda text, x: text != x,
    "lt": lambda text, x: text < x,
    "le": lambda text, x: text <= x,
    "gt": lambda text, x: text > x,
    "ge": lambda text, x: text >= x,
    "len": len,
    "bool": bool,
}
_METHODS = frozenset({"startswith", "endswith", *_DERIVED})  # the methods a template may call on a text
_OWN = frozenset({"_parts", "_trace", "__class__"})


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise Untraceable("an operation on a text")


class Symbolic(str):
    """A text made of literal pieces and traced texts (`_parts`: str literals, int text indexes);
    its characters are the texts' markers. Emitting and concatenating keep it symbolic, questions
    become guards, anything else is `Untraceable`."""

    def __new__(cls, parts: tuple[Part, ...], trace: Trace) -> Symbolic:
        self = str.__new__(cls, _marked(parts))
        self._parts, self._trace = parts, trace
        return self

    def __getattribute__(self, name: str) -> Any:
        if name in _OWN:
            return object.__getattribute__(self, name)
        if name in _METHODS:
            parts, trace = object.__getattribute__(self, "_parts"), object.__getattribute__(self, "_trace")
            return _Method(parts, trace, name)
        raise Untraceable(f"attribute {name!r} of a text")

    def __eq__(self, other: Any) -> Any:
        return _compare(self, "eq", other)

    def __ne__(self, other: Any) -> Any:
        return _compare(self, "ne", other)

    def __lt__(self, other: Any) -> Any:
        return _compare(self, "lt", other)

    def __le__(self, other: Any) -> Any:
        return _compare(self, "le", other)

    def __gt__(self, other: Any) -> Any:
        return _compare(self, "gt", other)

    def __ge__(self, other: Any) -> Any:
        return _compare(self, "ge", other)

    def __contains__(self, x: Any) -> bool:
        return _compare(self, "contains", x)

    def __len__(self) -> int:
        return _ask(self, "len", ())

    def __bool__(self) -> bool:
        return _ask(self, "bool", ())

    def __str__(self) -> Symbolic:
        return self

    def __add__(self, other: Any) -> Symbolic:
        return _joined((self, other))

    def __radd__(self, other: Any) -> Symbolic:
        return _joined((other, self))

    __hash__ = __getitem__ = __iter__ = __reversed__ = __mul__ = __rmul__ = __mod__ = __rmod__ = _refuse
    __repr__ = __format__ = __int__ = __float__ = __index__ = __reduce__ = __reduce_ex__ = __sizeof__ = _refuse
    __getnewargs__ = __copy__ = __deepcopy__ = __html__ = _refuse


def _ask(s: Symbolic, op: str, args: tuple[Any, ...]) -> Any:
    return s._trace.ask(s._parts, op, args)


def _compare(s: Symbolic, op: str, other: Any) -> Any:
    if type(other) is not str:
        raise Untraceable(f"{op} of a text with a {type(other).__name__}")
    return _ask(s, op, (other,))


class _Method:
    """`text.startswith` as the template gets it: called, a guard."""

    def __init__(self, parts: tuple[Part, ...], trace: Trace, name: str) -> None:
        self.parts, self.trace, self.name = parts, trace, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            raise Untraceable(f"{self.name} with keyword arguments")
        if self.name not in _DERIVED:
            return self.trace.ask(self.parts, self.name, args)
        if any(type(a) not in (str, type(None)) or (type(a) is str and MARK_OPEN in a) for a in args):
            raise Untraceable(f"{self.name} of a text with {args!r}")
        _DERIVED[self.name]("", *args)  # (the arguments' own errors, as the real call would raise them)
        return Symbolic(((self.name, args, self.parts),), self.trace)


def _joined(items: Any) -> Any:
    """`"".join(items)`, symbolic if any item is (jinja's `concat`: the output, a macro's or a
    block's text, `~`)."""
    items = list(items)
    trace = next((i._trace for i in items if type(i) is Symbolic), None)
    if trace is None:
        return "".join(items)
    parts: list[Part] = []
    for item in items:
        if type(item) is Symbolic:
            parts.extend(item._parts)
        elif type(item) is str:
            parts.append(item)
        else:
            raise Untraceable(f"a text joined with a {type(item).__name__}")
    return Symbolic(tuple(parts), trace)


def _has_symbolic(value: Any) -> bool:
    cls = type(value)
    if cls is Symbolic:
        return True
    if cls is str:  # a marker copied out of a text where the trace did not see it
        return MARK_OPEN in value
    if cls in (list, tuple):
        return any(_has_symbolic(v) for v in value)
    if cls is dict:
        return any(_has_symbolic(k) or _has_symbolic(v) for k, v in value.items())
    if isinstance(value, jinja2.utils.Namespace):
        return _has_symbolic(dict(value._Namespace__attrs))  # (the namespace's own store)
    return False


class _TracingCodeGenerator(jinja2.compiler.CodeGenerator):
    """Jinja's code, with `~` and `in` (which read a text's characters in C) calling the trace."""

    def visit_Concat(self, node: Any, frame: Any) -> None:
        self.write("environment.trace_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_Compare(self, node: Any, frame: Any) -> None:
        ops = [op.op for op in node.ops]
        if "in" not in ops and "notin" not in ops:
            return super().visit_Compare(node, frame)
        if len(ops) != 1:  # a chain with `in`: not followed
            self.write("environment.trace_untraceable()")
            return
        self.write("environment.trace_in(")
        self.visit(node.expr, frame)
        self.write(", ")
        self.visit(node.ops[0].expr, frame)
        self.write(f", {ops[0] == 'notin'})")


def _trace_concat(items: tuple[Any, ...]) -> Any:
    return _joined(map(str, items))  # (jinja's `str_join`; `str` of a Symbolic is itself)


def _trace_in(item: Any, container: Any, negate: bool) -> bool:
    if type(item) is Symbolic and type(container) is str:
        found = item._trace.ask(item._parts, "in", (container,))
    else:
        found = item in container  # (a Symbolic container: its `__contains__`; a list: its items' `==`)
    return not found if negate else found


def _untraceable() -> Any:
    raise Untraceable("a comparison chain with `in`")


def tracing_environment(env: Any) -> Any:
    """A copy of the template's sandbox where every filter, test and call that meets a traced text
    either is known to read nothing of it or stops the trace; the clock and random numbers too."""
    tracing = env.overlay()
    tracing.code_generator_class = _TracingCodeGenerator
    tracing.concat = _joined
    tracing.trace_concat, tracing.trace_in, tracing.trace_untraceable = _trace_concat, _trace_in, _untraceable
    tracing.filters = {name: _guarded(name, f, _filter_meets) for name, f in env.filters.items()}
    tracing.tests = {name: _guarded(name, f, _test_meets) for name, f in env.tests.items()}
    tracing.globals = dict(env.globals)
    for name in _NONDETERMINISTIC:
        if name in tracing.globals:
            tracing.globals[name] = _stop(name)
    for name in _NONDETERMINISTIC_FILTERS:
        if name in tracing.filters:
            tracing.filters[name] = _stop(name)
    call, binop = env.call, env.call_binop

    def traced_call(context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        if type(obj) is not _Method and not isinstance(obj, jinja2.runtime.Macro):
            if _has_symbolic(args) or _has_symbolic(kwargs) or _has_symbolic(getattr(obj, "__self__", None)):
                raise Untraceable("a text passed to a call, or a copy of one called")
        return call(context, obj, *args, **kwargs)

    def traced_binop(context: Any, operator: str, left: Any, right: Any) -> Any:
        if _has_symbolic(left) or _has_symbolic(right):  # `"%(content)s" % message` copies the text in C
            raise Untraceable(f"a text in `{operator}`")
        return binop(context, operator, left, right)

    tracing.call, tracing.call_binop = traced_call, traced_binop
    tracing.intercepted_binops = frozenset({"%"})  # (the only operator that formats a text held in a container)
    return tracing


def _filter_meets(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if name not in _FILTERS and (_has_symbolic(args) or _has_symbolic(kwargs)):
        raise Untraceable(f"a text through the filter {name!r}")


def _test_meets(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    if name not in _TESTS and (_has_symbolic(args) or _has_symbolic(kwargs)):
        raise Untraceable(f"a text through the test {name!r}")


def _guarded(name: str, f: Callable[..., Any], meets: Callable[..., None]) -> Callable[..., Any]:
    pass_arg = getattr(f, "jinja_pass_arg", None)

    def guarded(*args: Any, **kwargs: Any) -> Any:
        meets(name, args[1:] if pass_arg is not None else args, kwargs)  # (not the context jinja passes)
        return f(*args, **kwargs)

    if pass_arg is not None:
        guarded.jinja_pass_arg = pass_arg
    return guarded


def _stop(name: str) -> Callable[..., Any]:
    def stop(*args: Any, **kwargs: Any) -> Any:
        raise Untraceable(f"{name}: not the same at every render")

    return stop


class Skeleton:
    """A traced render: its literal pieces around its texts' places, and the guards its path needs."""

    def __init__(self, pieces: list[str], slots: list[int], guards: list[tuple]) -> None:
        self.pieces, self.slots, self.guards = pieces, slots, guards

    def fits(self, texts: tuple[str, ...]) -> bool:
        for parts, op, args, answer in self.guards:
            got = GUARDS[op](_fill(parts, texts), *args)
            if type(got) is not type(answer) or got != answer:
                return False
        return True

    def fill(self, texts: tuple[str, ...]) -> str:
        pieces, out = self.pieces, [self.pieces[0]]
        for k, slot in enumerate(self.slots):
            out.append(texts[slot] if type(slot) is int else _fill_part(slot, texts))
            out.append(pieces[k + 1])
        return "".join(out)

    @classmethod
    def of(cls, out: Any, guards: list[tuple]) -> Skeleton | None:
        """The skeleton of a traced render's output; None if a marker was copied into a literal
        (read in a way the trace did not see)."""
        pieces, slots = [""], []
        for part in out._parts if type(out) is Symbolic else (out,):
            if type(part) is not str:
                slots.append(part)
                pieces.append("")
            elif MARK_OPEN in part or MARK_CLOSE in part:
                return None
            else:
                pieces[-1] += part
        return cls(pieces, slots, guards)


class _Shape:
    def __init__(self) -> None:
        self.paths: list[Skeleton] = []
        self.traces = self.failed = 0


class Skeletons:
    """The skeletons of one template, by conversation shape: the messages without their texts, the
    tools and the generation prompt."""

    def __init__(self, size: int = SHAPES) -> None:
        self.size = size
        self._shapes: OrderedDict[str, _Shape] = OrderedDict()
        self.hits = self.traces = 0  # (for tests and benchmarks)

    @staticmethod
    def texts_of(messages: list[dict[str, Any]]) -> tuple[str | None, tuple[str, ...], list[int]]:
        """The shape key (None: not keyable), the messages' texts, and which messages they are."""
        texts, where, rest = [], [], []
        for i, m in enumerate(messages):
            if type(m) is not dict:
                return None, (), []
            content = m.get("content")
            if type(content) is str:
                texts.append(content)
                where.append(i)
                rest.append({k: v for k, v in m.items() if k != "content"})
            else:
                rest.append(m)
        return rest, tuple(texts), where

    def key(self, rest: list[Any], where: list[int], tools: Any, add_generation_prompt: bool) -> str | None:
        try:
            return _KEY_JSON([rest, where, tools, add_generation_prompt])
        except (TypeError, ValueError, RecursionError):
            return None

    def find(self, key: str, texts: tuple[str, ...]) -> str | None:
        shape = self._shapes.get(key)
        if shape is None:
            return None
        self._shapes.move_to_end(key)
        for skeleton in shape.paths:
            if skeleton.fits(texts):
                self.hits += 1
                return skeleton.fill(texts)
        return None

    def wants_trace(self, key: str) -> bool:
        """Whether to trace a render of this shape: not at its first sighting (a shape met once, as
        a fork's conversation with its own tool calls is, never costs a second run), then while
        its paths are few and the trace has not failed on it twice."""
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = _Shape()
            if len(self._shapes) > self.size:
                self._shapes.popitem(last=False)
            return False
        return (
            shape.traces < TRACES_PER_SHAPE
            and shape.failed < FAILED_TRACES_PER_SHAPE
            and len(shape.paths) < PATHS_PER_SHAPE
        )

    def add(self, key: str, skeleton: Skeleton | None) -> None:
        shape = self._shapes.get(key)
        if shape is None:  # (dropped from the kept shapes meanwhile)
            return
        shape.traces += 1
        self.traces += 1
        if skeleton is not None:
            shape.paths.append(skeleton)
        else:
            shape.failed += 1


def symbolic_chat(chat: list[dict[str, Any]], where: list[int], trace: Trace) -> list[dict[str, Any]]:
    """`chat` (the template's plain copy of the messages) with message `where[k]`'s content the k-th
    traced text."""
    out = list(chat)
    for k, i in enumerate(where):
        out[i] = {**out[i], "content": Symbolic((k,), trace)}
    return out
