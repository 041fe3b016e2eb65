"""The images of a prompt row (`--multimodal-keys '{"image": "images"}'`, slime's flag): read from the
row's key, checked, and placed in the prompt's messages as image content parts.

As in slime, each `<image>` in a message's text is where the next image goes; a row whose text has no
`<image>` at all gets its images at the start of the last user message (slime would refuse it). An image
is a file path (as given, else beside the data file), a `data:image/...;base64,` URI, base64 text, bytes
(parquet) or slime's `{"image": ...}` object; a URL is refused (nothing is downloaded). Every problem is a
DataError naming the file, the line and the image, raised at preflight (which reads every row).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from slime.utils.images import ImageError, open_image
from slime.utils.types import MultimodalTypes

PLACEHOLDER = MultimodalTypes.IMAGE.placeholder  # "<image>"


def row_images(
    keys: dict[str, str] | None, row: dict[str, Any], where: str, base_dir: Path | None, error: type
) -> tuple[list[Any], list[Any]] | None:
    """(the row's image values as written, the images as PIL RGB) by `keys` (`--multimodal-keys`), in order;
    None when the flag is unset."""
    if not keys:
        return None
    raw: list[Any] = []
    images: list[Any] = []
    for kind, key in keys.items():
        if kind != "image":
            raise error(
                f"--multimodal-keys: {kind!r}: only images are read here (the keys slime knows are "
                f"{[t.name for t in MultimodalTypes.all()]}; video and audio are not supported)"
            )
        values = row.get(key)
        if values is None:
            continue
        if hasattr(values, "tolist") and not isinstance(values, (bytes, str)):
            values = values.tolist()  # a parquet list column read back as numpy
        for j, value in enumerate(values if isinstance(values, list) else [values]):
            try:
                images.append(open_image(value, base_dir=base_dir))
            except ImageError as e:
                raise error(f"{where}: --multimodal-keys {kind}={key!r}: {key}[{j}]: {e}") from None
            raw.append(value if isinstance(value, (str, dict)) else f"<{type(value).__name__} image>")
    return raw, images


def with_image_parts(prompt: Any, images: list[Any], where: str, error: type) -> list[dict[str, Any]]:
    """The prompt as messages whose content places one `{"type": "image", "image": value}` part per image
    (the value as the row wrote it, as slime keeps it): at each `<image>` of the text, else at the start of
    the last user message."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    holders = sum(m["content"].count(PLACEHOLDER) for m in messages if isinstance(m.get("content"), str))
    if holders == 0:
        if not images:
            return messages
        last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=len(messages) - 1)
        content = messages[last].get("content")
        parts = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        messages[last]["content"] = [{"type": "image", "image": img} for img in images] + parts
        return messages
    if holders != len(images):
        raise error(
            f"{where}: the prompt has {holders} {PLACEHOLDER} placeholder(s) but the row has "
            f"{len(images)} image(s) (--multimodal-keys): one image per placeholder"
        )
    queue = list(images)
    for m in messages:
        if isinstance(m.get("content"), str) and PLACEHOLDER in m["content"]:
            parts = []
            for piece in re.split(f"({re.escape(PLACEHOLDER)})", m["content"]):
                if piece == PLACEHOLDER:
                    parts.append({"type": "image", "image": queue.pop(0)})
                elif piece:
                    parts.append({"type": "text", "text": piece})
            m["content"] = parts
    return messages
