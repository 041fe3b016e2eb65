"""Image, audio and file content blocks: refused, named by their path, until the gateway serves a
model that reads them.

Rendered as text they became a Python repr with the base64 data (a 40 kB image: 5,100 prompt
tokens) or a placeholder the model never saw the image behind -- training data about an input the
policy did not get. So every protocol's body check calls `refuse_media` on each content list; a
vision path replaces this one function (it would pass the blocks to the engine's `image_data`).
"""

from __future__ import annotations

from typing import Any

from slime.agent.errors import FieldError

# Anthropic (image, document), OpenAI Chat (image_url, input_audio, file), Responses (input_image,
# input_file, input_audio), and the bare names some clients send
MEDIA_BLOCKS = frozenset({"image", "document", "image_url", "input_image", "input_audio", "audio", "file",
                          "input_file", "video", "video_url"})


def refuse_media(content: Any, path: str) -> None:
    """A `FieldError` naming the first media block of `content` (a string or a list of blocks),
    looking inside nested block content too (an Anthropic `tool_result` may carry images)."""
    if not isinstance(content, list):
        return
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            continue
        where = f"{path}[{i}]"
        kind = block.get("type")
        if kind in MEDIA_BLOCKS:
            raise FieldError(where, f"a {kind!r} block: this gateway's model reads text only, so {kind} input "
                                    "is refused rather than rendered as text; send text instead")
        for key in ("content", "output"):
            refuse_media(block.get(key), f"{where}.{key}")
