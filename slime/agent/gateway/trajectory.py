"""`TrajectoryManager`: per-session turn trees -> `list[Sample]` (slime's public name and API).

`record_turn` routes each turn (its prompt messages and the engine's `TurnRecord`) into the
session's `TurnTree`; `get_trajectory` turns every root-to-leaf chain into Samples with
`SampleBuilder` (a chain whose prompts stop extending the tokens forks into more rows) and drops
the session. Tokenizer-free and HTTP-free: it sees only messages and token ids.

Every sampled answer is trained exactly once across the session's Samples: a turn shared by
branches in the first, and with `absorb_sampled=False` (the gateway's) nothing else can drop it --
a rewritten replay of an answer branches instead of merging over it, a prompt that re-renders a
trained answer differently forks the row. slime's default (`absorb_sampled=True`, its adapters)
absorbs short rewrites and realignments as context; each of the session's Samples then names
the turns it left untrained and why in `metadata["untrained_turns"]`.
"""

from __future__ import annotations

import logging
from typing import Any

from slime.agent.gateway.builder import DriftKind, SampleBuilder, common_prefix_len
from slime.agent.gateway.records import TurnRecord, check_turn
from slime.agent.gateway.tree import LastWalk, MessageNode, merge_assistant_rewrite, walk
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

DEFAULT_FORK_THRESHOLD = 1024  # response tokens: a rewritten or drifted answer this long keeps its own row

_common_prefix_len = common_prefix_len  # slime's name, imported by its tests


class TrajectoryManager:
    def __init__(self, *, fork_threshold_tokens: int | None = None, absorb_sampled: bool = True) -> None:
        self.fork_threshold = DEFAULT_FORK_THRESHOLD if fork_threshold_tokens is None else fork_threshold_tokens
        self.absorb_sampled = absorb_sampled
        self._trees: dict[str, MessageNode] = {}
        self._turn_count: dict[str, int] = {}
        self._walks: dict[str, LastWalk] = {}  # each tree's last walk (`tree.LastWalk`)

    def has_session(self, sid: str) -> bool:
        return sid in self._trees

    def turn_count(self, sid: str) -> int:
        return self._turn_count.get(sid, 0)

    def record_turn(
        self,
        sid: str,
        *,
        turn: TurnRecord,
        prompt_messages: list[dict[str, Any]],
        response_message: dict[str, Any] | None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """Route `turn` into session `sid`'s tree below the path its prompt messages spell."""
        check_turn(turn)
        if not prompt_messages:  # nothing to route it by (slime skips it too)
            logger.warning("record_turn(sid=%s): no prompt messages; turn not recorded", sid)
            return
        root = self._trees.setdefault(sid, MessageNode())
        last = self._walks.setdefault(sid, LastWalk())
        path = walk(root, prompt_messages, last)
        node, depth = (path[-1] if path else root), len(path)
        if self.absorb_sampled:
            node, merged = merge_assistant_rewrite(node, prompt_messages, depth, self.fork_threshold)
            if merged > depth:  # the answer it replaced now holds prompt_messages[depth]
                path.append(node)
                depth = merged
        for m in prompt_messages[depth:]:
            path.append(node := node.add_child(MessageNode(role=m.get("role"), message=m)))
        last.keep(prompt_messages, path)
        answer = MessageNode(role="assistant", message=response_message, metadata=metadata)
        answer.turn = turn
        answer.turn_index = self._turn_count[sid] = self.turn_count(sid) + 1
        node.add_child(answer)

    def get_trajectory(
        self,
        sid: str,
        *,
        base_sample: Sample,
        reward: float = 0.0,
        extra_metadata: dict[str, Any] | None = None,
        max_sample_tokens: int = 0,
    ) -> list[Sample]:
        """Every chain of the session as Samples, each carrying the full `reward`; drops the session
        (a second call returns [])."""
        root = self._trees.pop(sid, None)
        self._turn_count.pop(sid, None)
        self._walks.pop(sid, None)
        if root is None:
            return []
        untrained: set[tuple[int, str]] = set()
        samples = [
            s
            for leaf in root.leaves()
            if not leaf.is_root
            for s in self._chain_to_samples(
                leaf.path_from_root(), base_sample, extra_metadata or {}, max_sample_tokens, untrained
            )
        ]
        notes = [{"turn_index": i, "reason": why} for i, why in sorted(untrained)]
        if notes:
            logger.warning(
                "session %s: %d sampled turn(s) absorbed as context, trained nowhere: %s", sid, len(notes), notes
            )
        for s in samples:
            s.reward = reward
            if notes:  # the session's, on each of its Samples: the row that lost a turn may have none left
                s.metadata["untrained_turns"] = notes
        return samples

    def drop_session(self, sid: str) -> None:
        self._trees.pop(sid, None)
        self._turn_count.pop(sid, None)
        self._walks.pop(sid, None)

    def _chain_to_samples(
        self,
        chain: list[MessageNode],
        base: Sample,
        extra: dict[str, Any],
        max_tokens: int,
        untrained: set[tuple[int, str]],
    ) -> list[Sample]:
        """The chain's rows; adds to `untrained` the sampled turns it absorbed as context."""
        answers = [n for n in chain if n.is_generated]
        if not answers:
            return []
        finish = answers[-1].turn.finish_reason
        metadata = {
            **extra,
            "truncated": finish == "length",
            "use_tool": any((n.message or {}).get("tool_calls") for n in answers),
            "ill_formed": any(n.turn.ill_formed for n in answers),
        }
        untrained.update(
            (n.metadata["merged_rewrite"]["abandoned_turn_index"], "merged_rewrite")
            for n in chain
            if "merged_rewrite" in n.metadata
        )
        builders = self._builders(answers)
        untrained.update((i, "realigned") for b in builders for i in b.dropped_turns)
        return [
            b.to_sample(base, metadata, finish_reason=finish, max_tokens=max_tokens)
            for b in builders
            if b.has_trained_response
        ]

    def _builders(self, answers: list[MessageNode]) -> list[SampleBuilder]:
        """Pack the chain's generated turns into rows; a turn that cannot extend the current row
        opens the next (a fork). A turn shared with an earlier chain is context here, not trained."""
        builders: list[SampleBuilder] = []
        for node in answers:
            trained, node.response_trained = not node.response_trained, True
            kind = builders[-1].classify(node.turn) if builders else DriftKind.FORK
            if kind is DriftKind.FORK:
                builders.append(SampleBuilder(self.fork_threshold, absorb_sampled=self.absorb_sampled))
                kind = DriftKind.CLEAN
            builders[-1].append(node.turn, kind, trained=trained, turn_index=node.turn_index)
        return builders
