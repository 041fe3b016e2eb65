"""`TemplateRender`: `tokenizer.apply_chat_template(messages, tools=..., tokenize=False, ...)` at a
lower cost per call, the same text, in the same sandbox.

A gateway renders every session's first prompt (a prompt of its own per session, as agent tasks
have). Per render, HF's `apply_chat_template` spends about a third of its time around the template:
argument handling, a copy of the inputs as plain data, and Jinja's sandbox asking
`is_safe_attribute` on every attribute the template reads (`message.role`, `content.startswith`).
This renders with HF's own compiled template and environment (an overlay of it: same filters,
globals, extensions and sandbox), on the inputs HF would pass (its own helpers build them, or
`plain_data`, which builds the same), with the template's globals as one plain dict, and keeps the
sandbox's answers per (type, attribute) for the plain types template data is made of and jinja's
namespace and loop objects (for those, jinja's answer depends on nothing else). The template is NOT run outside the sandbox:
it is the checkpoint's file, data that must not become code running in the gateway (which holds
every session's key); that would save a further ~20% of a render, not worth it.

Any doubt falls back to `apply_chat_template`: a transformers without these helpers, tools given as
callables, or a probe conversation rendering differently at start-up (`agrees`).

On top, a conversation of a shape met before (the same roles and tools, other texts) is served by
the skeleton of that shape's render when its texts take the same path through the template
(`chat_skeleton`): a gateway's first prompts, one task per session, cost one Jinja run per shape.
"""

from __future__ import annotations

from types import BuiltinMethodType as _BuiltinMethod
from typing import Any

import jinja2.runtime
import jinja2.sandbox
import jinja2.utils

from slime.tools.chat_skeleton import Skeleton, Skeletons, Trace, Untraceable, symbolic_chat, tracing_environment

_PLAIN_TYPES = (str, dict, list, tuple, int, float, bool, type(None))
_JSON_SCALARS = (str, int, float, bool, type(None))
# jinja's own run-time objects a template reads attributes of (`ns.found`, `loop.index0`): for these
# too, jinja's answer is the attribute name's and the type's alone (no ABC registers them)
_RUNTIME_TYPES = (jinja2.utils.Namespace, jinja2.runtime.LoopContext)
# the sandbox implementations whose answers are known to depend on (type, attribute) only
_JINJA_SAFETY = (
    jinja2.sandbox.SandboxedEnvironment.is_safe_attribute,
    jinja2.sandbox.ImmutableSandboxedEnvironment.is_safe_attribute,
)
_DICT_NAMES = frozenset(dir(dict))  # what `getattr` finds on a plain dict: any other name is a key lookup
_STR_FORMATS = frozenset({"format", "format_map"})  # the str methods jinja's sandbox wraps (`wrap_str_format`)

try:  # transformers' own pieces of apply_chat_template (private: checked at start-up, else not used)
    from transformers.utils.chat_template_utils import (
        _alias_reasoning_fields,
        _compile_jinja_template,
        _plain_template_data,
    )
except ImportError:  # pragma: no cover - an older or newer transformers: apply_chat_template itself
    _compile_jinja_template = None


def memoized_safety(env: Any) -> None:
    """`env.is_safe_attribute`, its answers kept per (type, attribute) for plain data types and
    jinja's namespace and loop objects (whose answer jinja derives from the type and the name alone);
    anything else is asked every time, and so is everything when the environment's class answers in
    a way of its own."""
    if type(env).is_safe_attribute not in _JINJA_SAFETY:
        return
    ask = env.is_safe_attribute
    known: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(obj: Any, attr: str, value: Any) -> bool:
        cls = type(obj)
        if cls not in _PLAIN_TYPES and not issubclass(cls, _RUNTIME_TYPES):
            return ask(obj, attr, value)
        key = (cls, attr)
        safe = known.get(key)
        if safe is None:
            safe = known[key] = ask(obj, attr, value)
        return safe

    env.is_safe_attribute = is_safe_attribute


def plain_lookups(env: Any) -> None:
    """`env.getattr` and `env.call` taking the sandbox's own answer the short way for what a chat
    template spends its lookups on, where the long way ends in the same value: a plain dict's key
    (`message.role`: jinja tries the attribute first, which raises AttributeError for any name dict
    lacks, then the key), a plain str's attribute (`is_safe_attribute` asked as there) and a call of
    a plain str's method (`content.startswith`: the sandbox finds no unsafe marker on a builtin
    method, and jinja's context just calls it, without its `_loop_vars`/`_block_vars` arguments).
    `format`/`format_map`, which the sandbox wraps, names a dict has (`items`), other types and other
    callables take the sandbox's way; nothing changes when the environment's class has its own."""
    sandbox = jinja2.sandbox.SandboxedEnvironment
    cls = type(env)
    if (
        cls.getattr is not sandbox.getattr
        or cls.call is not sandbox.call
        or cls.is_safe_callable is not sandbox.is_safe_callable
        or env.context_class is not jinja2.runtime.Context
    ):
        return
    slow_getattr, slow_call, undefined = env.getattr, env.call, env.undefined

    def getattr_(obj: Any, attribute: str) -> Any:
        cls = type(obj)
        if cls is dict and attribute not in _DICT_NAMES:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return undefined(obj=obj, name=attribute)
        if cls is str and attribute not in _STR_FORMATS:  # the sandbox's way, less its format check
            try:
                value = getattr(obj, attribute)
            except AttributeError:
                return slow_getattr(obj, attribute)
            return value if env.is_safe_attribute(obj, attribute, value) else env.unsafe_undefined(obj, attribute)
        return slow_getattr(obj, attribute)

    def call(context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        if type(obj) is _BuiltinMethod and type(obj.__self__) is str and obj.__name__ not in _STR_FORMATS:
            kwargs.pop("_block_vars", None)  # jinja's own (its context's `call` drops them)
            kwargs.pop("_loop_vars", None)
            return obj(*args, **kwargs)
        return slow_call(context, obj, *args, **kwargs)

    env.getattr, env.call = getattr_, call


def plain_data(value: Any) -> Any:
    """`_plain_template_data(value)` (HF's copy of a template's inputs as plain JSON types), the same
    result, by exact-type checks for the JSON types a request body is made of (HF's walk asks
    `isinstance` against `Mapping`, an ABC, at every level); anything else is HF's own."""
    cls = type(value)
    if cls in _JSON_SCALARS:
        return value
    if cls is dict:
        return {k if type(k) is str else plain_data(k): plain_data(v) for k, v in value.items()}
    if cls is list:
        return [plain_data(v) for v in value]
    return _plain_template_data(value)


class TemplateRender:
    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None, skeletons: bool = True) -> None:
        """`skeletons`: reuse a render for conversations that differ only in their texts and take the
        same path through the template (`chat_skeleton`)."""
        self.tok = tokenizer
        self.kwargs = dict(template_kwargs or {})
        self._compiled: dict[str, Any] = {}  # template source -> our overlay's compiled template
        self._tracing: dict[str, Any] = {}  # template source -> the same, compiled for tracing
        self._skeletons: dict[str, Skeletons] = {}  # template source -> its skeletons
        self.skeletons = skeletons
        self.fast = _compile_jinja_template is not None

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        if self.fast and all(isinstance(t, dict) for t in tools or ()):
            if self.skeletons:
                return self.render_by_skeleton(messages, tools, add_generation_prompt)
            return self.render_fast(messages, tools, add_generation_prompt)
        return self.reference(messages, tools, add_generation_prompt)

    def render_by_skeleton(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        """`render_fast`'s text: a skeleton's, filled with the messages' texts, when one of this
        conversation's shape fits them; else rendered, and the render traced for the next ones."""
        source = self.tok.get_chat_template(None, tools or None)
        skeletons = self._skeletons.get(source)
        if skeletons is None:
            skeletons = self._skeletons[source] = Skeletons()
        rest, texts, where = skeletons.texts_of(messages)
        key = skeletons.key(rest, where, tools or None, add_generation_prompt) if rest is not None else None
        if key is None:
            return self.render_fast(messages, tools, add_generation_prompt)
        text = skeletons.find(key, texts)
        if text is not None:
            return text
        text = self.render_fast(messages, tools, add_generation_prompt)
        if skeletons.wants_trace(key):
            skeletons.add(key, self.trace(source, messages, tools, add_generation_prompt, where, texts, text))
        return text

    def trace(
        self,
        source: str,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        where: list[int],
        texts: tuple[str, ...],
        rendered: str,
    ) -> Skeleton | None:
        """The skeleton of this conversation's path through the template; None where the template
        does something with a text the trace does not follow, or the skeleton, filled with these
        texts, is not `rendered` (the real render's text)."""
        trace = Trace(texts)
        inputs = self.template_inputs(messages, tools, add_generation_prompt)
        inputs["messages"] = symbolic_chat(inputs["messages"], where, trace)
        try:
            out = self._tracing_template(source).render(**inputs)
        except (Untraceable, Exception):  # noqa: BLE001 - any doubt: this path is rendered whole
            return None
        skeleton = Skeleton.of(out, trace.guards)
        return skeleton if skeleton is not None and skeleton.fill(texts) == rendered else None

    def _tracing_template(self, source: str) -> Any:
        template = self._tracing.get(source)
        if template is None:
            template = self._tracing[source] = _compiled(
                tracing_environment(self._template(source).environment), source
            )
        return template

    def reference(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        return self.tok.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt, **self.kwargs
        )

    def render_fast(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        """What `apply_chat_template` renders for one conversation, tokenize=False."""
        template = self._template(self.tok.get_chat_template(None, tools or None))
        return template.render(**self.template_inputs(messages, tools, add_generation_prompt))

    def template_inputs(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> dict[str, Any]:
        """What HF's `apply_chat_template` passes its template: plain copies of the inputs."""
        chat = plain_data([{k: v for k, v in m.items() if v is not None} for m in messages])
        for m in chat:
            if not isinstance(m, dict):
                raise TypeError(f"Chat messages should be dicts, but got {m!r}.")
        return dict(
            messages=_alias_reasoning_fields(chat),
            tools=plain_data(tools or None),
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **plain_data({**self.tok.special_tokens_map, **self.kwargs}),
        )

    def _template(self, source: str) -> Any:
        template = self._compiled.get(source)
        if template is None:
            env = _compile_jinja_template(source).environment.overlay()  # HF's sandbox, filters and globals
            memoized_safety(env)
            plain_lookups(env)
            template = self._compiled[source] = _compiled(env, source)
        return template

    def agrees(self, probes: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool]] = None) -> bool:
        """Whether the fast render gives `apply_chat_template`'s text for each probe (messages, tools,
        generation prompt; `PROBES` by default) this template renders; if not, if it fails where HF
        does not, or if no probe renders at all, it is switched off and HF's render used."""
        compared = 0
        for messages, tools, gen in PROBES if probes is None else probes:
            if not self.fast:
                break
            try:
                want = self.reference(messages, tools, gen)
            except Exception:  # noqa: BLE001 - a conversation this template refuses tells nothing
                continue
            try:
                self.fast = self.render_fast(messages, tools, gen) == want
            except Exception:  # noqa: BLE001
                self.fast = False
            compared += 1
        self.fast = self.fast and compared > 0
        return self.fast


def _compiled(env: Any, source: str) -> Any:
    template = env.from_string(source)
    # its globals as one plain dict, not jinja's ChainMap over the environment's: every render copies
    # them into its context twice (the environment's globals are set before compiling)
    template.globals = dict(template.globals)
    return template


_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "Look something up.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}
_CALL = {"type": "function", "function": {"name": "probe_tool", "arguments": {"q": "x"}}}
PROBES = [  # what a gateway renders: first prompts, tools, calls, tool results, reasoning, None fields
    ([{"role": "user", "content": "U"}], None, True),
    ([{"role": "system", "content": "S"}, {"role": "user", "content": "U", "name": None}], [_TOOL], True),
    (
        [
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A", "reasoning_content": "R"},
            {"role": "user", "content": "V"},
        ],
        None,
        True,
    ),
    (
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "", "tool_calls": [_CALL]},
            {"role": "tool", "content": "7"},
        ],
        [_TOOL],
        True,
    ),
    ([{"role": "user", "content": "U"}, {"role": "assistant", "content": "<think>\nr\n</think>\n\nA"}], None, False),
]
