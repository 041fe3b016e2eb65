"""slime's OPD reward for a branch whose rollout still requires numeric rewards (issue #22 item 3 keeps raw
rewards until `--custom-reward-post-process-path`; once it is merged, the tests can use
`slime.rollout.on_policy_distillation.reward_func` itself)."""

from slime.rollout.on_policy_distillation import reward_func


async def teacher_answer_with_zero_score(args, sample):
    """The teacher's whole answer, plus the zero task score that slime's OPD post-process returns anyway."""
    return {"score": 0.0, **await reward_func(args, sample)}
