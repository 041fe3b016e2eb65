"""A picture as terminal cells: each cell is an upper half block whose foreground is one pixel and whose
background is the pixel below, so a W x 2H thumbnail fills W columns and H rows of any true-colour
terminal. Why: the rollout viewer runs in a terminal (often over ssh), and a VLM sample is not debuggable
without seeing the picture the model answered about.
"""

from __future__ import annotations

from typing import Any

from rich.style import Style
from rich.text import Text

HALF_BLOCK = "▀"


def thumbnail_rows(image: Any, width: int = 24) -> list[Text]:
    """The image (PIL) scaled to `width` columns, aspect kept, as one `Text` per terminal row."""
    from PIL import Image

    rgb = image.convert("RGB")
    height = max(2, round(rgb.height * width / max(1, rgb.width)))
    height += height % 2
    small = rgb.resize((width, height), Image.Resampling.BILINEAR)
    px = small.load()
    rows = []
    for y in range(0, height, 2):
        row = Text()
        for x in range(width):
            top, bottom = px[x, y], px[x, y + 1]
            row.append(
                HALF_BLOCK,
                Style(color=f"rgb({top[0]},{top[1]},{top[2]})", bgcolor=f"rgb({bottom[0]},{bottom[1]},{bottom[2]})"),
            )
        rows.append(row)
    return rows


def beside(left: list[Text], right: str, gap: int = 2, right_style: str = "") -> Text:
    """`left`'s rows with `right`'s lines beside them, row by row (the longer one continues alone)."""
    width = max((r.cell_len for r in left), default=0)
    lines = right.split("\n")
    out = Text()
    for i in range(max(len(left), len(lines))):
        row = left[i].copy() if i < len(left) else Text(" " * width)
        row.append(" " * gap)
        if i < len(lines):
            row.append(lines[i], style=right_style)
        out.append_text(row)
        out.append("\n")
    return out
