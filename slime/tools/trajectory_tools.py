"""The tools of one sample: chosen, created once, called per turn, rewarded and released.

Every malformed, unknown, invalid, excess, failing or cut-off call is answered to the model with a
tool message saying what was wrong and recorded on the sample's `TrajectoryRecord`; nothing is
dropped silently. Calls of one turn run concurrently. Whoever creates the instances releases them
on every path (`release` also covers a create that failed half-way).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from slime.tools.chat_format import ChatDelta, ParseError, ToolCall
from slime.tools.flags import MAX_PARALLEL_CALLS, MAX_TOOL_RESPONSE_TOKENS, TOOL_RESPONSE_TRUNCATE_SIDE, ToolConfig
from slime.tools.registry import ToolSet
from slime.utils.trajectory import ParseErrorRecord, StepReward, ToolErrorRecord, ToolMessage, TrajectoryRecord


@dataclass(frozen=True)
class ToolCallLimits:
    """How many calls of a turn run, how long one may take, how much of its answer the model sees."""

    max_parallel_calls: int = MAX_PARALLEL_CALLS
    call_timeout: float | None = None  # seconds; None: no limit
    max_response_tokens: int = MAX_TOOL_RESPONSE_TOKENS  # 0: no limit
    truncate_side: str = (
        TOOL_RESPONSE_TRUNCATE_SIDE  # verl's meaning: left keeps the beginning, right the end, middle both
    )

    @classmethod
    def from_args(cls, args: Any) -> "ToolCallLimits":
        config = ToolConfig.from_args(args)
        return cls(
            max_parallel_calls=config.max_parallel_calls,
            call_timeout=config.tool_call_timeout,
            max_response_tokens=config.max_tool_response_tokens,
            truncate_side=config.tool_response_truncate_side,
        )


class TrajectoryTools:
    """One sample's tool instances and calls, recorded on its `TrajectoryRecord`."""

    def __init__(
        self,
        tools: ToolSet,
        record: TrajectoryRecord,
        delta: ChatDelta,
        limits: ToolCallLimits,
        *,
        reads_images: bool = False,
    ):
        """`reads_images`: the model is a vision-language model, so the images a tool returns (verl's
        `ToolResponse.image`) go into its tool message as image parts; else they are named as not shown."""
        self.tools, self.record, self.delta, self.limits = tools, record, delta, limits
        self.reads_images = reads_images
        self.schemas: list[dict[str, Any]] = []
        self.kwargs: dict[str, dict[str, Any]] = {}
        self.instances: dict[str, str] = {}
        self.attempted: dict[str, str] = {}  # name -> instance id, for every create tried

    def select(self, tools: Any, tools_kwargs: Any) -> list[str]:
        """The sample's tools (slime's schema list and/or verl's tools_kwargs), their per-sample
        kwargs and the schemas its prompt shows; every configured tool when it names none."""
        chosen = self.tools.select(tools, tools_kwargs)
        self.kwargs, self.schemas = chosen.kwargs, chosen.schemas
        return chosen.names

    def kw(self, name: str, section: str) -> dict[str, Any]:
        """`tools_kwargs[name][section]` as a dict ({} when absent or null)."""
        value = self.kwargs.get(name, {}).get(section)
        return value if isinstance(value, dict) else {}

    async def create(self, names: list[str], sample_index: Any) -> None:
        iid = f"{sample_index}-{uuid4().hex[:12]}"

        async def one(name: str) -> None:
            self.attempted[name] = iid
            got, resp = await self.tools[name].create(iid, **self.kw(name, "create_kwargs"))
            self.instances[name] = self.attempted[name] = got or iid
            if resp is not None and (resp.text or resp.image or resp.video):
                self.record.tool_create_responses[name] = resp.text

        # Wait for every create (even when one fails) so release never races a create still running.
        errors = [
            r
            for r in await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
            if isinstance(r, BaseException)
        ]
        if errors:
            raise errors[0]

    async def release(self) -> None:
        async def one(name: str) -> None:
            iid = self.attempted[name]
            try:
                await self.tools[name].release(iid, **self.kw(name, "release_kwargs"))
            except Exception as e:  # noqa: BLE001 - a failing release must not hide the others
                self.record.tool_errors.append(
                    ToolErrorRecord(turn=None, tool=name, kind="release", message=f"{type(e).__name__}: {e}")
                )

        await asyncio.gather(*(one(n) for n in self.attempted))

    async def final_rewards(self) -> None:
        async def one(name: str) -> None:
            try:
                r = await self.tools[name].calc_reward(self.instances[name], **self.kw(name, "calc_reward_kwargs"))
                self.record.tool_rewards[name] = float(r or 0.0)
            except Exception as e:  # noqa: BLE001
                self.record.tool_errors.append(
                    ToolErrorRecord(turn=None, tool=name, kind="calc_reward", message=f"{type(e).__name__}: {e}")
                )

        await asyncio.gather(*(one(n) for n in self.instances))

    def record_unanswered(self, items: list[ToolCall | ParseError], turn: int, why: str) -> None:
        """Record the calls of a turn that ends the trajectory: none of them is executed."""
        rec = self.record
        for item in items:
            if isinstance(item, ParseError):
                rec.parse_errors.append(ParseErrorRecord(turn=turn, kind=item.kind, message=item.message, raw=item.raw))
                rec.tool_messages.append(ToolMessage(turn=turn, error=item.message))
            else:
                message = f"not executed: {why}"
                rec.tool_errors.append(ToolErrorRecord(turn=turn, tool=item.name, kind="not_executed", message=message))
                rec.tool_messages.append(
                    ToolMessage(turn=turn, name=item.name, arguments=item.arguments, error=message)
                )

    async def run_calls(self, items: list[ToolCall | ParseError], turn: int) -> list[dict[str, Any]]:
        """One tool message per call or parse error, in the model's order; valid calls run concurrently."""
        texts: list[str | None] = [None] * len(items)
        images: list[list[Any]] = [[] for _ in items]
        errors: list[str | None] = [None] * len(items)
        names: list[str] = ["error"] * len(items)
        jobs: list[tuple[int, ToolCall, dict[str, Any]]] = []
        n_calls = 0
        for i, item in enumerate(items):
            if isinstance(item, ParseError):
                self.record.parse_errors.append(
                    ParseErrorRecord(turn=turn, kind=item.kind, message=item.message, raw=item.raw)
                )
                texts[i], errors[i] = f"Error: {item.message}. Your output was: {item.raw}", item.message
                continue
            n_calls += 1
            names[i] = item.name
            kind, message, arguments = self._refusal(item, n_calls)
            if kind:
                self.record.tool_errors.append(ToolErrorRecord(turn=turn, tool=item.name, kind=kind, message=message))
                texts[i], errors[i] = f"Error: {message}", message
            else:
                jobs.append((i, item, arguments))
        results = await asyncio.gather(*(self._execute(call, arguments, turn) for _, call, arguments in jobs))
        for (i, _, _), (text, error, returned) in zip(jobs, results):
            texts[i], errors[i], images[i] = text, error, returned
        executed = {i for i, _, _ in jobs}
        return [
            self._message(item, chat_name, text, errors[i], turn, i in executed, images[i])
            for i, (item, chat_name, text) in enumerate(zip(items, names, texts))
        ]

    def _refusal(self, call: ToolCall, n_calls: int) -> tuple[str | None, str | None, dict[str, Any]]:
        """(kind, message, {}) of a call that is not executed, or (None, None, its checked arguments)."""
        limit = self.limits.max_parallel_calls
        if n_calls > limit:
            return (
                "too_many_calls",
                (f"at most {limit} tool calls are executed per turn; call #{n_calls} ({call.name}) was not executed"),
                {},
            )
        if call.name not in self.instances:
            return "unknown_tool", f"unknown tool {call.name!r}; available tools: {sorted(self.instances)}", {}
        arguments, err = self.tools.check_arguments(call.name, call.arguments)
        if err:
            return "invalid_arguments", f"invalid arguments for {call.name!r}: {err}", {}
        return None, None, arguments

    def _message(
        self,
        item: ToolCall | ParseError,
        chat_name: str,
        text: str | None,
        error: str | None,
        turn: int,
        executed: bool,
        images: list[Any] = (),
    ) -> dict[str, Any]:
        """The tool message answered to the model (its text cut to the limit), recorded as such; the
        tool's images (for a vision-language model) come first as image parts, then the text."""
        content = self._truncate(text or "")
        name, arguments = (item.name, item.arguments) if isinstance(item, ToolCall) else (None, None)
        self.record.tool_messages.append(
            ToolMessage(
                turn=turn,
                name=name,
                arguments=arguments,
                response=content,
                error=error,
                executed=executed,
                truncated=content != (text or ""),
            )
        )
        if images:
            parts = [{"type": "image", "image": image} for image in images]
            return {"role": "tool", "name": chat_name, "content": parts + [{"type": "text", "text": content}]}
        return {"role": "tool", "name": chat_name, "content": content}

    async def _execute(self, call: ToolCall, arguments: dict[str, Any], turn: int) -> tuple[str, str | None, list[Any]]:
        """(the text answered to the model, the error or None, the images shown to it)."""
        tool = self.tools[call.name]
        timeout = self.limits.call_timeout
        try:
            coro = tool.execute(self.instances[call.name], arguments, **self.kw(call.name, "execute_kwargs"))
            resp, step_reward, _metrics = await (asyncio.wait_for(coro, timeout) if timeout else coro)
        except asyncio.TimeoutError:
            msg = f"tool {call.name!r} did not answer within {timeout}s"
            self.record.tool_errors.append(ToolErrorRecord(turn=turn, tool=call.name, kind="timeout", message=msg))
            return f"Error: {msg}", msg, []
        except Exception as e:  # noqa: BLE001 - a tool bug becomes a message, not a crashed rollout
            msg = f"tool {call.name!r} failed: {type(e).__name__}: {e}"
            self.record.tool_errors.append(ToolErrorRecord(turn=turn, tool=call.name, kind="exception", message=msg))
            return f"Error: {msg}", msg, []
        self.record.step_rewards.append(StepReward(turn=turn, tool=call.name, reward=float(step_reward or 0.0)))
        text = resp.text or ""
        images = list(resp.image or []) if self.reads_images else []
        unseen = len(resp.image or []) - len(images) + len(resp.video or [])
        if unseen:
            what = "video item(s)" if self.reads_images else "image/video item(s)"
            model = "this model" if self.reads_images else "this text model"
            text += f"\n({unseen} {what} returned by the tool are not shown to {model})"
        return text, None, images

    def _truncate(self, text: str) -> str:
        limit = self.limits.max_response_tokens
        if limit <= 0:
            return text
        ids = self.delta.encode(text)
        if len(ids) <= limit:
            return text
        dec = self.delta.tok.decode
        side = self.limits.truncate_side
        if side == "left":
            return dec(ids[:limit]) + "...(truncated)"
        if side == "right":
            return "(truncated)..." + dec(ids[-limit:])
        half = limit // 2
        return dec(ids[:half]) + "\n...(truncated)...\n" + dec(ids[len(ids) - (limit - half) :])
