"""Reward of the `make train-demo` task (slime's `--custom-rm-path` signature)."""

MAX_WORDS = 12


async def concise_answer(args, sample):
    """1.0 for an answer that finishes (EOS) within the response budget in at most MAX_WORDS words,
    0.5 for one that finishes but is longer, 0.0 for a truncated one. SmolLM2-135M-Instruct tends to
    ramble, so it starts mid-range; GRPO makes it concise within a few steps."""
    status = getattr(sample.status, "value", sample.status)
    if status == "truncated":
        return 0.0
    words = len((sample.response or "").split())
    return 1.0 if 0 < words <= MAX_WORDS else 0.5
