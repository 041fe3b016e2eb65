"""Every id the engine sampled is trained exactly once across a session's Samples (issue 29).

`TrajectoryManager` is tokenizer-free, so hypothesis drives it directly with sessions no client
library would produce on purpose but agents do: conversations interleaved in one session
(sub-agents, second clients), retries, rewritten or reasoning-less echoes of our answers, and
prompts that re-render history with other ids than the ones sampled (a non-canonical encoding,
compact tool-call JSON, a drifted template token) or cut it short (compaction). Sampled ids are
unique numbers here (>= SAMPLED), so a Sample's mask-1 positions name the spans they train.

With `absorb_sampled=False` (the gateway's) each sampled id has mask 1 exactly once and nothing
else has mask 1. slime's default may absorb a sampled answer as context, but then a Sample says so
(`metadata["untrained_turns"]`) and nothing is trained twice.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slime.agent.gateway.conversations import Conversations
from slime.agent.gateway.records import TurnRecord
from slime.agent.gateway.trajectory import TrajectoryManager
from slime.agent.gateway.tree import LastWalk
from slime.utils.types import Sample

SAMPLED = 100_000  # ids at or above this were sampled by the engine; below, template/context text
PROPERTY = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@dataclasses.dataclass
class Conversation:
    """What one client holds: its messages and the ids its next prompt extends when sent faithfully."""

    messages: list[dict]
    ids: list[int]
    prompt: list[int] = dataclasses.field(default_factory=list)  # the ids of its last request


class SessionScript:
    """Turns a hypothesis draw into record_turn calls, keeping what was sampled."""

    def __init__(self, manager: TrajectoryManager, data: st.DataObject) -> None:
        self.manager, self.data = manager, data
        self.context_ids = itertools.count(1)
        self.sampled_ids = itertools.count(SAMPLED)
        self.sampled: dict[int, tuple[int, float]] = {}  # sampled id -> (turn, its log-prob)
        self.conversations: list[Conversation] = []
        self.turns = 0

    def context(self, n: int) -> list[int]:
        return [next(self.context_ids) for _ in range(n)]

    def draw(self, strategy):
        return self.data.draw(strategy)

    def new_conversation(self) -> Conversation:
        k = len(self.conversations)
        c = Conversation(
            [
                {"role": "system", "content": f"sys{self.draw(st.integers(0, 1))}"},
                {"role": "user", "content": f"task{k}"},
            ],
            self.context(3),
        )
        self.conversations.append(c)
        return c

    def prompt_ids(self, c: Conversation, tail: list[int]) -> list[int]:
        """The ids a gateway might send: faithful, or history re-rendered some other way."""
        ids = c.ids + tail
        how = self.draw(st.sampled_from(["faithful", "faithful", "recode", "drift", "cut"]))
        if how == "recode" and any(i >= SAMPLED for i in ids):  # sampled ids re-tokenised otherwise
            at = self.draw(st.sampled_from([j for j, i in enumerate(ids) if i >= SAMPLED]))
            ids = ids[:at] + self.context(self.draw(st.integers(1, 3))) + ids[at + 1 :]
        elif how == "drift":
            at = self.draw(st.integers(0, len(ids)))
            ids = ids[:at] + self.context(1) + ids[at:]
        elif how == "cut" and len(ids) > 2:
            at = self.draw(st.integers(1, len(ids) - 1))
            ids = ids[:at] + self.context(2)
        return ids

    def answer(self, c: Conversation, prompt_ids: list[int]) -> None:
        n = self.draw(st.integers(0, 4))
        out = [next(self.sampled_ids) for _ in range(n)]
        self.turns += 1
        log_probs = [-(self.turns + j / 100) for j in range(n)]
        self.sampled.update({i: (self.turns, lp) for i, lp in zip(out, log_probs)})
        message = {"role": "assistant", "content": f"a{self.turns}"}
        if self.draw(st.booleans()):
            message["reasoning_content"] = f"think{self.turns}"
        finish = self.draw(st.sampled_from(["stop", "tool_calls", "length"]))
        self.manager.record_turn(
            "s",
            turn=TurnRecord(prompt_ids, out, finish, log_probs),
            prompt_messages=list(c.messages),
            response_message=dict(message),
        )
        echo = dict(message)
        how = self.draw(st.sampled_from(["exact", "exact", "no_reasoning", "rewritten"]))
        if how == "no_reasoning":
            echo.pop("reasoning_content", None)
        elif how == "rewritten":
            echo["content"] += " "
        c.messages.append(echo)
        c.ids, c.prompt = prompt_ids + out, prompt_ids

    def step(self) -> None:
        op = self.draw(st.sampled_from(["new", "continue", "continue", "continue", "retry", "compact", "edit"]))
        if op == "new" or not self.conversations:
            c = self.new_conversation()
            self.answer(c, self.prompt_ids(c, []))
            return
        c = self.draw(st.sampled_from(self.conversations))
        if op == "retry":  # the same request again: a sibling answer, and the client may go on from either
            twin = Conversation(c.messages[:-1], [])
            self.conversations.append(twin)
            self.answer(twin, c.prompt)
            return
        if op == "compact" and len(c.messages) > 3:
            keep = self.draw(st.integers(2, len(c.messages) - 1))
            c.messages = c.messages[:2] + c.messages[keep:]
            c.ids = c.ids[:3] + self.context(2)
        if op == "edit" and len(c.messages) > 3:  # an earlier message replaced in place (an old tool output cleared)
            at = self.draw(st.integers(2, len(c.messages) - 2))
            c.messages = [*c.messages[:at], {**c.messages[at], "content": "(cleared)"}, *c.messages[at + 1 :]]
            c.ids = c.ids[:3] + self.context(2)
        role = self.draw(st.sampled_from(["tool", "user"]))
        c.messages.append({"role": role, "content": f"{role}{self.turns}"})
        tail = self.context(2)
        self.answer(c, self.prompt_ids(c, tail))


def run_session(manager: TrajectoryManager, data: st.DataObject) -> tuple[SessionScript, list[Sample]]:
    script = SessionScript(manager, data)
    for _ in range(data.draw(st.integers(1, 12))):
        script.step()
    samples = manager.get_trajectory("s", base_sample=Sample(index=0, prompt=""))
    return script, samples


def trained(samples: list[Sample]) -> Counter:
    """Each mask-1 position's (token, log-prob), counted over every Sample."""
    seen: Counter = Counter()
    for s in samples:
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
        response = s.tokens[len(s.tokens) - s.response_length :]
        for tok, m, lp in zip(response, s.loss_mask, s.rollout_log_probs):
            if m:
                seen[(tok, lp)] += 1
    return seen


@PROPERTY
@given(data=st.data(), threshold=st.sampled_from([0, 1, 3, 1024]))
def test_every_sampled_id_is_trained_exactly_once_and_nothing_else(data, threshold):
    script, samples = run_session(TrajectoryManager(fork_threshold_tokens=threshold, absorb_sampled=False), data)
    seen = trained(samples)
    expected = Counter({(i, lp): 1 for i, (_, lp) in script.sampled.items()})
    assert seen == expected
    assert all("untrained_turns" not in s.metadata for s in samples)


@PROPERTY
@given(data=st.data(), threshold=st.sampled_from([0, 1, 3, 1024]))
def test_slimes_absorbing_default_trains_nothing_twice_and_names_what_it_left_untrained(data, threshold):
    script, samples = run_session(TrajectoryManager(fork_threshold_tokens=threshold), data)
    seen = trained(samples)
    assert all(count == 1 and tok >= SAMPLED and script.sampled[tok][1] == lp for (tok, lp), count in seen.items())
    untrained_turns = {script.sampled[i][0] for i in script.sampled if (i, script.sampled[i][1]) not in seen}
    named = [{u["turn_index"] for u in s.metadata.get("untrained_turns", [])} for s in samples]
    assert all(untrained_turns <= n for n in named)  # each Sample of the session says so


class Forgetful(LastWalk):
    """A walk that never resumes: every walk from the root, as before `LastWalk`."""

    def resumed(self, messages):
        return []


class Forgetting(dict):
    def setdefault(self, key, default=None):
        return super().setdefault(key, Forgetful())


class Twins:
    """Sends the script's turns to a manager and a session's conversations that resume their walks, and to
    twins that walk from the root each time; the twins' answers are the reference."""

    def __init__(self, threshold: int) -> None:
        self.managers = [TrajectoryManager(fork_threshold_tokens=threshold) for _ in range(2)]
        self.managers[1]._walks = Forgetting()
        self.conversations = [Conversations(), Conversations()]
        self.conversations[1].last = Forgetful()

    def record_turn(self, sid, *, turn, prompt_messages, response_message):
        found = [c.continued(prompt_messages, None) for c in self.conversations]
        ours, reference = (None if f is None else (f[0].prompt, f[0].output_ids, f[1]) for f in found)
        assert ours == reference
        for c in self.conversations:
            c.add(prompt_messages, response_message, None, turn.prompt_ids, turn.output_ids)
        for m in self.managers:
            m.record_turn(sid, turn=turn, prompt_messages=prompt_messages, response_message=response_message)

    def get_trajectory(self, sid, **kw):
        rows = [m.get_trajectory(sid, **kw) for m in self.managers]
        seen = [[(s.tokens, s.loss_mask, s.rollout_log_probs, s.metadata) for s in r] for r in rows]
        assert seen[0] == seen[1]
        return rows[0]


@PROPERTY
@given(data=st.data(), threshold=st.sampled_from([0, 3, 1024]))
def test_a_walk_resumed_from_the_last_one_finds_what_a_walk_from_the_root_finds(data, threshold):
    """`tree.LastWalk`: a conversation's next request starts where its last walk ended. Over interleaved
    conversations, retries, compaction and rewritten echoes, the trees' answers are those of walks from the root:
    the same prompt prefix found for each request, the same Samples at the end."""
    run_session(Twins(threshold), data)


def test_the_walk_resumes_when_the_next_request_sends_the_last_ones_objects():
    """The check above can fail: a conversation of 12 turns sending back its own objects resumes every walk
    after the first, and a copy of its history (fresh objects, as from a JSON parse) does not."""
    conversations = Conversations()
    history = [{"role": "user", "content": "go"}]
    for k in range(12):
        assert bool(conversations.last.resumed(history)) == (k > 0)
        found = conversations.continued(history, None)
        assert (found is None) if k == 0 else found[1] == len(history) - 1
        answer = {"role": "assistant", "content": f"answer {k}"}
        conversations.add(history, answer, None, [1, 2], [3])
        history = [*history, dict(answer), {"role": "tool", "content": f"result {k}"}]
    copy = json.loads(json.dumps(history))
    assert not conversations.last.resumed(copy) and conversations.continued(copy, None)[1] == len(history) - 1
