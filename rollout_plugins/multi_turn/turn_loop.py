"""The turns of one trajectory: an engine turn, its text parsed, then the tool step or the user step.

Each engine turn continues from every token so far (never re-rendered) and is read as a whole: a
turn cut by the budget has its calls recorded as not executed, a turn without calls completes the
trajectory (or, with an interaction, is answered by the user step). While the rollout aborts, the
loop stops at the next turn boundary; a turn aborted by the engine keeps what it sampled.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from rollout_plugins.multi_turn.tool_turn import tool_turn
from rollout_plugins.multi_turn.user_turn import user_turn
from slime.rollout.runtime import current
from slime.tools.chat_format import ParseResult
from slime.utils.types import Sample

if TYPE_CHECKING:
    from rollout_plugins.multi_turn.trajectory import Trajectory


async def run_turns(traj: Trajectory) -> None:
    """Turns from the start (or the resume point) until the trajectory ends; `traj.end` says why."""
    max_turns = int(traj.args.max_turns)
    client = (traj.ctx.runtime or current(traj.args)).client
    if traj.budgets.context and traj.prompt_len >= traj.budgets.context:
        return traj.end(Sample.Status.TRUNCATED, "prompt_fills_context")
    first, carried, inside = traj.resume_point()
    gate = traj.ctx.runtime.client.gate if traj.ctx.runtime is not None else None
    for turn in range(first, max_turns + 1):
        room, limit = traj.room()
        if room <= 0:
            return traj.end(Sample.Status.TRUNCATED, f"{limit}_exhausted")
        if gate is not None and gate.closed:  # the rollout is aborting: stop at this turn boundary
            traj.aborted_turn = inside
            return traj.end(Sample.Status.ABORTED, "rollout_abort")
        images = {"image_data": traj.image_data} if traj.images else {}  # every image of the conversation so far
        out = await client.generate(traj.ids, {**traj.params, "max_new_tokens": room}, **images)
        t0 = time.perf_counter()
        traj.add_engine_turn(out, turn)
        model_ids, carried, inside = carried + list(out.token_ids), [], False
        if out.finish_type == "abort":
            traj.aborted_turn = True
            return traj.end(Sample.Status.ABORTED, "engine_abort")
        cut = out.finish_type == "length"
        parsed = read_turn(traj, model_ids, cut)
        if cut and limit != "turn_cap":
            traj.tools.record_unanswered(parsed.items, turn, "the response budget ran out")
            return traj.end(Sample.Status.TRUNCATED, f"{limit}_exhausted")
        if not parsed.items:
            if cut:
                return traj.end(Sample.Status.TRUNCATED, "turn_cap")
            if traj.interaction is None:
                return traj.end(Sample.Status.COMPLETED, "no_tool_call")
            if not await user_turn(traj, model_ids, turn, turn == max_turns):
                return
            continue
        if turn == max_turns:
            traj.tools.record_unanswered(parsed.items, turn, "--max-turns was reached")
            return traj.end(Sample.Status.TRUNCATED, "max_turns")
        if not await tool_turn(traj, parsed.items, model_ids, turn, prep=time.perf_counter() - t0):
            return traj.end(Sample.Status.TRUNCATED, "budget_exhausted_in_tool_response")
    return traj.end(Sample.Status.TRUNCATED, "max_turns")


def read_turn(traj: Trajectory, model_ids: list[int], cut: bool) -> ParseResult:
    """The model's turn as text and tool calls (its stop token left out), added to the conversation."""
    text_ids = model_ids[:-1] if model_ids and model_ids[-1] == traj.ctx.delta.stop_id else model_ids
    text = traj.ctx.tok.decode(text_ids, skip_special_tokens=False)
    parsed = traj.ctx.parser.parse(text, cut_off=cut)
    if traj.messages is not None:
        traj.messages.append(
            traj.ctx.delta.assistant_message(parsed.content, [(c.name, c.arguments) for c in parsed.calls], text)
        )
    return parsed
