"""The `make vlm-demo` questions: a handful of shapes drawn with Pillow, one JSONL row per picture.

`python configs/vlm_demo/make_data.py DIR` writes DIR/shapes.jsonl and DIR/img/*.png (paths relative to the
JSONL, as `--multimodal-keys '{"image": "images"}'` reads them). Same pictures every run (no randomness).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SHAPES = [
    ("circle", "red"),
    ("square", "blue"),
    ("triangle", "green"),
    ("circle", "orange"),
    ("square", "purple"),
    ("triangle", "black"),
    ("circle", "blue"),
    ("square", "green"),
]


def draw(shape: str, color: str, size: int = 96):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), "white")
    d = ImageDraw.Draw(img)
    box = (14, 14, size - 14, size - 14)
    if shape == "circle":
        d.ellipse(box, fill=color)
    elif shape == "square":
        d.rectangle(box, fill=color)
    else:
        d.polygon([(size // 2, 12), (12, size - 14), (size - 12, size - 14)], fill=color)
    return img


def main(out: Path) -> Path:
    (out / "img").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, (shape, color) in enumerate(SHAPES):
        name = f"img/{i}-{color}-{shape}.png"
        draw(shape, color).save(out / name)
        rows.append({"prompt": "<image>What shape is drawn? Answer in one word.", "images": [name], "label": shape})
    path = out / "shapes.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} image questions -> {path}")
    return path


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/vlm-demo/data"))
