"""`Conversations`: the answers a session sent, each keyed by the conversation that led to it.

A request whose messages continue one of them -- that conversation, our answer as recorded, then
new messages -- with the same tools is prompted with that answer's ids (the prompt we sent and
exactly the ids we sampled) plus the chat template's delta for the new messages. Keyed by their
own prefixes, conversations interleaved in one session (a sub-agent, a second client, a retry)
each keep their history: none pushes another's out to be re-rendered over what was sampled.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from slime.agent.gateway.records import one_step_init
from slime.agent.gateway.tree import LastWalk, child_for, walk
from slime.utils.encoded_ids import EncodedIds


@one_step_init
@dataclasses.dataclass(frozen=True)
class PromptPrefix:
    """One answer we sent: the tools of its request, the prompt's ids with their JSON text, then
    exactly the sampled ids; the next prompt is `prompt.extended(output_ids, delta)`, which copies
    the ids once and encodes only the answer and the delta."""

    tools: list[dict[str, Any]] | None
    prompt: EncodedIds
    output_ids: list[int]


class _Node:
    __slots__ = ("message", "echo", "children", "answers")

    def __init__(self, message: dict[str, Any] | None = None) -> None:
        self.message = message
        self.echo: dict[str, Any] | None = None  # the client's object last found equal to `message`
        self.children: list[_Node] = []
        self.answers: list[PromptPrefix] = []  # set on the node of an answer we sent

    def child(self, message: dict[str, Any]) -> _Node | None:
        return child_for(self.children, message)

    def add(self, message: dict[str, Any]) -> _Node:
        self.children.append(node := _Node(message))
        return node


class Conversations:
    def __init__(self) -> None:
        self.root = _Node()
        self.sent = 0  # answers added
        self.last = LastWalk()  # the last walk, where the conversation's next request starts

    def __len__(self) -> int:
        return self.sent

    def add(
        self,
        messages: list[dict[str, Any]],
        answer: dict[str, Any],
        tools: list[dict[str, Any]] | None,
        prompt_ids: list[int],
        output_ids: list[int],
    ) -> None:
        path = walk(self.root, messages, self.last)
        node = path[-1] if path else self.root
        for m in messages[len(path) :]:
            node = node.add(m)
            path.append(node)
        self.last.keep(messages, path)  # not the answer: the client sends back its own copy of it
        node = node.child(answer) or node.add(answer)
        prompt = prompt_ids if isinstance(prompt_ids, EncodedIds) else EncodedIds(prompt_ids)
        node.answers.append(PromptPrefix(tools, prompt, list(output_ids)))
        self.sent += 1

    def continued(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> tuple[PromptPrefix, int] | None:
        """The answer deepest in `messages` (asked with these tools) that new messages follow, and
        how many messages it covers; the first answer sent when a retry left several."""
        path = walk(self.root, messages[:-1], self.last)
        for depth in range(len(path), 0, -1):
            for answer in path[depth - 1].answers:
                if answer.tools == tools:
                    return answer, depth
        return None
