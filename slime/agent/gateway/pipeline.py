"""`TurnPipeline`: the one per-turn path of the gateway and the compatibility adapters.

`run` takes a translated `ChatRequest`: session (open, turn budget) -> prompt ids (`PromptRenderer`)
-> context check -> engine (`Generate`) -> decode and parse the sampled ids -> `Turn`. The HTTP
layer sends the reply and then calls `commit`, which records the turn in the `TrajectoryManager`
and remembers the answer sent; a turn whose client went away before the answer is never
committed (nor counted against the turn budget), so no sample trains on an answer nobody acted
on, and neither does one the engines aborted half-way (a 503 the client retries). Pure of HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from jinja2 import TemplateError

from slime.agent.gateway.engine_call import client_stops, sampling_params
from slime.agent.gateway.errors import (
    BadRequestError,
    ContextFullError,
    EngineAbortedError,
    EngineFailedError,
    FieldError,
    TurnRefused,
    is_context_refusal,
)
from slime.agent.gateway.images import ConversationImages
from slime.agent.gateway.parsing import forced_call_prefix, parse_model_output
from slime.agent.gateway.protocols.common import tool_call_dict
from slime.agent.gateway.records import ChatRequest, Reply, TokenLogprob, ToolUse, TurnRecord, Usage, one_step_init
from slime.agent.gateway.rendering import PromptRenderer
from slime.agent.gateway.session import Session, SessionTable
from slime.agent.gateway.trajectory import TrajectoryManager
from slime.tools.chat_format import decode_text, plain_decoder
from slime.utils.encoded_ids import EncodedIds
from slime.utils.http_retry import HttpError
from slime.utils.types import Sample

Generate = Callable[[list[int], Session, ChatRequest], Awaitable[TurnRecord]]


@one_step_init
@dataclasses.dataclass(frozen=True)
class Turn:
    """An answered turn; `pending` stays open in the session until it is committed or abandoned."""

    request: ChatRequest
    record: TurnRecord
    reply: Reply
    session: Session
    pending: asyncio.Future


def recorded_message(text: str, reasoning: str, uses: list[ToolUse]) -> dict[str, Any]:
    """The answer as the tree records it: the form every protocol's client echo translates back to."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = reasoning
    if uses:
        message["tool_calls"] = [tool_call_dict(u.name, u.arguments) for u in uses]
    return message


class TurnPipeline:
    def __init__(
        self,
        *,
        tokenizer: Any,
        renderer: PromptRenderer,
        generate: Generate,
        manager: TrajectoryManager,
        sessions: SessionTable,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
        images: ConversationImages | None = None,
    ) -> None:
        """`images`: the model's image side (a vision-language model), None for a text-only model."""
        self.tokenizer, self.renderer, self.generate, self.images = tokenizer, renderer, generate, images
        self.manager, self.sessions = manager, sessions
        self.tool_parser, self.reasoning_parser = tool_parser, reasoning_parser
        self._special_ids = frozenset(getattr(tokenizer, "all_special_ids", None) or ())
        self._decoder = plain_decoder(tokenizer)

    async def run(self, request: ChatRequest) -> Turn:
        """The answered turn. The session waits for it (`pending`) from the start, so a session
        finished meanwhile either gets this turn or cancels it -- never records it afterwards."""
        session = self.sessions.get(request.session_id)
        session.begin_turn()
        task, pending = asyncio.current_task(), asyncio.get_running_loop().create_future()
        session.in_flight |= {task, pending}
        try:
            return Turn(request, *self._reply(await self._generate(session, request), request), session, pending)
        except BaseException:
            session.turns -= 1  # refused or failed: not a turn taken
            _release(session, pending)
            raise
        finally:
            session.in_flight.discard(task)

    async def _generate(self, session: Session, request: ChatRequest) -> TurnRecord:
        prompt_ids = self.prompt_ids(session, request)
        if session.max_context_tokens > 0:  # ContextFullError before any engine call (its one refusal)
            sampling_params(session, request, len(prompt_ids))
        try:
            record = await self.generate(prompt_ids, session, request)
        except HttpError as e:
            raise _engine_refusal(e, len(prompt_ids), request.session_id) from e
        if record.finish_reason == "abort":  # a partial answer is not a turn the model finished: never trained
            raise EngineAbortedError(
                f"session {request.session_id!r}: the engines aborted this turn after "
                f"{len(record.output_ids)} tokens (weight update); send it again"
            )
        return record

    def prompt_ids(self, session: Session, request: ChatRequest) -> list[int]:
        """The rendered prompt; a conversation the chat template refuses (its `raise_exception`:
        a role order it does not take) is the client's bad request, named as such."""
        try:
            ids = self.renderer.prompt_ids(session, request.messages, request.tools)
        except TemplateError as e:
            raise BadRequestError(f"messages: the model's chat template refuses this conversation: {e}") from None
        images = self.images_of(session, request)
        if images:  # each image's placeholder at its token count: the ids the engine runs and the Sample trains
            ids = self.images.expand(ids, images)
        forced = self.forced_call_ids(request)
        if not forced:  # (`ids + []` would be a plain list: its JSON text, kept by `EncodedIds`, lost)
            return ids
        return ids.extended(forced) if isinstance(ids, EncodedIds) else ids + forced

    def images_of(self, session: Session, request: ChatRequest) -> list[Any]:
        """The conversation's images (`PreparedImage`s, each processed once per session), in prompt order."""
        if self.images is None:
            return []
        return self.images.of(session.images, request.messages)

    def forced_call_ids(self, request: ChatRequest) -> list[int]:
        """The opening of a call the client requires (`parsing.forced_call_prefix`), as prompt ids."""
        prefix = forced_call_prefix(request.tool_choice)
        if prefix and not self.tool_parser:
            raise FieldError(
                "tool_choice",
                "a required tool call needs the gateway's tool parser "
                "(--tool-call-parser); this gateway runs without one",
            )
        return list(self.tokenizer.encode(prefix, add_special_tokens=False)) if prefix else []

    def _reply(self, record: TurnRecord, request: ChatRequest) -> tuple[TurnRecord, Reply]:
        text = forced_call_prefix(request.tool_choice) + self.decode(record.output_ids)
        stop = record.stop_matched if record.stop_matched in client_stops(request) else None
        if stop is not None and stop in text:  # the APIs cut the client's stop string off
            text = text[: text.find(stop)]
        parsed = parse_model_output(
            text,
            tools_schema=request.tools,
            tool_parser_name=self.tool_parser,
            reasoning_parser_name=self.reasoning_parser,
            cut_off=record.finish_reason == "length",
        )
        uses = [ToolUse(u["name"], u["input"]) for u in parsed.tool_uses]
        message = recorded_message(parsed.text, parsed.reasoning, uses)
        finish = "tool_calls" if uses else ("length" if record.finish_reason == "length" else "stop")
        reply = Reply(
            text=parsed.text,
            tool_uses=uses,
            finish_reason=finish,
            reasoning=parsed.reasoning,
            usage=Usage(len(record.prompt_ids), len(record.output_ids)),
            message=message,
            stop_sequence=stop if finish == "stop" else None,
            logprobs=self.token_logprobs(record, request.top_logprobs) if request.logprobs else None,
        )
        if parsed.ill_formed != record.ill_formed:  # (`replace` copies every field: only when it changes one)
            record = dataclasses.replace(record, ill_formed=parsed.ill_formed)
        return record, reply

    def decode(self, ids: list[int]) -> str:
        """The sampled text without the end-of-turn special tokens the engine kept at its end."""
        end = self._visible_end(ids)
        return decode_text(self.tokenizer, self._decoder, ids[:end]) if end else ""

    def _visible_end(self, ids: list[int]) -> int:
        end = len(ids)
        while end and ids[end - 1] in self._special_ids:
            end -= 1
        return end

    def token_logprobs(self, record: TurnRecord, top: int) -> list[TokenLogprob]:
        """The engine's log-prob of each sampled token the text is made of (the closing special tokens
        left out, as the APIs leave out the stop token), each token decoded alone, with the engine's
        `top` most likely tokens there."""
        end = self._visible_end(record.output_ids)
        if len(record.output_log_probs) < end or (top and len(record.top_log_probs) < end):
            raise EngineFailedError("the engine answered without the log-probs the client asked for")
        tops = record.top_log_probs if top else [()] * end
        return [
            TokenLogprob(self.token_text(t), lp, tuple((self.token_text(i), alt) for alt, i in row[:top]))
            for t, lp, row in zip(record.output_ids[:end], record.output_log_probs, tops)
        ]

    def token_text(self, token_id: int) -> str:
        return decode_text(self.tokenizer, self._decoder, [token_id])

    def commit(self, turn: Turn) -> bool:
        """The client has the answer: record the turn and remember the prefix its next prompt extends.
        False when the session was finished meanwhile and gave up waiting for this turn."""
        if turn.pending.done():
            return False
        req = turn.request
        self.manager.record_turn(
            req.session_id,
            turn=turn.record,
            prompt_messages=req.messages,
            response_message=turn.reply.message,
            metadata={"sid": req.session_id},
        )
        self.renderer.remember(
            turn.session, req.messages, req.tools, turn.record.prompt_ids, turn.reply.message, turn.record.output_ids
        )
        self.abandon(turn)
        return True

    @staticmethod
    def abandon(turn: Turn) -> None:
        """The answer is recorded now: release the session's wait."""
        _release(turn.session, turn.pending)

    @staticmethod
    def withdraw(turn: Turn) -> None:
        """The answer never reached the client: not recorded, not a turn taken (`--agent-max-turns`)."""
        if not turn.pending.done():
            turn.session.turns -= 1
        _release(turn.session, turn.pending)

    async def finish(
        self,
        sid: str,
        *,
        base_sample: Sample,
        reward: float = 0.0,
        extra_metadata: dict[str, Any] | None = None,
        wait_timeout: float = 5.0,
    ) -> list[Sample]:
        """Close the session, wait for its turns in flight, and build its Samples (response decoded)."""
        session = self.sessions.close(sid)
        if session is not None:
            await session.drain(wait_timeout)
        budget = session.max_context_tokens if session is not None else 0
        samples = self.manager.get_trajectory(
            sid, base_sample=base_sample, reward=reward, extra_metadata=extra_metadata, max_sample_tokens=budget
        )
        for s in samples:
            s.response = (
                self.tokenizer.decode(s.tokens[-s.response_length :], skip_special_tokens=False)
                if s.response_length
                else ""
            )
        return samples

    async def drop(self, sid: str, *, wait_timeout: float = 5.0) -> None:
        session = self.sessions.close(sid)
        if session is not None:
            await session.drain(wait_timeout)
        self.manager.drop_session(sid)


def _release(session: Session, pending: asyncio.Future) -> None:
    if not pending.done():
        pending.set_result(None)
    session.in_flight.discard(pending)


def _engine_refusal(e: HttpError, prompt_len: int, sid: str) -> TurnRefused:
    """An engine's 400 is the client's bad request (an over-long prompt in the API's own words);
    anything else is the engines failing."""
    if e.status == 400 and is_context_refusal(e.body):
        return ContextFullError(f"prompt is too long: {prompt_len} tokens; the engine says: {e.body[:300]}")
    if e.status == 400:
        return BadRequestError(f"the engine refused the request: {e.body[:300]}")
    return EngineFailedError(f"session {sid!r}: the engines did not answer: {e}")
