"""A reward the tiny test model can learn in a few GRPO steps (slime's `--custom-rm-path` signature)."""


async def even_token_fraction(args, sample):
    """The fraction of response tokens with an even id: with `--rollout-top-k 2` a random model starts
    near 0.5, and the policy only has to prefer the even one of its two candidates."""
    response = sample.tokens[len(sample.tokens) - sample.response_length :] if sample.response_length else []
    return sum(1 for t in response if t % 2 == 0) / len(response) if response else 0.0
