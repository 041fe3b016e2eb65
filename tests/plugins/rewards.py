"""Deterministic custom rewards for tests (slime's `--custom-rm-path` signatures)."""


async def token_parity_rm(args, sample):
    """Depends on the sampled tokens only, so tests can recompute it from the batch."""
    return float(sum(sample.tokens[sample.prompt_length :]) % 3)


async def group_rank_rm(args, samples):
    """--group-rm: sees the whole group at once."""
    return [float(i) for i in range(len(samples))]
