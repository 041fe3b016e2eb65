"""Images in prompts a rollout renders itself (the agent gateway, the multi-turn tool loop): each image read
and run through the checkpoint's image processor once, its `<|image_pad|>` placeholder expanded to the
image's token count in the ids, and the processor's outputs kept for the trainer.

Why here: a conversation that grows turn by turn renders only its new messages (a template delta with one
placeholder per new image) and keeps the ids it already sent (earlier images already expanded). `expand`
takes both: a run of one placeholder token is expanded, a run already at the image's count is kept. So the
ids the engine runs are the ids the Sample trains on, and `train_inputs` are the pixels of exactly those
image tokens, in order (slime's `multimodal_train_inputs`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from slime.utils.images import encode_png_data_uri, open_image
from slime.utils.vision_model import tokens_per_image


@dataclasses.dataclass(frozen=True, eq=False)
class PreparedImage:
    """One image as the engine and the trainer take it: a PNG data URI (`image_data`), the processor's
    `pixel_values` rows and `image_grid_thw` row, how many placeholder tokens it fills, and which token."""

    data_uri: str
    pixel_values: Any
    grid_thw: Any
    tokens: int
    token_id: int


class ImageCountError(ValueError):
    """The prompt's image placeholders do not match its images: their count (`image` None), or the run of
    image `image` has another length than 1 or the image's token count. The engine answers it as a 400."""

    def __init__(self, detail: str, image: int | None = None) -> None:
        super().__init__(detail if image is None else f"image {image}: {detail}")
        self.detail, self.image = detail, image


class PromptImages:
    """The checkpoint's image side: its processor's image processor and image token."""

    def __init__(self, processor: Any) -> None:
        self.image_processor = processor.image_processor
        self.image_token_id = int(processor.image_token_id)
        self.merge_size = int(getattr(self.image_processor, "merge_size", 2))

    @classmethod
    def of_checkpoint(cls, path: Any) -> PromptImages | None:
        """None for a checkpoint without an image processor (a text-only model)."""
        from slime.utils.processing_utils import load_processor

        processor = load_processor(path, trust_remote_code=True) if path else None
        if processor is None or getattr(processor, "image_processor", None) is None:
            return None
        return cls(processor)

    def prepare(self, value: Any, base_dir: Any = None) -> PreparedImage:
        """`value` (a path, data URI, base64, bytes or PIL image) read and processed; raises
        `slime.utils.images.ImageError` naming what is wrong with it."""
        image = open_image(value, base_dir=base_dir)
        out = self.image_processor(images=[image], return_tensors="pt")
        grid = out["image_grid_thw"]
        return PreparedImage(
            encode_png_data_uri(image),
            out["pixel_values"],
            grid,
            tokens_per_image(grid, self.merge_size)[0],
            self.image_token_id,
        )

    def count(self, value: Any) -> int:
        """How many placeholder tokens the image `value` fills (the processor's grid, no pixels kept)."""
        grid = self.image_processor(images=[open_image(value)], return_tensors="pt")["image_grid_thw"]
        return tokens_per_image(grid, self.merge_size)[0]

    def expand(self, ids: list[int], images: list[PreparedImage]) -> list[int]:
        """`ids` with each image's placeholder run at its token count (`expand_placeholders`)."""
        return expand_placeholders(ids, self.image_token_id, [image.tokens for image in images])


def expand_placeholders(ids: list[int], token: int, counts: list[int]) -> list[int]:
    """`ids` with the j-th run of the placeholder `token` at `counts[j]` tokens: a run of 1 is expanded (what a
    chat template renders), a run already at the count is kept (ids a rollout sent before). Anything else
    raises `ImageCountError`. One function for the engine's `image_data` and the rollouts' own prompts, so
    both accept the same ids."""
    runs = placeholder_runs(ids, token)
    if len(runs) != len(counts):
        raise ImageCountError(
            f"{len(counts)} image(s) but the prompt has {len(runs)} image placeholder(s) "
            f"(runs of token {token}, <|image_pad|>): one per image, in order"
        )
    if all(length == need for (_, length), need in zip(runs, counts)):
        return ids
    out: list[int] = []
    cursor = 0
    for j, ((start, length), need) in enumerate(zip(runs, counts)):
        if length not in (1, need):
            raise ImageCountError(
                f"the image fills {need} tokens but its placeholder is {length} tokens "
                "(give 1 to have it expanded, or exactly the image's count)",
                image=j,
            )
        out += ids[cursor:start]
        out += [token] * need
        cursor = start + length
    return out + ids[cursor:]


def collapse(ids: list[int], token: int) -> list[int]:
    """`ids` with each run of `token` as one token: the form a chat template renders (for comparing with it)."""
    return [t for i, t in enumerate(ids) if t != token or i == 0 or ids[i - 1] != token]


def train_inputs(images: Iterable[PreparedImage]) -> dict[str, Any] | None:
    """slime's `multimodal_train_inputs` of a prompt holding `images` in this order (None: no image)."""
    import torch

    images = list(images)
    if not images:
        return None
    return {
        "pixel_values": torch.cat([i.pixel_values for i in images]),
        "image_grid_thw": torch.cat([i.grid_thw for i in images]),
    }


def whole_images(ids: list[int], end: int, images: list[PreparedImage]) -> tuple[int, list[PreparedImage]]:
    """A row of `ids` (holding `images`, expanded, in order) cut at `end` keeps only whole images: a cut inside
    an image's tokens moves before them, and images past the cut leave the row, so its train inputs match its
    image tokens (the trainer's forward needs every image token's pixels and no others)."""
    if not images:
        return end, []
    kept: list[PreparedImage] = []
    for (start, length), image in zip(placeholder_runs(ids, images[0].token_id), images):
        if start + length > end:
            return min(end, start), kept
        kept.append(image)
    return end, kept


def placeholder_runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of `token` in `ids`."""
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs
