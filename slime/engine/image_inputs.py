"""SGLang's `image_data` on `/generate`: the images of each input read, run through the checkpoint's image
processor, and their placeholder tokens in `input_ids` matched to them.

A prompt marks each image with `<|image_pad|>` tokens: one (what a chat template renders; expanded here to
the image's token count, as SGLang's processor does) or already the full count (what a rollout that ran the
processor itself sends, so its sample holds exactly the ids the engine saw). Anything else is refused
naming `image_data` and the image. A text-only model refuses `image_data` altogether. Runs off the event
loop (decoding and resizing images is CPU work).
"""

from __future__ import annotations

from typing import Any

from slime.engine.request_parsing import BadRequest
from slime.utils.images import ImageError, open_image
from slime.utils.prompt_images import ImageCountError, expand_placeholders
from slime.utils.vision_model import tokens_per_image


def images_per_input(image_data: Any, n: int, batch: bool) -> list[list[Any]]:
    """SGLang's layouts: one input's images (one item or a list), or per input of a batch (a list of n
    entries, each None, one item or a list)."""
    if image_data is None:
        return [[] for _ in range(n)]
    if not batch:
        return [_items(image_data, "image_data")]
    if not isinstance(image_data, list) or len(image_data) != n:
        got = f"a list of {len(image_data)}" if isinstance(image_data, list) else type(image_data).__name__
        raise BadRequest(f"image_data: a batch of {n} inputs needs a list of {n} entries (one per input), got {got}")
    return [_items(entry, f"image_data[{i}]") for i, entry in enumerate(image_data)]


def _items(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    for j, item in enumerate(items):
        if not isinstance(item, (str, dict)):
            raise BadRequest(
                f"{where}[{j}]: an image must be a data URI, base64 text or a file path, got {type(item).__name__}"
            )
    return items


class ImageInputs:
    """The served checkpoint's image side: its image processor, image token and merge size."""

    def __init__(self, processor: Any, image_token_id: int):
        self.image_processor = processor.image_processor
        self.image_token_id = int(image_token_id)
        self.merge_size = int(getattr(self.image_processor, "merge_size", 2))

    def prepare(self, input_ids: list[int], items: list[Any], where: str = "image_data") -> tuple[list[int], dict]:
        """(the ids with each image's placeholder at its full token count, {pixel_values, image_grid_thw})."""
        images = []
        for j, item in enumerate(items):
            try:
                images.append(open_image(item))
            except ImageError as e:
                raise BadRequest(f"{where}[{j}]: {e}") from None
        out = self.image_processor(images=images, return_tensors="pt")
        grid = out["image_grid_thw"]
        ids = self.expand(input_ids, tokens_per_image(grid, self.merge_size), where)
        return ids, {"pixel_values": out["pixel_values"], "image_grid_thw": grid}

    def expand(self, input_ids: list[int], counts: list[int], where: str) -> list[int]:
        """`expand_placeholders`, its error a 400 naming `where` (and the image)."""
        try:
            return expand_placeholders(input_ids, self.image_token_id, counts)
        except ImageCountError as e:
            at = where if e.image is None else f"{where}[{e.image}]"
            raise BadRequest(f"{at}: {e.detail}") from None
