"""`Session`: everything the gateway keeps for one session id; `SessionTable`: open, get, close.

A session holds its sampling defaults, context budget, turn count, the turns in flight and the
answers it sent, keyed by conversation (`Conversations`: a prompt that continues one costs one
template delta, not a re-render). Closing refuses new turns and waits for the ones in flight, on whichever event loop
serves them (the compatibility adapters serve from their own thread).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from slime.agent.conversations import Conversations
from slime.agent.errors import SessionClosedError, TurnCapError


@dataclasses.dataclass
class Session:
    sid: str
    sampling_defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_context_tokens: int = 0  # 0: no budget beyond the engine's own
    max_turns: int | None = None
    turns: int = 0
    closed: bool = False
    conversations: Conversations = dataclasses.field(default_factory=Conversations)
    # engine calls (tasks) and answers sent but not yet recorded (futures), all on `loop`
    in_flight: set[asyncio.Future] = dataclasses.field(default_factory=set)
    loop: asyncio.AbstractEventLoop | None = None

    def begin_turn(self) -> None:
        """Count a turn, or refuse it (closed session, turn budget spent)."""
        if self.closed:
            raise SessionClosedError(f"session {self.sid!r} is closed; its sample is already built")
        if self.max_turns is not None and self.turns >= self.max_turns:
            raise TurnCapError(f"session {self.sid!r} used its {self.max_turns} turns (--agent-max-turns)")
        self.turns += 1
        self.loop = asyncio.get_running_loop()

    async def drain(self, timeout: float) -> None:
        """Wait up to `timeout` s for the turns in flight, then cancel the rest (a cancelled answer
        is never recorded). Runs on the loop serving the session, from any thread."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return

        async def settle() -> None:
            pending = [f for f in self.in_flight if not f.done()]
            if not pending:
                return
            _, late = await asyncio.wait(pending, timeout=timeout)
            for f in late:
                f.cancel()
            await asyncio.gather(*late, return_exceptions=True)

        if loop is asyncio.get_running_loop():
            await settle()
        else:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(settle(), loop))


class SessionTable:
    def __init__(self, *, max_turns: int | None = None, max_context_tokens: int = 0) -> None:
        self.max_turns, self.max_context_tokens = max_turns, max_context_tokens
        self._sessions: dict[str, Session] = {}
        self._closed: set[str] = set()  # a straggler of a closed session must not open a new one

    def open(self, sid: str, *, sampling_defaults: dict[str, Any] | None = None,
             max_context_tokens: int | None = None, max_turns: int | None = None) -> Session:
        if sid in self._sessions:
            raise ValueError(f"session {sid!r} already exists; session ids must be unique per agent run")
        self._closed.discard(sid)  # opening again on purpose starts a new session of that id
        budget = self.max_context_tokens if max_context_tokens is None else int(max_context_tokens or 0)
        s = self._sessions[sid] = Session(sid, dict(sampling_defaults or {}), budget,
                                          self.max_turns if max_turns is None else max_turns)
        return s

    def get(self, sid: str) -> Session:
        """The session, opened with defaults if the agent speaks first (slime's adapters do the same)."""
        s = self._sessions.get(sid)
        if s is not None:
            return s
        if sid in self._closed:
            raise SessionClosedError(f"session {sid!r} is closed; its sample is already built")
        return self.open(sid)

    def close(self, sid: str) -> Session | None:
        """Refuse the session's further turns; returns it (None if it never spoke) for draining."""
        self._closed.add(sid)
        s = self._sessions.pop(sid, None)
        if s is not None:
            s.closed = True
        return s

    def __contains__(self, sid: str) -> bool:
        return sid in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)
