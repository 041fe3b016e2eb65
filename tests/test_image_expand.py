"""One placeholder expansion for the engine's `image_data` and the rollouts' own prompts
(`slime.utils.prompt_images.expand_placeholders`): both accept the same ids, the rollout side raises the typed
`ImageCountError` (naming the image), and the engine answers it as its 400 naming `image_data[j]`."""

from __future__ import annotations

import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slime.engine.image_inputs import ImageInputs
from slime.engine.request_parsing import BadRequest
from slime.utils.prompt_images import ImageCountError, PreparedImage, PromptImages, expand_placeholders

PAD = 7


def _sides():
    processor = types.SimpleNamespace(image_processor=types.SimpleNamespace(merge_size=2), image_token_id=PAD)
    return ImageInputs(processor, PAD), PromptImages(processor)


def _image(tokens: int) -> PreparedImage:
    return PreparedImage("data:image/png;base64,", None, None, tokens, PAD)


@st.composite
def prompts(draw):
    """(ids with each image's run either 1 token or already full, the images' token counts, the expected ids)."""
    ids, full, counts = [1], [1], []
    for _ in range(draw(st.integers(0, 3))):
        text = draw(st.lists(st.integers(10, 20), max_size=3))
        n = draw(st.integers(1, 5))
        counts.append(n)
        ids += text + [PAD] * (n if draw(st.booleans()) else 1) + [8]
        full += text + [PAD] * n + [8]
    return ids, counts, full


@given(prompts())
def test_engine_and_rollout_expand_the_same_ids(case):
    ids, counts, full = case
    engine, rollout = _sides()
    assert expand_placeholders(ids, PAD, counts) == full
    assert engine.expand(ids, counts, "image_data") == full
    assert rollout.expand(ids, [_image(n) for n in counts]) == full


def test_a_mismatch_is_a_typed_error_and_the_engines_400_names_the_image():
    engine, rollout = _sides()
    ids = [1, PAD, PAD, PAD, 8, 2]  # a run of 3 for an image of 6 tokens
    with pytest.raises(ImageCountError) as typed:
        rollout.expand(ids, [_image(6)])
    assert typed.value.image == 0 and "image 0: the image fills 6 tokens but its placeholder is 3" in str(typed.value)
    with pytest.raises(BadRequest, match=r"^image_data\[0\]: the image fills 6 tokens but its placeholder is 3 "):
        engine.expand(ids, [6], "image_data")
    with pytest.raises(ImageCountError) as count:
        expand_placeholders(ids, PAD, [6, 6])
    assert count.value.image is None and str(count.value).startswith("2 image(s) but the prompt has 1")
    with pytest.raises(BadRequest, match=r"^image_data: 2 image\(s\) but the prompt has 1 image placeholder"):
        engine.expand(ids, [6, 6], "image_data")
