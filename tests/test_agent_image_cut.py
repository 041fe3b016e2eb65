"""A gateway Sample cut by `--agent-max-sample-tokens`-style budgets keeps only whole images: its
`multimodal_train_inputs` hold exactly the pixels of the image tokens it still has (the trainer's forward
refuses a count mismatch or, worse, reads the wrong pixels), and a cut inside an image's tokens moves before
them. Property-tested over rows of text and images and every cut point."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from slime.agent.gateway.builder import DriftKind, SampleBuilder
from slime.agent.gateway.records import TurnRecord
from slime.utils.prompt_images import PreparedImage, placeholder_runs
from slime.utils.types import Sample

PAD = 7  # the image token of these rows


def image(tokens: int, tag: int) -> PreparedImage:
    grid = torch.tensor([[1, 2, 2 * tokens]])  # merge 2: 4 * tokens patches -> `tokens` placeholder tokens
    return PreparedImage(f"data:image/png;base64,{tag}", torch.full((4 * tokens, 3), float(tag)), grid, tokens, PAD)


@st.composite
def rows(draw):
    """(prompt ids with its images expanded, the images, sampled ids, a cut)."""
    ids, images = [1], []
    for tag in range(draw(st.integers(1, 3))):
        ids += draw(st.lists(st.integers(10, 20), max_size=3))
        n = draw(st.integers(1, 4))
        images.append(image(n, tag))
        ids += [PAD] * n + [8]  # <|vision_end|>: a template never renders two images' tokens as one run
    ids += draw(st.lists(st.integers(10, 20), min_size=1, max_size=3))
    out = draw(st.lists(st.integers(10, 20), min_size=1, max_size=4))
    cut = draw(st.integers(1, len(ids) + len(out)))
    return ids, images, out, cut


@given(rows())
def test_a_cut_row_carries_the_pixels_of_exactly_its_whole_images(row):
    ids, images, out, cut = row
    builder = SampleBuilder(fork_threshold=1024)
    builder.append(
        TurnRecord(
            prompt_ids=ids,
            output_ids=out,
            finish_reason="stop",
            output_log_probs=[-1.0] * len(out),
            images=tuple(images),
        ),
        DriftKind.CLEAN,
        trained=True,
    )
    sample = builder.to_sample(Sample(index=0, prompt="p"), {}, finish_reason="stop", max_tokens=cut)

    runs = placeholder_runs(sample.tokens, PAD)
    assert all(length == images[j].tokens for j, (_, length) in enumerate(runs)), "a partial image stayed"
    inside = [start for start, length in placeholder_runs(ids, PAD) if start < cut < start + length]
    assert len(sample.tokens) == (inside[0] if inside else cut)
    # nothing cut that did not have to be: the cut moved back only to the start of the image it fell in
    whole = [i for i, (start, length) in enumerate(placeholder_runs(ids, PAD)) if start + length <= cut]
    assert len(runs) == len(whole)
    inputs = sample.multimodal_train_inputs
    if not runs:
        assert inputs is None and sample.multimodal_inputs is None
        return
    expected = torch.cat([images[i].pixel_values for i in whole])
    assert torch.equal(inputs["pixel_values"], expected)
    assert inputs["image_grid_thw"].tolist() == [images[i].grid_thw[0].tolist() for i in whole]
    assert sample.multimodal_inputs["images"] == [images[i].data_uri for i in whole]
