"""`TurnTree`: one session's conversations as a tree of chat messages.

A request's prompt messages are walked down from the root by (role, message equality, see
`same_message`); the first that matches no child starts a new branch, and the model's answer
hangs below as a generated assistant node carrying its `TurnRecord`. Message identity alone shapes
the tree; token ids only matter when a chain is turned into Samples (`builder.py`).
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Iterator
from typing import Any

from slime.agent.gateway.records import TurnRecord

logger = logging.getLogger(__name__)


class MessageNode:
    """One chat message. `turn` is set on an assistant message the model generated here; every
    other node (system, user, tool, an assistant the client supplied) only routes."""

    def __init__(
        self,
        *,
        role: str | None = None,
        message: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        parent: MessageNode | None = None,
    ) -> None:
        self.role = role
        self.message = message
        self.metadata = dict(metadata or {})
        self.parent = parent
        self.echo: dict[str, Any] | None = None  # the client's object last found equal to `message` (`child_for`)
        self.children: list[MessageNode] = []
        self.turn: TurnRecord | None = None
        self.turn_index: int | None = None
        # a generated turn shared by sibling branches is trained by the first branch only
        self.response_trained = False

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def is_generated(self) -> bool:
        return self.role == "assistant" and self.turn is not None

    def add_child(self, child: MessageNode) -> MessageNode:
        child.parent = self
        self.children.append(child)
        return child

    def path_from_root(self) -> list[MessageNode]:
        chain: list[MessageNode] = []
        node: MessageNode | None = self
        while node is not None and not node.is_root:
            chain.append(node)
            node = node.parent
        return chain[::-1]

    def leaves(self) -> Iterator[MessageNode]:
        if not self.children:
            yield self
        for child in self.children:
            yield from child.leaves()


REASONING = "reasoning_content"


def same_message(ours: dict[str, Any] | None, theirs: dict[str, Any]) -> bool:
    """`theirs` (a client's message) is `ours`: equal, or our answer echoed without its reasoning --
    most clients never send `reasoning_content` back, and that echo is still the answer we sampled."""
    if ours == theirs:
        return True
    if ours is None or REASONING not in ours or REASONING in theirs or len(ours) != len(theirs) + 1:
        return False
    return all(k == REASONING or (k in theirs and theirs[k] == v) for k, v in ours.items())


def child_for(children: list, msg: dict[str, Any]) -> Any:
    """The child (any node with `message` and `echo`) holding `msg`, or None. First by identity: the very
    object (a known history's, see `protocols.body_prefix`) or the client's object that matched it before --
    our own answer comes back as the client's copy of it, the same object in every later body, and would
    otherwise be compared again on each turn of the session. Then by `same_message`, remembered in `echo`."""
    for c in children:
        if c.message is msg or c.echo is msg:
            return c
    role = msg.get("role")
    for c in children:
        if c.message is not None and c.message.get("role") == role and same_message(c.message, msg):
            c.echo = msg
            return c
    return None


class LastWalk:
    """A tree's last walk: the client's message objects and the nodes they led to, one each. The
    conversation's next request sends those very objects first (`protocols.body_prefix` keeps a known
    history's), so the next walk starts where this one ended after one identity check per message, in
    C, instead of a Python step per message: at turn 64 of a tool agent, three walks of ~130 messages
    per turn. Nodes only ever gain children; the one change to a node's message
    (`merge_assistant_rewrite`) happens below a walk's end, and the walk that follows keeps the node."""

    __slots__ = ("messages", "nodes")

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.nodes: list[Any] = []

    def resumed(self, messages: list[dict[str, Any]]) -> list[Any]:
        """The nodes of the remembered walk when `messages` starts with its very objects, else []."""
        n = len(self.nodes)
        if n and len(messages) >= n and all(map(operator.is_, self.messages, messages)):
            return self.nodes[:]
        return []

    def keep(self, messages: list[dict[str, Any]], nodes: list[Any]) -> None:
        """Remember `nodes[i]` as the node of `messages[i]` (copies: the caller may extend its lists)."""
        self.messages, self.nodes = messages[: len(nodes)], nodes[:]


def walk(root: Any, messages: list[dict[str, Any]], last: LastWalk | None = None) -> list[Any]:
    """The nodes below `root` spelling the longest prefix of `messages` (`child_for` at each step),
    starting from `last`'s walk when `messages` continues it; `last` then remembers this one (a caller
    that hangs more nodes below calls `last.keep` again)."""
    path = last.resumed(messages) if last is not None else []
    node = path[-1] if path else root
    for m in itertools.islice(messages, len(path), None):
        node = child_for(node.children, m)
        if node is None:
            break
        path.append(node)
    if last is not None:
        last.keep(messages, path)
    return path


def merge_assistant_rewrite(
    node: MessageNode, messages: list[dict[str, Any]], depth: int, fork_threshold: int
) -> tuple[MessageNode, int]:
    """A client that replays our last answer slightly re-rendered (whitespace, reordered keys)
    would fork and leave the original answer as a dead-end branch trained on its own. When the
    mount point has exactly one generated assistant child, a leaf shorter than `fork_threshold`,
    take the replayed message in its place and stop training it (a long answer keeps its branch)."""
    if fork_threshold <= 0 or depth >= len(messages) or messages[depth].get("role") != "assistant":
        return node, depth
    answers = [c for c in node.children if c.role == "assistant"]
    if len(answers) != 1:
        if answers:
            logger.warning(
                "%d assistant answers at the mount point: the rewrite's target is ambiguous, so it forks", len(answers)
            )
        return node, depth
    old = answers[0]
    if old.children or old.turn is None or len(old.turn.output_ids) >= fork_threshold:
        return node, depth
    old.metadata["merged_rewrite"] = {
        "abandoned_turn_index": old.turn_index,
        "abandoned_response_tokens": len(old.turn.output_ids),
    }
    old.turn, old.turn_index, old.message, old.echo = None, None, messages[depth], None
    return old, depth + 1
