"""Token accounting for multi-turn chats: template *deltas* instead of re-rendering history.

The trajectory is built by appending: the rendered prompt, then exactly the ids the engine
sampled, then the tokens the chat template inserts for tool results (rendered on their own,
after a fixed two-message stub, so the cost does not grow with the conversation). This is only
equal to "render the whole conversation each turn" when the template is append-only for tool
turns; `check_append_only` verifies that once at start-up and `conversation_drift` re-checks a
finished sample, so a template that rewrites history (e.g. strips past reasoning) is reported
instead of silently training on tokens the model never saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

SENTINEL = "SLIMEDELTASENTINEL"
_STUB_USER = {"role": "user", "content": "U"}
_PROBE = "slime_probe_tool_7f3a"


def hermes_tools_text(tools: list[dict[str, Any]]) -> str:
    """Tool schemas described in the Hermes/Qwen convention (for templates that ignore `tools`)."""
    listing = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
            f"{listing}\n</tools>\n\nFor each function call, return a json object with function name and "
            "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


class TemplateDriftError(RuntimeError):
    """The chat template is not append-only for tool turns."""


@dataclass
class DriftReport:
    ok: bool
    detail: str = ""
    turn: int | None = None
    position: int | None = None


class ChatDelta:
    """Prompt rendering, end-of-turn tokens and tool-result deltas for one tokenizer."""

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None):
        self.tok = tokenizer
        self.kwargs = dict(template_kwargs or {})
        full = self.render([_STUB_USER, {"role": "assistant", "content": SENTINEL}])
        at = full.rfind(SENTINEL)
        if at < 0:
            raise TemplateDriftError("the chat template drops assistant content; cannot locate the end of a turn")
        self.eot_text = full[at + len(SENTINEL):]  # e.g. "<|im_end|>\n"
        self.eot_ids = self.encode(self.eot_text)
        special = set(getattr(tokenizer, "all_special_ids", []) or []) | {getattr(tokenizer, "eos_token_id", None)}
        # The id a model emits to end its turn (its stop token), when the template starts the end with one.
        self.stop_id = self.eot_ids[0] if self.eot_ids and self.eot_ids[0] in special else None
        # Templates without tool support ignore `tools` and `tool_calls`; find out instead of losing them.
        probe = {"type": "function", "function": {"name": _PROBE, "description": "", "parameters": {
            "type": "object", "properties": {}}}}
        self.renders_tools = _PROBE in self.render([_STUB_USER], [probe], add_generation_prompt=True)
        self.renders_tool_calls = _PROBE in self.render([_STUB_USER, {
            "role": "assistant", "content": "A", "tool_calls": [{"type": "function", "function": {
                "name": _PROBE, "arguments": {}}}]}])

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
        text = hermes_tools_text(tools)
        if messages and messages[0].get("role") == "system":
            return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
        return [{"role": "system", "content": text}, *messages]

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = False) -> str:
        return self.tok.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                            add_generation_prompt=add_generation_prompt, **self.kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.encode(self.render(self.with_tools(messages, tools), tools, add_generation_prompt=True))

    def turn_end_ids(self, model_ids: list[int]) -> list[int]:
        """Template tokens that close an assistant turn after what the model emitted (mask 0)."""
        e = self.eot_ids
        for k in range(min(len(e), len(model_ids)), 0, -1):
            if model_ids[-k:] == e[:k]:
                return e[k:]
        return list(e)

    def tool_delta_ids(self, tool_messages: list[dict[str, Any]], model_ids: list[int]) -> list[int]:
        """Turn end + the tool results + the next generation prompt, as the template renders them."""
        full = self.render([_STUB_USER, {"role": "assistant", "content": SENTINEL}, *tool_messages],
                           add_generation_prompt=True)
        at = full.rfind(SENTINEL) + len(SENTINEL)
        if not full.startswith(self.eot_text, at):
            raise TemplateDriftError("the chat template ends an assistant turn differently when tool results "
                                     f"follow: expected {self.eot_text!r}, got {full[at:at + 40]!r}")
        return self.turn_end_ids(model_ids) + self.encode(full[at + len(self.eot_text):])

    def _compare(self, ours: list[int], ref: list[int], turn: int | None, what: str) -> DriftReport:
        n = min(len(ours), len(ref))
        j = next((i for i in range(n) if ours[i] != ref[i]), n)
        if j == len(ours) == len(ref):
            return DriftReport(True)
        lo = max(0, j - 8)
        detail = (f"{what}: token {j} differs; delta method has {self.tok.decode(ours[lo:j + 8])!r}, "
                  f"re-rendering has {self.tok.decode(ref[lo:j + 8])!r}")
        return DriftReport(False, detail, turn, j)


def _synthetic_conversation(delta: ChatDelta, tool_names: list[str], thinking: bool) -> list[dict[str, Any]]:
    a, b = (tool_names + ["lookup", "lookup"])[:2] if tool_names else ("lookup", "lookup")

    def asst(text: str, calls: list[tuple[str, dict]]) -> dict[str, Any]:
        content = (f"<think>\nI should work on: {text}\n</think>\n\n" if thinking else "") + text
        raw = content + "".join(f"\n<tool_call>\n{json.dumps({'name': n, 'arguments': args})}\n</tool_call>"
                                for n, args in calls)
        return delta.assistant_message(content, calls, raw)

    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 3 + 4? Use the tools."},
        asst("Let me check.", [(a, {"query": "3 + 4"})]),
        {"role": "tool", "name": a, "content": "7"},
        asst("Two more checks.", [(a, {"query": "7"}), (b, {"query": "seven", "n": [1, 2]})]),
        {"role": "tool", "name": a, "content": "7"},
        {"role": "tool", "name": b, "content": "{\"ok\": true}"},
        asst("The answer is 7.", []),
    ]


def template_thinks(delta: ChatDelta) -> bool:
    """Whether samples from this template open with a reasoning block (Qwen3-style thinking models)."""
    src = getattr(delta.tok, "chat_template", None) or ""
    return "</think>" in str(src) and delta.kwargs.get("enable_thinking", True) is not False


def check_append_only(delta: ChatDelta, tools: list[dict[str, Any]] | None = None) -> DriftReport:
    """Render a tool conversation turn by turn and compare with the delta method's ids.

    Turn by turn: prompt_i = render(history before assistant turn i, generation prompt); the
    model's canonical output for turn i is what the template renders for that assistant message.
    Delta method: prompt_0 + outputs + `tool_delta_ids`. Any difference is drift.
    """
    names = [t["function"]["name"] for t in tools or []]
    msgs = delta.with_tools(_synthetic_conversation(delta, names, template_thinks(delta)), tools)
    turns = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    ours: list[int] = []
    for t, a in enumerate(turns):
        p_text = delta.render(msgs[:a], tools, add_generation_prompt=True)
        p_ids = delta.encode(p_text)
        if t == 0:
            ours = list(p_ids)
        else:
            rep = delta._compare(ours, p_ids, t, f"prompt of turn {t + 1}")
            if not rep.ok:
                return rep
        f_text = delta.render(msgs[:a + 1], tools)
        if not f_text.startswith(p_text):
            return DriftReport(False, f"turn {t + 1}: the rendered assistant turn does not start with the "
                               "generation prompt", t, None)
        out = f_text[len(p_text):]
        if not out.endswith(delta.eot_text):
            return DriftReport(False, f"turn {t + 1}: the rendered assistant turn does not end with "
                               f"{delta.eot_text!r}", t, None)
        model_ids = delta.encode(out[:len(out) - len(delta.eot_text)])
        if delta.stop_id is not None:
            model_ids.append(delta.stop_id)
        ours += model_ids
        end = turns[t + 1] if t + 1 < len(turns) else len(msgs)
        tool_msgs = msgs[a + 1:end]
        if tool_msgs:
            ours += delta.tool_delta_ids(tool_msgs, model_ids)
        else:
            ours += delta.turn_end_ids(model_ids)
    return delta._compare(ours, delta.encode(delta.render(msgs, tools)), len(turns) - 1, "whole conversation")


def conversation_drift(delta: ChatDelta, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                       ids: list[int], prompt_length: int) -> DriftReport:
    """Would re-rendering this finished conversation give the ids we trained on?

    `ids` must end with a complete assistant turn. The position is relative to the response.
    """
    ref = delta.encode(delta.render(delta.with_tools(messages, tools), tools))
    ours = list(ids) + delta.turn_end_ids(ids)
    rep = delta._compare(ours, ref, None, "re-rendered conversation")
    if rep.position is not None:
        rep.position -= prompt_length
    return rep
