"""Multi-turn tool rollouts with exact token accounting.

Use per sample with `--custom-generate-function-path rollout_plugins.multi_turn.generate`, or as
the whole rollout with `--rollout-function-path rollout_plugins.multi_turn.generate_rollout`.

Why it is built this way:
- The trajectory is only ever appended to: prompt ids, then exactly the ids the engine returned
  (loss mask 1, their log-probs), then the template's tokens for tool results (mask 0, log-prob
  0). History is never re-rendered or re-tokenised, so per-turn work does not grow with the
  conversation and the batch holds the tokens the model actually sampled.
- Every malformed, unknown, invalid, excess or cut-off tool call is answered to the model with a
  tool message saying what was wrong and recorded on the sample; nothing is dropped silently.
- Tool instances are created once per trajectory and released on every path (errors, abort,
  cancellation). Tool calls run concurrently and outside the engine concurrency slot.

Read in this order: `context` (what a process shares) → `trajectory` (one sample: set-up, run,
finish) → `turn_loop` (engine turn, parse, then `tool_turn` or `user_turn`) → `budgets` (token
budgets, end reasons) → `tool_reward`. One sample's tool instances are `slime/tools/trajectory_tools.py`,
its interaction `slime/interactions/sample_interaction.py`.

Partial rollout (`--partial-rollout`) continues a trajectory at turn granularity. While a rollout
aborts, a tool call in flight finishes first (within `--abort-timeout`), its tool turn is appended,
and the loop stops before the next engine turn. An engine turn that was aborted keeps the tokens it
sampled (mask 1, their log-probs). The trajectory (tokens, mask, log-probs, conversation, record) is
stored on the sample, and the next rollout resumes it where it stopped: inside the aborted turn
(the engine continues from prompt + everything so far; the turn is parsed as a whole once it ends)
or at the next turn. Budgets count the whole trajectory. Tool instances do not outlive a rollout
(they are released when the sample leaves it, so none leaks if it never comes back): a resumed
trajectory creates them again with the same create_kwargs; per-instance tool state from before the
interruption is not carried over, the step rewards already earned are.

With --interaction-config-path (verl's interaction YAML), an assistant turn without tool calls is
answered by the sample's interaction (chosen by its `interaction_kwargs.name`) as a user turn:
the template's tokens for it are appended masked 0, its score is recorded as a turn score, and
the trajectory ends when it says terminate or at --max-user-turns (see `user_turn`).
"""

from __future__ import annotations

from typing import Any

from rollout_plugins.multi_turn.context import MultiTurnContext
from rollout_plugins.multi_turn.tool_reward import add_tool_reward
from rollout_plugins.multi_turn.trajectory import RESUME_KEY, Trajectory
from rollout_plugins.multi_turn.turn_loop import run_turns
from slime.utils.types import Sample
from slime.utils.plugin_args import completed

__all__ = [
    "GENERATE_PATH",
    "RESUME_KEY",
    "MultiTurnContext",
    "Trajectory",
    "add_tool_reward",
    "generate",
    "generate_rollout",
]

GENERATE_PATH = "rollout_plugins.multi_turn.generate"


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    """slime's per-sample generate contract: one multi-turn trajectory with tools (resumed when it is
    an aborted partial trajectory and --partial-rollout is on)."""
    args = completed(args)
    ctx = MultiTurnContext.get(args)
    sample = await Trajectory(ctx, args, sample, sampling_params).run(run_turns)
    await add_tool_reward(args, sample)
    return sample


generate.supports_partial_rollout = True  # resumes at turn granularity (module docstring)


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False):
    """slime's rollout contract: the default rollout with `generate` above as the per-sample step."""
    args = completed(args)
    from slime.rollout import sglang_rollout

    if args.custom_generate_function_path not in (None, GENERATE_PATH):
        raise ValueError(
            f"--rollout-function-path rollout_plugins.multi_turn.generate_rollout sets its own "
            f"generate function; remove --custom-generate-function-path "
            f"{args.custom_generate_function_path!r}"
        )
    args.custom_generate_function_path = GENERATE_PATH
    MultiTurnContext.get(args)  # fail fast on a bad tool config or template before any request
    return sglang_rollout.generate_rollout(args, rollout_id, data_source, evaluation)
