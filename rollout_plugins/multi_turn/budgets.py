"""The token budgets of one trajectory, and the reasons a trajectory ends.

Budgets count the whole trajectory (a resumed one included): the response budget (the sample's
max_new_tokens, else --rollout-max-response-len) and the context budget (--rollout-max-context-len)
bound everything appended; --max-tokens-per-turn only caps one engine turn. A budget that runs out
ends the trajectory as `<its name>_exhausted`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


# The trajectory's `finish_reason` (TrajectoryRecord), set once by `Trajectory.end`.
EndReason = Literal[
    "no_tool_call",  # completed: the model answered without calling a tool
    "interaction_terminated",
    "max_user_turns",  # completed: the interaction ended the conversation
    "max_turns",  # --max-turns reached: completed when the interaction was next, truncated with calls left
    "turn_cap",  # truncated: one turn hit --max-tokens-per-turn without a complete tool call
    "response_budget_exhausted",
    "context_budget_exhausted",
    "turn_cap_exhausted",
    "prompt_fills_context",
    "budget_exhausted_in_tool_response",
    "budget_exhausted_in_user_turn",  # not appended in part
    "engine_abort",
    "rollout_abort",
    "cancelled",  # aborted (the first two are resumable)
    "engine_error",
    "exception",  # failed
]


@dataclass(frozen=True)
class TokenBudgets:
    response: int  # tokens after the prompt
    context: int | None  # prompt + response; None or 0: no limit
    per_turn: int | None  # max_new_tokens of one engine turn; None or 0: no cap

    @classmethod
    def from_args(cls, args: Any, sampling_params: dict[str, Any]) -> "TokenBudgets":
        return cls(
            response=int(sampling_params.get("max_new_tokens") or args.rollout_max_response_len),
            context=args.rollout_max_context_len,
            per_turn=args.max_tokens_per_turn,
        )

    def left(self, total: int, prompt_len: int) -> list[tuple[int, str]]:
        """(tokens left, name) of the response budget and the context budget."""
        limits = [(self.response - (total - prompt_len), "response_budget")]
        if self.context:
            limits.append((self.context - total, "context_budget"))
        return limits

    def fits(self, n: int, total: int, prompt_len: int) -> bool:
        """Whether n more tokens fit every budget."""
        return n <= min(self.left(total, prompt_len))[0]

    def room(self, total: int, prompt_len: int) -> tuple[int, str]:
        """max_new_tokens of the next turn: the smallest of the budgets and the per-turn cap, with its name."""
        return min(self.left(total, prompt_len) + ([(int(self.per_turn), "turn_cap")] if self.per_turn else []))
