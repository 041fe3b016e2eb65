"""A VLM sample's pictures in the rollout dump and the viewer: each distinct picture is written once beside
the dump (images/, named by content), the line names it, and the viewer draws it as terminal cells with
the answer beside it (row by row), from a dump read from any working directory."""

from __future__ import annotations

import argparse
import json

from slime.observability import viewer_data as V
from slime.observability.flags import ReportConfig
from slime.observability.rollout_dump import dump_rollout
from slime.utils.plugin_args import completed
from slime.utils.types import Sample


def picture(color: str):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (64, 64), "white")
    ImageDraw.Draw(img).rectangle((8, 8, 56, 56), fill=color)
    return img


def test_the_dump_keeps_each_picture_once_and_the_viewer_shows_it_beside_the_answer(tmp_path, monkeypatch):
    from slime.utils.images import encode_png_data_uri

    red, blue = picture("red"), picture("blue")
    samples = [
        Sample(
            index=i,
            prompt="What is drawn?",
            response=answer,
            tokens=[1, 2, 3],
            response_length=1,
            loss_mask=[1],
            reward=0.5,
            status=Sample.Status.COMPLETED,
            multimodal_inputs={"images": [img], "videos": None},
        )
        for i, (img, answer) in enumerate(
            [(red, "a red square"), (encode_png_data_uri(red), "red"), (blue, "blue\nsquare")]
        )
    ]
    samples.append(Sample(index=3, prompt="text only", response="ok", status=Sample.Status.COMPLETED))
    config = ReportConfig.from_args(completed(argparse.Namespace(rollout_data_dir=str(tmp_path / "dump"))))
    path = dump_rollout(config, 0, samples)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["images"] == lines[1]["images"] != lines[2]["images"]  # a PIL image and its data URI: one file
    assert lines[3]["images"] == []
    assert sorted(p.name for p in (tmp_path / "dump" / "images").iterdir()) == sorted(
        n.split("/")[1] for n in {lines[0]["images"][0], lines[2]["images"][0]}
    )
    monkeypatch.chdir(tmp_path)  # the viewer finds the pictures relative to the dump, not the working directory
    records = V.load(V.discover(str(tmp_path / "dump"))[0]).records
    shown = V.render_sample(records[2])
    rows = shown.plain.split("\n")
    first = next(i for i, r in enumerate(rows) if r.startswith("▀"))
    assert rows[first].endswith("  blue") and rows[first + 1].endswith("  square")  # the answer beside the picture
    colors = {
        tuple(span.style.color.triplet)
        for span in shown.spans
        if getattr(span.style, "color", None) and span.style.color.triplet is not None
    }
    assert (0, 0, 255) in colors and (255, 255, 255) in colors  # the blue square on white, drawn as cells
    assert "image(s)" not in V.render_sample(records[3]).plain
