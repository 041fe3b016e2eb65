"""Prompt ids for a turn: `DeltaRender` appends only the template delta, `FullRender` re-renders.

`DeltaRender` (the gateway's): when a request's messages continue an answer the session sent
(any of them: `Conversations`, keyed by conversation), with the same tools, the prompt is that
answer's ids -- the rendered prompt and exactly the ids the engine sampled -- followed by the chat
template's tokens for the new messages (`ChatDelta.tool_delta_ids`), so history is never
re-tokenised. Anything else (compaction, an edited message, a rewritten answer) is rendered whole
and the trajectory branches there. `FullRender` is slime's way, for any `apply_chat_template`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from slime.agent.gateway.session import Session
from slime.tools.chat_format import ChatDelta, HermesParser, TemplateDriftError
from slime.utils.encoded_ids import EncodedIds
from slime.utils.json_text import acyclic_dumps

KEPT_PROMPTS = 256  # whole renders kept per gateway (a rollout batch's distinct first prompts)
_KEY_JSON = acyclic_dumps()  # (messages and tools read from JSON: no cycle to check for)


class PromptRenderer(Protocol):
    def prompt_ids(
        self, session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]: ...

    def remember(
        self,
        session: Session,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        prompt_ids: list[int],
        answer: dict[str, Any],
        output_ids: list[int],
    ) -> None: ...


class RenderedPrompts:
    """The last whole renders, keyed by the messages' and tools' JSON text (content and key order:
    what the template sees). The sessions of one task (`--n-samples-per-prompt`, a GRPO group) open
    with the same prompt; it is rendered once. The ids are `EncodedIds`, read-only, so sessions
    share them safely and the engine gets their JSON text without encoding them again."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._ids: OrderedDict[str, EncodedIds] = OrderedDict()

    def key(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str | None:
        """None: nothing kept (size 0, or something JSON cannot write, which is then never shared)."""
        try:
            return _KEY_JSON([messages, tools]) if self.size else None
        except (TypeError, ValueError, RecursionError):
            return None

    def get(self, key: str | None) -> EncodedIds | None:
        ids = self._ids.get(key) if key is not None else None
        if ids is not None:
            self._ids.move_to_end(key)
        return ids

    def put(self, key: str | None, encoded: EncodedIds) -> EncodedIds:
        if key is None:
            return encoded
        self._ids[key] = encoded
        if len(self._ids) > self.size:
            self._ids.popitem(last=False)
        return encoded


class FullRender:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def prompt_ids(
        self, session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        enc = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True)
        return list(enc["input_ids"] if isinstance(enc, Mapping) else enc)

    def remember(
        self,
        session: Session,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        prompt_ids: list[int],
        answer: dict[str, Any],
        output_ids: list[int],
    ) -> None:
        return None


class DeltaRender:
    def __init__(
        self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None, kept_prompts: int = KEPT_PROMPTS
    ) -> None:
        self.delta = ChatDelta(tokenizer, template_kwargs)
        self.full_renders = 0  # prompts rendered whole (first turns and forks), for the benchmark
        # a template that writes today's date renders differently tomorrow: nothing of it is kept
        dated = "strftime_now" in str(getattr(tokenizer, "chat_template", None) or "")
        self.prompts = RenderedPrompts(0 if dated else kept_prompts)

    def prompt_ids(
        self, session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        found = session.conversations.continued(messages, tools)
        if found is not None:
            answer, n = found
            try:
                delta = self.delta.tool_delta_encoded_ids(messages[n:], answer.output_ids)
                return answer.prompt.extended(answer.output_ids, delta)
            except TemplateDriftError:  # this template closes a turn differently here: render it whole
                pass
        key = self.prompts.key(messages, tools)
        ids = self.prompts.get(key)
        if ids is None:
            self.full_renders += 1
            ids = self.prompts.put(key, self.delta.prompt_encoded_ids(self.for_template(messages), tools))
        return ids

    def remember(
        self,
        session: Session,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        prompt_ids: list[int],
        answer: dict[str, Any],
        output_ids: list[int],
    ) -> None:
        session.conversations.add(messages, answer, tools, prompt_ids, output_ids)

    def for_template(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Assistant tool calls as text when the template would drop structured ones."""
        if self.delta.renders_tool_calls:
            return messages
        return [self._as_text(m) if m.get("role") == "assistant" and m.get("tool_calls") else m for m in messages]

    @staticmethod
    def _as_text(m: dict[str, Any]) -> dict[str, Any]:
        calls = [
            HermesParser.call_text(c["function"]["name"], c["function"].get("arguments", {})) for c in m["tool_calls"]
        ]
        return {"role": "assistant", "content": "\n".join([m.get("content") or "", *calls]).strip("\n")}
