"""The tool step: run the calls of an assistant turn, then append the tool turn's template tokens.

The calls run outside the engine concurrency slot (the engine turn has returned), concurrently, and
each is answered to the model (`slime/tools/trajectory_tools.py`). Their time counts as non-generation
time; the rest of the turn's own work as its overhead.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from slime.tools.chat_format import ParseError, ToolCall

if TYPE_CHECKING:
    from rollout_plugins.multi_turn.trajectory import Trajectory


async def tool_turn(
    traj: Trajectory, items: list[ToolCall | ParseError], model_ids: list[int], turn: int, prep: float
) -> bool:
    """Run the calls and append their tool turn (mask 0); False when it does not fit the budgets.

    `prep` is the turn's overhead so far (seconds since the engine answered)."""
    t1 = time.perf_counter()
    tool_msgs = await traj.run_calls(items, turn)
    traj.record.non_generation_time += time.perf_counter() - t1
    t2 = time.perf_counter()
    if not traj.add_tool_turn(tool_msgs, model_ids, turn):
        return False
    traj.record.turn_overhead_s.append(prep + time.perf_counter() - t2)
    return True
