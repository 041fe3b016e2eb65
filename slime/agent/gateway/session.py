"""`Session`: everything the gateway keeps for one session id; `SessionTable`: open, get, close.

A session is reached only with its key, the credential its agent was given when it was opened:
`by_key` finds the session a request's key opens, and refuses any other (`SessionKeyError`, 401);
nothing opens a session implicitly, so a request can only add turns to a session opened for it.

A session holds its sampling defaults, context budget, turn count, the turns in flight and the
answers it sent, keyed by conversation (`Conversations`: a prompt that continues one costs one
template delta, not a re-render), and its last request bodies with what their protocol made of
them (`BodyPrefixes`: a body that repeats one's history is checked and translated past it only). Closing refuses new turns and waits for the ones in flight, on whichever event loop
serves them (the compatibility adapters serve from their own thread).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from slime.agent.gateway.conversations import Conversations
from slime.agent.gateway.errors import SessionClosedError, SessionKeyError, TurnCapError, UnknownSessionError
from slime.agent.gateway.protocols.body_prefix import BodyPrefixes


@dataclasses.dataclass
class Session:
    sid: str
    sampling_defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_context_tokens: int = 0  # 0: no budget beyond the engine's own
    max_turns: int | None = None
    turns: int = 0
    closed: bool = False
    conversations: Conversations = dataclasses.field(default_factory=Conversations)
    bodies: BodyPrefixes = dataclasses.field(default_factory=BodyPrefixes)  # its last bodies, parsed and checked
    images: dict[str, Any] = dataclasses.field(default_factory=dict)  # image source -> PreparedImage, read once
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
        self._keys: dict[str, str] = {}  # key -> sid, of the open sessions
        self._key_of: dict[str, str] = {}  # sid -> key, of the open sessions
        self._closed: set[str] = set()  # a straggler of a closed session must not open a new one
        self._closed_keys: set[str] = set()  # (so its straggler hears "closed", not "wrong key")

    def open(
        self,
        sid: str,
        *,
        key: str | None = None,
        sampling_defaults: dict[str, Any] | None = None,
        max_context_tokens: int | None = None,
        max_turns: int | None = None,
    ) -> Session:
        """`key`: the credential the session's requests present (None: the sid itself, as slime's
        adapters name a session by its API key; the gateway passes a minted secret)."""
        if not isinstance(sid, str) or not sid:
            raise ValueError(f"a session id must be a non-empty string, got {sid!r}")
        key = sid if key is None else key
        if sid in self._sessions:
            raise ValueError(f"session {sid!r} already exists; session ids must be unique per agent run")
        if not key or key in self._keys:
            raise ValueError(f"session {sid!r}: its key must be non-empty and held by no other open session")
        self._closed.discard(sid)  # opening again on purpose starts a new session of that id
        self._closed_keys.discard(key)
        budget = self.max_context_tokens if max_context_tokens is None else int(max_context_tokens or 0)
        s = self._sessions[sid] = Session(
            sid, dict(sampling_defaults or {}), budget, self.max_turns if max_turns is None else max_turns
        )
        self._keys[key], self._key_of[sid] = sid, key
        return s

    def get(self, sid: str) -> Session:
        """The open session `sid`: a closed one refuses its stragglers, one never opened is not found."""
        s = self._sessions.get(sid)
        if s is not None:
            return s
        if sid in self._closed:
            raise SessionClosedError(f"session {sid!r} is closed; its sample is already built")
        raise UnknownSessionError(f"session {sid!r} was never opened")

    def by_key(self, key: str | None) -> Session:
        """The open session whose key `key` is. The refusal names no session: a wrong key learns nothing."""
        sid = self._keys.get(key) if key else None
        if sid is not None:
            return self._sessions[sid]
        if key and key in self._closed_keys:
            raise SessionClosedError("the session of this key is closed; its sample is already built")
        raise SessionKeyError(
            "no open session holds this key: pass the key your session was opened with "
            "(in the base URL, X-Session-Id or as the API key)"
            if key
            else "no session key: pass the key your session was opened with "
            "(in the base URL, X-Session-Id or as the API key)"
        )

    def key_of(self, sid: str) -> str:
        """The key of the open session `sid` (for the host that hands it to the session's agent)."""
        key = self._key_of.get(sid)
        if key is None:
            self.get(sid)  # closed or never opened: that refusal
        return key

    def close(self, sid: str) -> Session | None:
        """Refuse the session's further turns; returns it (None if it never opened) for draining."""
        self._closed.add(sid)
        key = self._key_of.pop(sid, None)
        if key is not None:
            self._keys.pop(key, None)
            self._closed_keys.add(key)
        s = self._sessions.pop(sid, None)
        if s is not None:
            s.closed = True
        return s

    def __contains__(self, sid: str) -> bool:
        return sid in self._sessions

    def __len__(self) -> int:
        return len(self._sessions)
