"""How tool calls and tool turns look in this model's chat format, in both directions.

Reading: a `ToolCallParser` turns the model's text into the calls it could read *and* the errors
for what it could not (bad JSON, a missing name, a call cut off by the length limit), so the loop
answers each error to the model and records it instead of silently dropping it.

Writing: `ChatDelta` gives the tokens the chat template puts around a turn, so a trajectory is
built by appending (the rendered prompt, exactly the ids the engine sampled, then the template's
tokens for the tool results, rendered after a fixed two-message stub so the cost does not grow with
the conversation). That equals "render the whole conversation each turn" only when the template is
append-only for tool turns: `check_append_only` verifies it once at start-up and
`conversation_drift` re-checks a finished sample, so a template that rewrites history (e.g. strips
past reasoning) is reported instead of silently training on tokens the model never saw.

The Hermes/Qwen convention (`<tool_call>{json}</tool_call>`) is written down once, in
`HermesParser`: it parses calls, and it writes them and the tool list for templates that do not.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from slime.tools.chat_render import TemplateRender
from slime.tools.segment_encoder import SegmentEncoder
from slime.utils.encoded_ids import EncodedIds

# ================================================================ the model's tool calls (reading)


@dataclass
class ToolCall:
    name: str
    arguments: Any
    raw: str
    index: int  # position among the calls (and errors) of this turn
    call_id: str = ""


@dataclass
class ParseError:
    kind: str  # "malformed_json" | "bad_call" | "cut_off" | "unclosed" | "unmatched_close"
    message: str
    raw: str
    index: int


@dataclass
class ParseResult:
    content: str  # the text before the first call (what a chat message's `content` would hold)
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ParseError] = field(default_factory=list)

    @property
    def items(self) -> list[ToolCall | ParseError]:
        """Calls and errors in the order they appeared, so answers keep the model's order."""
        return sorted([*self.calls, *self.errors], key=lambda x: x.index)

    def add(self, item: ToolCall | ParseError) -> None:
        (self.calls if isinstance(item, ToolCall) else self.errors).append(item)


class ToolCallParser:
    name = "base"

    def parse(self, text: str, cut_off: bool = False) -> ParseResult:
        """`cut_off`: the turn ended at the length limit, so an unclosed call was cut, not forgotten."""
        raise NotImplementedError


PARSERS: dict[str, type[ToolCallParser]] = {}


def register_parser(*names: str) -> Callable[[type[ToolCallParser]], type[ToolCallParser]]:
    def deco(cls: type[ToolCallParser]) -> type[ToolCallParser]:
        for n in names:
            PARSERS[n] = cls
        return cls

    return deco


def get_parser(name: str) -> ToolCallParser:
    if name not in PARSERS:
        raise ValueError(f"--tool-call-parser {name!r}: unknown parser (known: {sorted(PARSERS)})")
    return PARSERS[name]()


_SURROGATE = re.compile("[\ud800-\udfff]")


def is_text(value: Any) -> bool:
    """Every string in a decoded JSON value (keys too) is UTF-8 text: JSON's "\\ud800" escape is not,
    and would fail the tokenizer when the call is rendered into the next prompt."""
    if isinstance(value, str):
        return not _SURROGATE.search(value)
    if isinstance(value, dict):
        return all(is_text(k) and is_text(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_text(v) for v in value)
    return True


def _snippet(s: str, n: int = 200) -> str:
    return s if len(s) <= n else s[:n] + "..."


@register_parser("hermes", "qwen", "qwen25", "qwen3")
class HermesParser(ToolCallParser):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number per turn."""

    name = "hermes"
    OPEN, CLOSE = "<tool_call>", "</tool_call>"
    _tag = re.compile(f"{re.escape(OPEN)}|{re.escape(CLOSE)}")

    @classmethod
    def call_text(cls, name: str, arguments: Any) -> str:
        """One call as a model following this convention writes it."""
        return f"{cls.OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{cls.CLOSE}"

    @classmethod
    def tools_text(cls, tools: list[dict[str, Any]]) -> str:
        """The tool schemas and how to call them, for a system message (templates that ignore `tools`)."""
        listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return (
            "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{listing}\n</tools>\n\nFor each function call, return a json object with function name and "
            f"arguments within {cls.OPEN}{cls.CLOSE} XML tags:\n{cls.OPEN}\n"
            f'{{"name": <function-name>, "arguments": <args-json-object>}}\n{cls.CLOSE}'
        )

    def parse(self, text: str, cut_off: bool = False) -> ParseResult:
        first = text.find(self.OPEN)
        content = text if first < 0 else text[:first]
        result = ParseResult(content=content.removesuffix("\n"))
        idx, pos, open_at = 0, 0, None
        for m in self._tag.finditer(text):
            if m.group() == self.OPEN:
                if open_at is not None:  # a new call opened before the last one closed
                    result.add(
                        ParseError(
                            "unclosed",
                            f"a {self.OPEN} was not closed with {self.CLOSE} before the next {self.OPEN}",
                            _snippet(text[open_at : m.start()]),
                            idx,
                        )
                    )
                    idx += 1
                open_at = m.end()
            else:
                if open_at is None:
                    result.add(
                        ParseError(
                            "unmatched_close",
                            f"{self.CLOSE} without a matching {self.OPEN}",
                            _snippet(text[pos : m.end()]),
                            idx,
                        )
                    )
                else:
                    result.add(self._parse_body(text[open_at : m.start()], idx))
                    open_at = None
                idx += 1
            pos = m.end()
        if open_at is not None:
            if cut_off:
                result.add(
                    ParseError(
                        "cut_off",
                        f"the tool call was cut off by the length limit before {self.CLOSE}; it was not executed",
                        _snippet(text[open_at:]),
                        idx,
                    )
                )
            else:
                result.add(
                    ParseError(
                        "unclosed",
                        f"{self.OPEN} was never closed with {self.CLOSE}; it was not executed",
                        _snippet(text[open_at:]),
                        idx,
                    )
                )
        return result

    @staticmethod
    def _parse_body(body: str, idx: int) -> ToolCall | ParseError:
        raw = body.strip()

        def error(kind: str, message: str) -> ParseError:
            return ParseError(kind, message, _snippet(raw), idx)

        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            return error(
                "malformed_json", f"the tool call is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
            )
        except RecursionError:
            return error("malformed_json", "the tool call is JSON nested too deeply to read")
        if not is_text(obj):
            return error("malformed_json", "the tool call escapes a lone UTF-16 surrogate (\\udXXX), which is not text")
        if not isinstance(obj, dict):
            return error("bad_call", "a tool call must be a JSON object with 'name' and 'arguments'")
        name = obj.get("name")
        if not isinstance(name, str) or not name:
            return error("bad_call", "the tool call has no 'name' string")
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some models emit arguments as a JSON string
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                return error("malformed_json", f"the 'arguments' string of {name!r} is not valid JSON ({e.msg})")
            except RecursionError:
                return error("malformed_json", f"the 'arguments' string of {name!r} is nested too deeply to read")
            if not is_text(args):
                return error("malformed_json", f"the 'arguments' string of {name!r} escapes a lone surrogate")
        return ToolCall(name=name, arguments=args, raw=raw, index=idx)


# ================================================================ the template's tokens (writing)

SENTINEL = "SLIMEDELTASENTINEL"
_STUB_USER = {"role": "user", "content": "U"}
_PROBE = "slime_probe_tool_7f3a"


class TemplateDriftError(RuntimeError):
    """The chat template is not append-only for tool turns."""


@dataclass
class DriftReport:
    ok: bool
    detail: str = ""
    turn: int | None = None
    position: int | None = None


_PLAIN_ENCODE = {
    "encode": ("transformers.tokenization_utils_base",),
    "_encode_plus": ("transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils_fast"),
}
_PLAIN_DECODE = {
    "decode": ("transformers.tokenization_utils_base",),
    "_decode": ("transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils_fast"),
}


def _library_backend(tokenizer: Any, methods: dict[str, tuple[str, ...]]) -> Any:
    """The `tokenizers.Tokenizer` under an HF fast tokenizer when each of `methods` is the library's own
    (defined in one of the listed modules, not overridden by a subclass), else None."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or type(backend).__module__.split(".")[0] != "tokenizers":
        return None
    for name, modules in methods.items():
        if getattr(getattr(type(tokenizer), name, None), "__module__", None) not in modules:
            return None
    return backend


def plain_backend(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` of an HF fast tokenizer whose `encode` is the library's own (no
    subclass changing the text or the ids on the way), else None."""
    return _library_backend(tokenizer, _PLAIN_ENCODE)


def plain_decoder(tokenizer: Any) -> Any:
    """The `tokenizers.Tokenizer` whose `decode(ids, skip_special_tokens=False)` is what the HF
    tokenizer's own is (the library's `decode`/`_decode`, which add only a clean-up of spaces when
    `clean_up_tokenization_spaces` is set: `decode_text` checks that per call), else None."""
    return _library_backend(tokenizer, _PLAIN_DECODE)


def decode_text(tokenizer: Any, backend: Any, ids: list[int]) -> str:
    """`tokenizer.decode(ids, skip_special_tokens=False)`, straight from the Rust tokenizer when
    `backend` (`plain_decoder`) is set and no clean-up of spaces is asked for: a third of the cost
    of the HF wrapper, for the answer text a gateway decodes every turn."""
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return backend.decode(ids, skip_special_tokens=False)
    return tokenizer.decode(ids, skip_special_tokens=False)


class ChatDelta:
    """Prompt rendering, end-of-turn tokens and tool-result deltas for one tokenizer."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None):
        self.tok = tokenizer
        self.kwargs = dict(template_kwargs or {})
        self._backend = plain_backend(tokenizer)
        self._segments = SegmentEncoder.of(self._backend) if self._backend is not None else None
        self._template = TemplateRender(tokenizer, self.kwargs)
        self._template.agrees()  # HF's own render wherever the faster one would differ
        full = self.render([_STUB_USER, {"role": "assistant", "content": SENTINEL}])
        at = full.rfind(SENTINEL)
        if at < 0:
            raise TemplateDriftError("the chat template drops assistant content; cannot locate the end of a turn")
        self.eot_text = full[at + len(SENTINEL) :]  # e.g. "<|im_end|>\n"
        self.eot_ids = self.encode(self.eot_text)
        special = set(getattr(tokenizer, "all_special_ids", []) or []) | {getattr(tokenizer, "eos_token_id", None)}
        # The id a model emits to end its turn (its stop token), when the template starts the end with one.
        self.stop_id = self.eot_ids[0] if self.eot_ids and self.eot_ids[0] in special else None
        # Templates without tool support ignore `tools` and `tool_calls`; find out instead of losing them.
        probe = {
            "type": "function",
            "function": {"name": _PROBE, "description": "", "parameters": {"type": "object", "properties": {}}},
        }
        self.renders_tools = _PROBE in self.render([_STUB_USER], [probe], add_generation_prompt=True)
        self.renders_tool_calls = _PROBE in self.render(
            [
                _STUB_USER,
                {
                    "role": "assistant",
                    "content": "A",
                    "tool_calls": [{"type": "function", "function": {"name": _PROBE, "arguments": {}}}],
                },
            ]
        )

    def assistant_message(self, content: str, calls: list[tuple[str, Any]], raw: str) -> dict[str, Any]:
        """The chat message for a model turn: structured calls when the template renders them, else
        the raw text (so re-rendering keeps the calls the model wrote)."""
        if not self.renders_tool_calls:
            return {"role": "assistant", "content": raw}
        msg: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
        return msg

    def with_tools(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """When the template ignores `tools`, describe them in the system message (Hermes convention)."""
        if not tools or self.renders_tools:
            return messages
        text = HermesParser.tools_text(tools)
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
        return [{"role": "system", "content": text}, *messages]

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        return self._template.render(messages, tools or None, add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """`tok.encode(text, add_special_tokens=False)`; straight from the Rust tokenizer when the HF
        class adds nothing to it and nothing set truncation or padding on it (half the cost of a
        short text, which a gateway turn tokenises for every request)."""
        if self._plain_encode():
            if self._segments is not None:  # a long piece met before (a system message) is not encoded again
                return self._segments.encode(text)
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tok.encode(text, add_special_tokens=False))

    def _plain_encode(self) -> bool:
        """Whether the Rust tokenizer's own encode is the HF tokenizer's, as it stands now."""
        b = self._backend
        return (
            b is not None
            and b.truncation is None
            and b.padding is None
            and b.encode_special_tokens == bool(getattr(self.tok, "split_special_tokens", False))
        )

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.encode(self.render(self.with_tools(messages, tools), tools, add_generation_prompt=True))

    def prompt_encoded_ids(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> EncodedIds:
        """`prompt_ids` as `EncodedIds` (read-only), their JSON text for the engine built from the JSON
        text kept with each long piece met before (a system message's) where the segment encoder applies."""
        return self.encode_json(self.render(self.with_tools(messages, tools), tools, add_generation_prompt=True))

    def encode_json(self, text: str) -> EncodedIds:
        """`encode` as `EncodedIds`, their JSON text from the segment encoder's pieces and words where it applies."""
        if self._segments is not None and self._plain_encode():
            return self._segments.encode_json(text)
        return EncodedIds(self.encode(text))

    def turn_end_ids(self, model_ids: list[int]) -> list[int]:
        """Template tokens that close an assistant turn after what the model emitted (mask 0)."""
        e = self.eot_ids
        for k in range(min(len(e), len(model_ids)), 0, -1):
            if model_ids[-k:] == e[:k]:
                return e[k:]
        return list(e)

    def tool_delta_ids(self, tool_messages: list[dict[str, Any]], model_ids: list[int]) -> list[int]:
        """Turn end + the tool results + the next generation prompt, as the template renders them."""
        return self.delta_ids(tool_messages, model_ids, "tool results")

    def user_delta_ids(self, user_message: dict[str, Any], model_ids: list[int]) -> list[int]:
        """Turn end + a user turn (an interaction's reply) + the next generation prompt."""
        return self.delta_ids([user_message], model_ids, "a user turn")

    def tool_delta_encoded_ids(self, tool_messages: list[dict[str, Any]], model_ids: list[int]) -> EncodedIds:
        """`tool_delta_ids` as `EncodedIds`, their JSON text for the engine joined from the words' and kept
        pieces' own where the segment encoder applies (a gateway turn's delta, appended to the prompt it extends)."""
        end, text = self._delta(tool_messages, model_ids, "tool results")
        return EncodedIds(end).extended(self.encode_json(text))

    def delta_ids(self, messages: list[dict[str, Any]], model_ids: list[int], what: str) -> list[int]:
        """The template's tokens for `messages` following an assistant turn that emitted `model_ids`,
        rendered after a fixed two-message stub (the cost does not grow with the conversation)."""
        end, text = self._delta(messages, model_ids, what)
        return end + self.encode(text)

    def _delta(self, messages: list[dict[str, Any]], model_ids: list[int], what: str) -> tuple[list[int], str]:
        """The ids that close the model's turn, then the text the template renders after them."""
        full = self.render(
            [_STUB_USER, {"role": "assistant", "content": SENTINEL}, *messages], add_generation_prompt=True
        )
        at = full.rfind(SENTINEL) + len(SENTINEL)
        if not full.startswith(self.eot_text, at):
            raise TemplateDriftError(
                f"the chat template ends an assistant turn differently when {what} "
                f"follow: expected {self.eot_text!r}, got {full[at : at + 40]!r}"
            )
        return self.turn_end_ids(model_ids), full[at + len(self.eot_text) :]

    def thinks(self) -> bool:
        """Whether samples from this template open with a reasoning block (Qwen3-style thinking models)."""
        src = getattr(self.tok, "chat_template", None) or ""
        return "</think>" in str(src) and self.kwargs.get("enable_thinking", True) is not False

    def compare(self, ours: list[int], ref: list[int], turn: int | None, what: str) -> DriftReport:
        """Where the appended ids `ours` first differ from the re-rendered `ref` (decoded around it)."""
        n = min(len(ours), len(ref))
        j = next((i for i in range(n) if ours[i] != ref[i]), n)
        if j == len(ours) == len(ref):
            return DriftReport(True)
        lo = max(0, j - 8)
        detail = (
            f"{what}: token {j} differs; delta method has {self.tok.decode(ours[lo : j + 8])!r}, "
            f"re-rendering has {self.tok.decode(ref[lo : j + 8])!r}"
        )
        return DriftReport(False, detail, turn, j)


# ================================================================ is the template append-only?


def _synthetic_conversation(delta: ChatDelta, tool_names: list[str]) -> list[dict[str, Any]]:
    a, b = (tool_names + ["lookup", "lookup"])[:2] if tool_names else ("lookup", "lookup")
    thinking = delta.thinks()

    def asst(text: str, calls: list[tuple[str, dict]]) -> dict[str, Any]:
        content = (f"<think>\nI should work on: {text}\n</think>\n\n" if thinking else "") + text
        raw = content + "".join(f"\n{HermesParser.call_text(n, args)}" for n, args in calls)
        return delta.assistant_message(content, calls, raw)

    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 3 + 4? Use the tools."},
        asst("Let me check.", [(a, {"query": "3 + 4"})]),
        {"role": "tool", "name": a, "content": "7"},
        asst("Two more checks.", [(a, {"query": "7"}), (b, {"query": "seven", "n": [1, 2]})]),
        {"role": "tool", "name": a, "content": "7"},
        {"role": "tool", "name": b, "content": '{"ok": true}'},
        asst("The answer is 7.", []),
    ]


def check_append_only(delta: ChatDelta, tools: list[dict[str, Any]] | None = None) -> DriftReport:
    """Render a tool conversation turn by turn and compare with the delta method's ids.

    Turn by turn: prompt_i = render(history before assistant turn i, generation prompt); the
    model's canonical output for turn i is what the template renders for that assistant message.
    Delta method: prompt_0 + outputs + `tool_delta_ids`. Any difference is drift.
    """
    names = [t["function"]["name"] for t in tools or []]
    msgs = delta.with_tools(_synthetic_conversation(delta, names), tools)
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    ours: list[int] = []
    for t, a in enumerate(turns):
        p_text = delta.render(msgs[:a], tools, add_generation_prompt=True)
        p_ids = delta.encode(p_text)
        if t == 0:
            ours = list(p_ids)
        else:
            rep = delta.compare(ours, p_ids, t, f"prompt of turn {t + 1}")
            if not rep.ok:
                return rep
        f_text = delta.render(msgs[: a + 1], tools)
        if not f_text.startswith(p_text):
            return DriftReport(
                False, f"turn {t + 1}: the rendered assistant turn does not start with the generation prompt", t, None
            )
        out = f_text[len(p_text) :]
        if not out.endswith(delta.eot_text):
            return DriftReport(
                False, f"turn {t + 1}: the rendered assistant turn does not end with {delta.eot_text!r}", t, None
            )
        model_ids = delta.encode(out[: len(out) - len(delta.eot_text)])
        if delta.stop_id is not None:
            model_ids.append(delta.stop_id)
        ours += model_ids
        end = turns[t + 1] if t + 1 < len(turns) else len(msgs)
        tool_msgs = msgs[a + 1 : end]
        ours += delta.tool_delta_ids(tool_msgs, model_ids) if tool_msgs else delta.turn_end_ids(model_ids)
    return delta.compare(ours, delta.encode(delta.render(msgs, tools)), len(turns) - 1, "whole conversation")


def conversation_drift(
    delta: ChatDelta,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    ids: list[int],
    prompt_length: int,
) -> DriftReport:
    """Would re-rendering this finished conversation give the ids we trained on?

    `ids` must end with a complete assistant turn. The position is relative to the response.
    """
    ref = delta.encode(delta.render(delta.with_tools(messages, tools), tools))
    rep = delta.compare(list(ids) + delta.turn_end_ids(ids), ref, None, "re-rendered conversation")
    if rep.position is not None:
        rep.position -= prompt_length
    return rep
