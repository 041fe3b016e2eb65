"""Reward of `make vlm-demo` (slime's `--custom-rm-path` signature)."""


async def names_the_shape(args, sample):
    """1.0 when the answer names the drawn shape; otherwise the share of letters in it (0..0.5), so the
    random tiny VLM's answers differ in reward within a group and GRPO has a gradient to follow."""
    text = (sample.response or "").lower()
    if str(sample.label).lower() in text:
        return 1.0
    return 0.5 * sum(c.isalpha() for c in text) / max(1, len(text))
