"""The user step (verl's interactions): after an assistant turn without tool calls, the sample's
interaction answers as the user; its reply's template tokens are appended masked 0, log-probs 0.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from slime.utils.trajectory import UserTurn
from slime.utils.types import Sample

if TYPE_CHECKING:
    from rollout_plugins.multi_turn.trajectory import Trajectory


async def user_turn(traj: Trajectory, model_ids: list[int], turn: int, last_turn: bool) -> bool:
    """The interaction's reply appended as a user turn. False, with the trajectory ended, when it
    terminates or a cap is hit.

    As in verl, --max-user-turns / --max-turns are checked before the interaction is asked. On
    terminate the reply is recorded but not appended: the trajectory ends on the model's turn.
    A reply that does not fit the remaining budget is not appended in part (as tool results).
    """
    limit = traj.args.max_user_turns
    if limit is not None and len(traj.record.user_turns) >= int(limit):
        traj.end(Sample.Status.COMPLETED, "max_user_turns")
        return False
    if last_turn:
        traj.end(Sample.Status.COMPLETED, "max_turns")
        return False
    t0 = time.perf_counter()
    reply = await traj.interaction.respond(traj.messages)
    traj.record.non_generation_time += time.perf_counter() - t0
    message = {"role": "user", "content": reply.content}
    delta = [] if reply.terminate else traj.ctx.delta.user_delta_ids(message, model_ids)
    appended = not reply.terminate and traj.fits(len(delta))
    traj.record.user_turns.append(
        UserTurn(
            turn=turn,
            content=reply.content,
            score=reply.score,
            terminate=reply.terminate,
            metrics=reply.metrics,
            appended=appended,
        )
    )
    if reply.terminate:
        traj.end(Sample.Status.COMPLETED, "interaction_terminated")
        return False
    if not appended:
        traj.end(Sample.Status.TRUNCATED, "budget_exhausted_in_user_turn")
        return False
    traj.add_user_turn(message, delta, turn)
    return True
