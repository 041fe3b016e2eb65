"""Images as rollouts carry them: read from what a data row, an `image_data` entry or an API block holds (a
file path, a `data:image/...;base64,` URI, bare base64, raw bytes or a PIL image), and written back as the
PNG data URI SGLang's `image_data` takes.

Why one module: the data file, the engine and the gateway must accept and refuse the same things with the
same words. Nothing is fetched: a URL is refused (every machine here may be offline, and a run that
depends on a remote server's answer is not reproducible). PIL is imported on first use.
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

_URL_SCHEMES = ("http://", "https://", "ftp://", "s3://", "gs://")


class ImageError(ValueError):
    """An image that cannot be read; the message says what it is and why."""


def is_url(value: Any) -> bool:
    return isinstance(value, str) and value.strip().lower().startswith(_URL_SCHEMES)


def open_image(value: Any, *, base_dir: str | Path | None = None) -> Any:
    """The PIL image (loaded, RGB) that `value` holds. A relative path is looked up as given, then under
    `base_dir` (the data file's folder). Raises ImageError naming the problem."""
    from PIL import Image

    if isinstance(value, Image.Image):
        return _rgb(value)
    if isinstance(value, (bytes, bytearray)):
        return _decode(bytes(value), "the bytes")
    if isinstance(value, dict):  # slime's rich item {"type": "image", "image": ...} and parquet's {"bytes", "path"}
        inner = value.get("image", value.get("bytes") or value.get("path"))
        if inner is None:
            raise ImageError(f"an image object needs an 'image', 'bytes' or 'path' key, got keys {sorted(value)}")
        return open_image(inner, base_dir=base_dir)
    if not isinstance(value, str):
        raise ImageError(f"an image must be a path, a data URI, base64 text or bytes, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise ImageError("the image is an empty string")
    if is_url(text):
        raise ImageError(
            f"{_short(text)} is a URL; images are not downloaded (offline): give a local path "
            "or a data:image/...;base64, URI"
        )
    if text.startswith("data:"):
        head, sep, payload = text.partition(",")
        if not sep or ";base64" not in head:
            raise ImageError(f"{_short(text)}: a data URI must be data:image/<type>;base64,<data>")
        return _decode(_b64(payload, "the data URI"), "the data URI")
    path = _find(text, base_dir)
    if path is not None:
        try:
            return _decode(path.read_bytes(), str(path))
        except OSError as e:
            raise ImageError(f"{path}: cannot read: {e.strerror or e}") from None
    if not _looks_base64(text):
        where = f" (nor under {base_dir})" if base_dir is not None else ""
        raise ImageError(f"image file not found: {text}{where}")
    return _decode(_b64(text, "the base64 text"), "the base64 text")


def encode_png_data_uri(image: Any) -> str:
    """An image as `data:image/png;base64,...` (RGB PNG), what SGLang's `image_data` accepts."""
    image = open_image(image)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _find(text: str, base_dir: str | Path | None) -> Path | None:
    if len(text) > 4096:
        return None
    candidates = [Path(text).expanduser()]
    if base_dir is not None and not Path(text).is_absolute():
        candidates.append(Path(base_dir) / text)
    for path in candidates:
        try:
            if path.is_file():
                return path
        except OSError:  # a name too long for the file system: base64, not a path
            return None
    return None


def _looks_base64(text: str) -> bool:
    return len(text) >= 64 and all(c.isalnum() or c in "+/=\n\r" for c in text)


def _b64(payload: str, what: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError) as e:
        raise ImageError(f"{what} is not valid base64: {e}") from None


def _decode(raw: bytes, what: str) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(raw))
        image.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        raise ImageError(f"{what} is not an image PIL can read ({type(e).__name__}: {str(e)[:120]})") from None
    return _rgb(image)


def _rgb(image: Any) -> Any:
    return image if image.mode == "RGB" else image.convert("RGB")


def _short(text: str) -> str:
    return repr(text if len(text) <= 60 else text[:57] + "...")
