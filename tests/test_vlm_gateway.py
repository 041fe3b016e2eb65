"""The agent gateway takes images: OpenAI `image_url` parts and Anthropic `image` blocks, sent by the real
`openai` and `anthropic` SDKs to the gateway in front of the embedded engine serving the tiny Qwen2-VL.

Checked on what the engine received (`image_data`, one PNG per image of the conversation, every turn) and
on the session's Sample: its tokens are exactly the prompts the engine ran (each image's placeholder at
its full token count) and the sampled ids (each trained once), the image tokens are masked 0, and
`multimodal_train_inputs` holds the pixels of exactly those image tokens. Refused with a 400 naming the
block, in the API's error format: an http URL (nothing is downloaded), an unreadable image, a `document`
block, and any image for a gateway whose model reads text only.
"""

from __future__ import annotations

import asyncio
import base64
import io

import anthropic
import httpx
import openai
import pytest

from slime.agent.gateway.server import Gateway
from slime.testing.agent_stack import RecordingClient, assert_chain
from slime.utils.endpoints import Endpoints
from slime.utils.images import open_image
from slime.utils.prompt_images import PromptImages
from slime.utils.types import Sample
from tests.hf_engine_fixtures import run_engine


def drawing(color: str, size=(84, 56)):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, "white")
    ImageDraw.Draw(img).rectangle((8, 8, size[0] - 8, size[1] - 8), outline=color, width=4)
    return img


def b64_png(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def stack(tiny_vlm_dir, engine_fork_server):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_vlm_dir))
    # warm (the session's fork server has torch imported); the bound is for a loaded shared box
    with run_engine(tiny_vlm_dir, startup_timeout=300, fork_server=engine_fork_server) as url:
        yield tok, url, PromptImages.of_checkpoint(tiny_vlm_dir)


@pytest.fixture
def gateway(stack):
    tok, url, images = stack
    client = RecordingClient(Endpoints(url, [url]), tokenizer=tok, request_timeout=120.0)
    gw = Gateway(client, tokenizer=tok, images=images).start()
    yield gw, client, tok, images
    gw.stop()


def same_pixels(received: str, img) -> bool:
    return open_image(received).tobytes() == img.convert("RGB").tobytes()


def check_sample(sample: Sample, client: RecordingClient, images: PromptImages, pictures: list) -> None:
    """Token-exact over the engine's turns; image tokens masked 0 and matched by the train inputs."""
    assert_chain(sample, [(p, out.token_ids, out.log_probs) for p, out in client.answers])
    pad = images.image_token_id
    grid = sample.multimodal_train_inputs["image_grid_thw"]
    assert grid.shape[0] == len(pictures) == len(sample.multimodal_inputs["images"])
    per_image = [int(t * h * w) // images.merge_size**2 for t, h, w in grid.tolist()]
    assert sample.tokens.count(pad) == sum(per_image)
    assert sample.multimodal_train_inputs["pixel_values"].shape[0] == int(grid.prod(-1).sum())
    p = len(sample.tokens) - sample.response_length
    assert all(m == 0 for t, m in zip(sample.tokens[p:], sample.loss_mask) if t == pad)
    assert any(sample.loss_mask)  # the answers are trained
    for uri, img in zip(sample.multimodal_inputs["images"], pictures):
        assert same_pixels(uri, img)


def test_openai_sdk_image_parts_reach_the_engine_and_the_sample(gateway, tmp_path):
    gw, client, tok, images = gateway
    red, blue = drawing("red"), drawing("blue", (112, 84))
    blue.save(tmp_path / "blue.png")
    msgs = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is drawn?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64_png(red), "detail": "low"}},
            ],
        }
    ]
    gw.open_session("oa")
    with openai.OpenAI(base_url=gw.base_url("oa"), api_key="x", max_retries=0) as sdk:
        r1 = sdk.chat.completions.create(model="m", messages=msgs, max_tokens=5, temperature=0.0)
        msgs += [
            {"role": "assistant", "content": r1.choices[0].message.content},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": f"file://{tmp_path}/blue.png"}},
                    {"type": "text", "text": "And this one?"},
                ],
            },
        ]
        r2 = sdk.chat.completions.create(model="m", messages=msgs, max_tokens=5, temperature=0.0)
        with pytest.raises(openai.BadRequestError) as refused:  # a URL: never downloaded
            sdk.chat.completions.create(
                model="m",
                max_tokens=5,
                messages=[
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
                    }
                ],
            )
    samples = asyncio.run(gw.finish_session("oa", base_sample=Sample(index=0, prompt=""), reward=1.0))
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == "messages[0].content[0].image_url.url"
    assert "is a URL; images are not downloaded" in refused.value.body["message"]
    # the engine got the conversation's images each turn, in order, and ran the expanded prompts
    assert [len(d) for d in client.image_data] == [1, 2]
    assert same_pixels(client.image_data[1][0], red) and same_pixels(client.image_data[1][1], blue)
    first, second = (p for p, _ in client.answers)
    assert second[: len(first)] == first  # the second turn extends the first: one chain, images expanded once
    assert r2.usage.prompt_tokens == len(second)
    [sample] = samples
    check_sample(sample, client, images, [red, blue])


def test_anthropic_sdk_image_blocks_reach_the_engine_and_the_sample(gateway, stack):
    gw, client, tok, images = gateway
    green = drawing("green")
    gw.open_session("an")
    with anthropic.Anthropic(base_url=gw.base_url("an", api="anthropic"), api_key="x", max_retries=0) as sdk:
        msg = sdk.messages.create(
            model="m",
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": b64_png(green)},
                        },
                        {"type": "text", "text": "Which color is the frame?"},
                    ],
                }
            ],
        )
        with pytest.raises(anthropic.BadRequestError) as doc:
            sdk.messages.create(
                model="m",
                max_tokens=5,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "x"}}
                        ],
                    }
                ],
            )
        with pytest.raises(anthropic.BadRequestError) as broken:
            sdk.messages.create(
                model="m",
                max_tokens=5,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": base64.b64encode(b"not a picture" * 8).decode(),
                                },
                            }
                        ],
                    }
                ],
            )
    samples = asyncio.run(gw.finish_session("an", base_sample=Sample(index=0, prompt=""), reward=1.0))
    assert msg.usage.input_tokens == len(client.answers[0][0])
    assert len(client.image_data) == 1 and same_pixels(client.image_data[0][0], green)
    [sample] = samples
    check_sample(sample, client, images, [green])
    assert doc.value.body["type"] == "error"
    assert "messages[0].content[0]: a 'document' block" in doc.value.body["error"]["message"]
    assert "image 0 of the conversation" in broken.value.body["error"]["message"]
    text_only_gateway_refuses_images(stack)


def text_only_gateway_refuses_images(stack):
    """The same blocks for a gateway whose model reads text only: 400s naming the block, nothing sent."""
    tok, url, _ = stack
    client = RecordingClient(Endpoints(url, [url]), tokenizer=tok, request_timeout=120.0)
    gw = Gateway(client, tokenizer=tok).start()  # no image side: a text-only model
    try:
        key = gw.open_session("txt")
        uri = "data:image/png;base64," + b64_png(drawing("red"))
        r = httpx.post(
            f"{gw.url}/v1/messages",
            headers={"x-api-key": key},
            json={
                "model": "m",
                "max_tokens": 4,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "hi"},
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": uri[22:]},
                            },
                        ],
                    }
                ],
            },
        )
        o = httpx.post(
            f"{gw.url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}}]}],
            },
        )
    finally:
        gw.stop()
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert r.json()["error"]["message"].startswith(
        "messages[0].content[1]: a 'image' block: this gateway's model reads text only"
    )
    assert o.status_code == 400 and o.json()["error"]["param"] == "messages[0].content[0]"
    assert client.answers == []  # nothing reached the engine


def test_image_blocks_become_template_image_parts_in_each_protocol():
    """Pure translation (no server): where each API's image lands in the chat-template messages."""
    from slime.agent.gateway.errors import FieldError
    from slime.agent.gateway.protocols import anthropic as an, openai_chat as oc, openai_responses as orr

    uri = "data:image/png;base64," + b64_png(drawing("red"))
    chat = oc.parse_request(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a"},
                        {"type": "text", "text": "b"},
                        {"type": "image_url", "image_url": {"url": uri}},
                    ],
                }
            ]
        },
        {},
        "s",
        vision=True,
    )
    assert chat.messages == [
        {"role": "user", "content": [{"type": "text", "text": "a\nb"}, {"type": "image", "image": uri}]}
    ]
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": uri[22:]}}
    msgs = an.parse_request(
        {
            "max_tokens": 4,
            "messages": [
                {"role": "user", "content": "look"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": [block]},
                        {"type": "text", "text": "and"},
                        block,
                    ],
                },
            ],
        },
        {},
        "s",
        vision=True,
    ).messages
    assert msgs[2:] == [
        {"role": "tool", "content": [{"type": "image", "image": uri}]},
        {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "image", "image": uri}]},
    ]
    resp = orr.parse_request(
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": uri}, {"type": "input_text", "text": "what?"}],
                }
            ]
        },
        {},
        "s",
        vision=True,
    )
    assert resp.messages == [
        {"role": "user", "content": [{"type": "image", "image": uri}, {"type": "text", "text": "what?"}]}
    ]
    with pytest.raises(FieldError) as err:  # a file id: nothing here serves uploads
        orr.parse_request(
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, {}, "s", vision=True
        )
    assert err.value.param == "input[0].content[0].file_id"
    with pytest.raises(FieldError) as err:  # the same body for a text-only model
        an.parse_request({"max_tokens": 4, "messages": [{"role": "user", "content": [block]}]}, {}, "s")
    assert err.value.param == "messages[0].content[0]" and "reads text only" in str(err.value)
