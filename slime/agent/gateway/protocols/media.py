"""Image, audio and file content blocks: images go to a vision-language model, the rest is refused by path.

Rendered as text they became a Python repr with the base64 data (a 40 kB image: 5,100 prompt
tokens) or a placeholder the model never saw the image behind -- training data about an input the
policy did not get. So every protocol's body check calls `refuse_media` on each content list. With
a vision-language model (`vision=True`) an image block -- OpenAI's `image_url` part, Anthropic's
`image` block, Responses' `input_image` -- is checked instead and becomes a template image part `{"type": "image", "image":
<data URI or local path>}` (`template_content`); the gateway renders it with the processor's
placeholder tokens and sends the image to the engine as `image_data`. Nothing is downloaded: an
http(s) URL is refused naming the block, as is every image for a text-only model.
"""

from __future__ import annotations

from typing import Any

from slime.agent.gateway.errors import FieldError
from slime.agent.gateway.protocols.common import flatten_content
from slime.utils.images import is_url

# Anthropic (image, document), OpenAI Chat (image_url, input_audio, file), Responses (input_image,
# input_file, input_audio), and the bare names some clients send
MEDIA_BLOCKS = frozenset(
    {
        "image",
        "document",
        "image_url",
        "input_image",
        "input_audio",
        "audio",
        "file",
        "input_file",
        "video",
        "video_url",
    }
)
IMAGE_BLOCKS = frozenset({"image", "image_url", "input_image"})  # Anthropic's, OpenAI Chat's, Responses'

FILE_SCHEME = "file://"


def refuse_media(content: Any, path: str, *, vision: bool = False) -> None:
    """A `FieldError` naming the first media block of `content` (a string or a list of blocks) the model
    cannot read, looking inside nested block content too (an Anthropic `tool_result` may carry images).
    With `vision`, image blocks are read: their source is checked (`image_source`) instead."""
    if not isinstance(content, list):
        return
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            continue
        where = f"{path}[{i}]"
        kind = block.get("type")
        if vision and kind in IMAGE_BLOCKS:
            image_source(block, where)
        elif kind in MEDIA_BLOCKS:
            reads = "reads text and images" if vision else "reads text only"
            raise FieldError(
                where,
                f"a {kind!r} block: this gateway's model {reads}, so {kind} input "
                "is refused rather than rendered as text; send text instead",
            )
        for key in ("content", "output"):
            refuse_media(block.get(key), f"{where}.{key}", vision=vision)


def image_source(block: dict[str, Any], where: str) -> str:
    """The image an `image` / `image_url` block carries, as `open_image` reads it: a data URI, or a local
    file's path (`file://` or a bare path). A `FieldError` naming the field otherwise."""
    if block.get("type") == "image_url":  # OpenAI: {"image_url": {"url": ..., "detail": ...}} (or the url alone)
        value = block.get("image_url")
        url = value.get("url") if isinstance(value, dict) else value
        return _local(url, f"{where}.image_url.url")
    if block.get("type") == "input_image":  # Responses: {"image_url": "data:...", "detail"} or {"file_id"}
        if block.get("image_url") is None and block.get("file_id") is not None:
            raise FieldError(f"{where}.file_id", "uploaded files are not served; send image_url as a data URI")
        return _local(block.get("image_url"), f"{where}.image_url")
    source = block.get("source")  # Anthropic: {"type": "base64", "media_type", "data"} | {"type": "url", "url"}
    if not isinstance(source, dict):
        raise FieldError(f"{where}.source", 'an image block needs a source object ({"type": "base64", ...})')
    kind = source.get("type")
    if kind == "base64":
        data, media = source.get("data"), source.get("media_type")
        if not isinstance(data, str) or not data:
            raise FieldError(f"{where}.source.data", "the image's base64 data must be a non-empty string")
        if not isinstance(media, str) or not media.startswith("image/"):
            raise FieldError(f"{where}.source.media_type", f"must be an image/... type, got {media!r}")
        return f"data:{media};base64,{data}"
    if kind == "url":
        return _local(source.get("url"), f"{where}.source.url")
    raise FieldError(
        f"{where}.source.type",
        f"{kind!r}: an image source here is base64 data (or a local file url); uploaded files are not served",
    )


def _local(url: Any, where: str) -> str:
    if not isinstance(url, str) or not url.strip():
        raise FieldError(where, "must be a non-empty string (a data:image/...;base64, URI)")
    if is_url(url):
        raise FieldError(
            where,
            f"{url[:60]!r} is a URL; images are not downloaded (the gateway is offline): "
            "send the image as a data:image/...;base64, URI",
        )
    return url[len(FILE_SCHEME) :] if url.startswith(FILE_SCHEME) else url


def has_images(content: Any) -> bool:
    return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") in IMAGE_BLOCKS for b in content)


def template_content(content: Any) -> Any:
    """A wire content value as the chat template takes it: text (`flatten_content`) or, when it holds
    images, a list of text and `{"type": "image", "image": source}` parts in the client's order."""
    if not has_images(content):
        return flatten_content(content)
    parts: list[dict[str, Any]] = []
    for b in content:
        if isinstance(b, dict) and b.get("type") in IMAGE_BLOCKS:
            parts.append({"type": "image", "image": image_source(b, "content")})
            continue
        text = flatten_content([b])
        if not text:
            continue
        if parts and parts[-1]["type"] == "text":  # adjacent text joins as flatten_content joins it
            parts[-1] = {"type": "text", "text": parts[-1]["text"] + "\n" + text}
        else:
            parts.append({"type": "text", "text": text})
    return parts
