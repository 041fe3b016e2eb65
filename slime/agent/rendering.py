"""Prompt ids for a turn: `DeltaRender` appends only the template delta, `FullRender` re-renders.

`DeltaRender` (the gateway's): when a request's messages continue an answer the session sent
(any of them: `Conversations`, keyed by conversation), with the same tools, the prompt is that
answer's ids -- the rendered prompt and exactly the ids the engine sampled -- followed by the chat
template's tokens for the new messages (`ChatDelta.tool_delta_ids`), so history is never
re-tokenised. Anything else (compaction, an edited message, a rewritten answer) is rendered whole
and the trajectory branches there. `FullRender` is slime's way, for any `apply_chat_template`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from slime.agent.session import Session
from slime.tools.chat_format import ChatDelta, HermesParser, TemplateDriftError


class PromptRenderer(Protocol):
    def prompt_ids(self, session: Session, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None) -> list[int]: ...

    def remember(self, session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 prompt_ids: list[int], answer: dict[str, Any], output_ids: list[int]) -> None: ...


class FullRender:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def prompt_ids(self, session: Session, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None) -> list[int]:
        enc = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=True)
        return list(enc["input_ids"] if isinstance(enc, Mapping) else enc)

    def remember(self, session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 prompt_ids: list[int], answer: dict[str, Any], output_ids: list[int]) -> None:
        return None


class DeltaRender:
    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> None:
        self.delta = ChatDelta(tokenizer, template_kwargs)
        self.full_renders = 0  # prompts rendered whole (first turns and forks), for the benchmark

    def prompt_ids(self, session: Session, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None) -> list[int]:
        found = session.conversations.continued(messages, tools)
        if found is not None:
            answer, n = found
            try:
                delta = self.delta.tool_delta_ids(messages[n:], answer.output_ids)
                return answer.prompt.extended(answer.output_ids, delta)
            except TemplateDriftError:  # this template closes a turn differently here: render it whole
                pass
        self.full_renders += 1
        return self.delta.prompt_ids(self.for_template(messages), tools)

    def remember(self, session: Session, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                 prompt_ids: list[int], answer: dict[str, Any], output_ids: list[int]) -> None:
        session.conversations.add(messages, answer, tools, prompt_ids, output_ids)

    def for_template(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Assistant tool calls as text when the template would drop structured ones."""
        if self.delta.renders_tool_calls:
            return messages
        return [self._as_text(m) if m.get("role") == "assistant" and m.get("tool_calls") else m for m in messages]

    @staticmethod
    def _as_text(m: dict[str, Any]) -> dict[str, Any]:
        calls = [HermesParser.call_text(c["function"]["name"], c["function"].get("arguments", {}))
                 for c in m["tool_calls"]]
        return {"role": "assistant", "content": "\n".join([m.get("content") or "", *calls]).strip("\n")}
