"""A tool that returns an image, in the multi-turn tool loop on a vision-language checkpoint (verl's tool
contract: `ToolResponse.image`; slime's geo3k_vlm_multi_turn does it; THUDM/slime#1847 is the bug where the
model never sees it).

The engine is scripted (a random tiny VLM would never call the tool) but speaks SGLang's protocol behind
the real router, with the tiny Qwen2-VL's tokenizer and processor. Checked on what the engine received:
the first turn's `image_data` holds the prompt's picture, the second turn's the prompt's and the tool's,
its ids continue the first turn's (prompt, sampled ids, then the tool turn with the tool's image expanded
to its token count), and the embedded engine's own image path (`ImageInputs`) accepts them as they are.
The Sample trains each sampled id once, masks every image token 0 and carries both images' pixels.
"""

from __future__ import annotations

import argparse
import json

import pytest

from rollout_plugins.multi_turn import generate
from slime.testing.runtime import bind_runtime
from slime.tools.base_tool import BaseTool
from slime.tools.flags import tool_defaults
from slime.tools.schemas import ToolResponse
from slime.utils.images import open_image
from slime.utils.types import Sample
from tests.conftest import native_tools_yaml

pytestmark = pytest.mark.usefixtures("runtime_closed_on_the_test_loop")


def picture(color: str, size=(84, 56)):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, "white")
    ImageDraw.Draw(img).ellipse((6, 6, size[0] - 6, size[1] - 6), outline=color, width=4)
    return img


ZOOMED = picture("purple", (112, 112))


class ZoomTool(BaseTool):
    """Answers with a picture and a line of text, as a crop/zoom tool of a VLM agent does."""

    async def execute(self, instance_id, parameters, **kw):
        return ToolResponse(text="here is the zoomed view", image=[ZOOMED]), 0.0, {}


@pytest.fixture
def stack(tiny_vlm_dir, tmp_path):
    from transformers import AutoTokenizer

    from slime.fleet.router import Router
    from slime.testing.scripted_engine import ScriptedEngine

    tok = AutoTokenizer.from_pretrained(str(tiny_vlm_dir))
    end = tok.convert_tokens_to_ids("<|im_end|>")
    call = '<tool_call>\n{"name": "zoom", "arguments": {}}\n</tool_call>'
    replies = [
        tok.encode(call, add_special_tokens=False) + [end],
        tok.encode("A circle.", add_special_tokens=False) + [end],
    ]

    def script(body: dict) -> dict:
        turn = tok.decode(body["input_ids"]).count("<|im_start|>assistant") - 1
        ids = replies[turn]
        return {"output_ids": ids, "finish_type": "stop", "log_probs": [-0.1 * (turn + 1)] * len(ids)}

    engine = ScriptedEngine(script, str(tiny_vlm_dir)).start()
    router = Router(log_dir=str(tmp_path / "router")).start()
    router.add_worker(engine.url)
    config = tmp_path / "tools.yaml"
    config.write_text(
        native_tools_yaml(
            (f"{__name__}.ZoomTool", "zoom", "zoom into the picture", {"type": "object", "properties": {}})
        )
    )
    args = argparse.Namespace(
        **{
            **tool_defaults(),
            "sglang_router_ip": "127.0.0.1",
            "sglang_router_port": router.port,
            "hf_checkpoint": str(tiny_vlm_dir),
            "rollout_max_response_len": 512,
            "rollout_max_context_len": None,
            "sglang_server_concurrency": 8,
            "request_timeout": 30.0,
            "request_max_retries": 0,
            "tool_config_path": str(config),
            "rm_type": None,
            "custom_rm_path": None,
            "group_rm": False,
        }
    )
    bind_runtime(args, tokenizer=tok)
    yield args, engine, tok
    router.stop()
    engine.stop()


def same_pixels(uri: str, img) -> bool:
    return open_image(uri).tobytes() == img.tobytes()


async def test_a_tool_image_is_in_the_next_turn_prompt_and_image_data(stack, tiny_vlm_dir):
    from slime.engine.image_inputs import ImageInputs
    from slime.utils.processing_utils import load_processor

    args, engine, tok = stack
    red = picture("red")
    sample = Sample(
        index=0,
        prompt=[
            {
                "role": "user",
                "content": [{"type": "image", "image": red}, {"type": "text", "text": "Zoom in, then say what it is."}],
            }
        ],
        multimodal_inputs={"images": [red], "videos": None},
    )
    params = {"temperature": 1.0, "max_new_tokens": 512, "skip_special_tokens": False, "no_stop_trim": True}
    out = await generate(args, sample, params)
    first, second = engine.requests
    # the engine sees the prompt's picture, then the prompt's and the tool's, in placeholder order
    assert len(first["image_data"]) == 1 and same_pixels(first["image_data"][0], red)
    assert len(second["image_data"]) == 2 and same_pixels(second["image_data"][1], ZOOMED)
    processor = load_processor(tiny_vlm_dir)
    pad = processor.image_token_id
    engine_side = ImageInputs(processor, pad)  # the embedded engine's own check of ids against images
    for body in (first, second):
        ids, pixels = engine_side.prepare(body["input_ids"], body["image_data"])
        assert ids == body["input_ids"]  # already expanded: the ids the sample trains are the ids the engine ran
    sampled = [json.loads(json.dumps(r)) for r in (first, second)]
    assert second["input_ids"][: len(first["input_ids"])] == first["input_ids"]
    turn1 = tok.encode('<tool_call>\n{"name": "zoom", "arguments": {}}\n</tool_call>', add_special_tokens=False)
    assert second["input_ids"][len(first["input_ids"]) : len(first["input_ids"]) + len(turn1)] == turn1
    assert out.status == Sample.Status.COMPLETED, out.metadata
    # the sample: both prompts' tokens, each sampled id trained once, image tokens masked 0, both images' pixels
    assert out.tokens[: len(second["input_ids"])] == sampled[1]["input_ids"]
    p = len(first["input_ids"])
    assert out.response_length == len(out.tokens) - p
    trained = [t for t, m in zip(out.tokens[p:], out.loss_mask) if m]
    assert trained == turn1 + [tok.convert_tokens_to_ids("<|im_end|>")] + tok.encode(
        "A circle.", add_special_tokens=False
    ) + [tok.convert_tokens_to_ids("<|im_end|>")]
    assert out.tokens.count(pad) == pixels["pixel_values"].shape[0] // 4  # both images, merge size 2
    assert all(m == 0 for t, m in zip(out.tokens[p:], out.loss_mask) if t == pad)
    assert out.multimodal_train_inputs["image_grid_thw"].shape[0] == 2
    assert out.multimodal_train_inputs["pixel_values"].shape[0] == int(
        out.multimodal_train_inputs["image_grid_thw"].prod(-1).sum()
    )
    assert "not shown" not in tok.decode(second["input_ids"])
    assert out.metadata["template_drift"] is False  # re-rendered with one placeholder per image, equal
