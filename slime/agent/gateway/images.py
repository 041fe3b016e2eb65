"""`ConversationImages`: the images of a gateway conversation, each read and processed once per session.

A request's messages hold template image parts (`{"type": "image", "image": <data URI or path>}`, what
`protocols.media` makes of the APIs' image blocks). Their order in the messages is the order of the
placeholders in the rendered prompt, so the prompt's ids are expanded image by image (`PromptImages`),
the engine gets them as `image_data`, and the turn's record keeps them for the Sample's
`multimodal_train_inputs`. A conversation resends every earlier image each turn; the session keeps what
each image became (keyed by its source text), so turn 16 processes only turn 16's new images.
"""

from __future__ import annotations

from typing import Any

from slime.agent.gateway.errors import BadRequestError
from slime.utils.images import ImageError
from slime.utils.prompt_images import ImageCountError, PreparedImage, PromptImages


def image_sources(messages: list[dict[str, Any]]) -> list[str]:
    """The image parts' sources, in the order the template renders them."""
    return [
        part["image"]
        for m in messages
        if isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, dict) and part.get("type") == "image"
    ]


class ConversationImages:
    def __init__(self, images: PromptImages) -> None:
        self.images = images

    def of(self, cache: dict[str, PreparedImage], messages: list[dict[str, Any]]) -> list[PreparedImage]:
        """The messages' images, prepared (a `BadRequestError` naming one that cannot be read)."""
        out: list[PreparedImage] = []
        for k, source in enumerate(image_sources(messages)):
            image = cache.get(source)
            if image is None:
                try:
                    image = cache[source] = self.images.prepare(source)
                except ImageError as e:
                    raise BadRequestError(f"messages: image {k} of the conversation: {e}") from None
            out.append(image)
        return out

    def expand(self, ids: list[int], images: list[PreparedImage]) -> list[int]:
        try:
            return self.images.expand(ids, images)
        except ImageCountError as e:
            raise BadRequestError(
                f"messages: {e} in the rendered prompt (the chat template must render one <|image_pad|> per image part)"
            ) from None
