"""A vision-language model served by the embedded engine through SGLang's `image_data`.

The tiny random Qwen2-VL (built offline from a config, `slime.testing.tiny_model.build_tiny_vlm`) runs in
a real engine process. Checked: the images reach the model (another image, other log-probs); the answer's
log-probs are the teacher-forced forward's over the processor's expanded prompt (so every decode step sits
at its M-RoPE position after the image); a prompt with one placeholder per image and one already expanded
give the same answer; an image request decoding beside a text one answers as alone; bad images are 400s
naming `image_data` and the image.
"""

from __future__ import annotations

import base64
import io

import httpx
import pytest
import torch

from tests.hf_engine_fixtures import run_engine

QUESTION = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is drawn?"}]}]


def drawing(color: str, size: tuple[int, int] = (80, 60)):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, "white")
    ImageDraw.Draw(img).line((0, 0, *size), fill=color, width=5)
    ImageDraw.Draw(img).ellipse((10, 10, 40, 40), outline=color, width=3)
    return img


def data_uri(img) -> str:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def vlm(tiny_vlm_dir):
    from slime.utils.processing_utils import load_processor
    from slime.utils.vision_model import load_hf_model

    return load_hf_model(tiny_vlm_dir, torch.float32).eval(), load_processor(tiny_vlm_dir)


@pytest.fixture(scope="module")
def engine(tiny_vlm_dir, engine_fork_server):
    # forked from the session's fork server (torch and transformers imported; it loads the VLM itself)
    with run_engine(tiny_vlm_dir, "--max-batch-size", "8", fork_server=engine_fork_server) as url:
        with httpx.Client(base_url=url, timeout=120) as client:
            yield client


def prompt_ids(processor) -> list[int]:
    text = processor.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    return processor.tokenizer(text, add_special_tokens=False)["input_ids"]


def generate(engine, ids, images, n=6, **extra) -> dict:
    body = {
        "input_ids": ids,
        "image_data": images,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
        **extra,
    }
    r = engine.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def teacher_forced(vlm, ids: list[int], image, output: list[int]) -> tuple[list[int], list[float]]:
    """(the processor's expanded prompt, the log-probs of `output` after it) from one forward of the model."""
    from slime.utils.processing_utils import build_processor_kwargs
    from slime.utils.vision_model import vision_forward_kwargs

    model, processor = vlm
    text = processor.tokenizer.decode(ids)
    enc = processor(text=text, **build_processor_kwargs({"images": [image]}))
    prompt = list(enc["input_ids"][0])
    full = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(input_ids=full, **vision_forward_kwargs(model, full, enc)).logits[0, len(prompt) - 1 : -1]
    lp = torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(output)[:, None])[:, 0]
    return prompt, lp.tolist()


def test_the_tiny_vlm_is_built_offline_and_its_image_tower_is_wired(tiny_vlm_dir, vlm):
    from slime.utils.processing_utils import build_processor_kwargs
    from slime.utils.vision_model import is_vision_model, vision_forward_kwargs

    model, processor = vlm
    assert is_vision_model(model) and processor is not None and processor.image_processor is not None
    assert sum(p.numel() for p in model.model.visual.parameters()) < 100_000  # a tiny tower, seconds to run
    text = processor.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    last = []
    for color in ("red", "blue"):
        enc = processor(text=text, **build_processor_kwargs({"images": [drawing(color)]}))
        ids = torch.tensor(enc["input_ids"])
        assert int((ids == model.config.image_token_id).sum()) == 6  # 80x60 px -> a 4x6 patch grid -> 6 tokens
        with torch.no_grad():
            last.append(model(input_ids=ids, **vision_forward_kwargs(model, ids, enc)).logits[0, -1])
    assert not torch.allclose(last[0], last[1])  # the picture changes what the model says next


def test_image_data_answers_as_the_teacher_forced_forward_over_the_expanded_prompt(engine, vlm):
    ids = prompt_ids(vlm[1])
    image = drawing("red")
    out = generate(engine, ids, [data_uri(image)])
    output = out["output_ids"]
    expanded, reference = teacher_forced(vlm, ids, image, output)
    assert out["meta_info"]["prompt_tokens"] == len(expanded) == len(ids) + 5  # 1 placeholder -> 6 image tokens
    engine_lp = [e[0] for e in out["meta_info"]["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(engine_lp, reference)) < 1e-4
    # the rollout's form: the prompt already expanded (its sample keeps exactly these ids) answers the same
    again = generate(engine, expanded, [data_uri(image)])
    assert again["output_ids"] == output and again["meta_info"]["prompt_tokens"] == len(expanded)
    # another picture, another answer distribution: the engine looks at the image
    other = generate(engine, ids, [data_uri(drawing("blue"))])
    assert [e[0] for e in other["meta_info"]["output_token_logprobs"]] != engine_lp


def test_an_image_request_decoding_beside_text_requests_answers_as_alone(engine, vlm, tmp_path):
    import concurrent.futures

    ids = prompt_ids(vlm[1])
    path = tmp_path / "green.png"
    drawing("green", (100, 90)).save(path)  # a file path, as SGLang also takes
    alone = generate(engine, ids, [str(path)], n=8)
    text_alone = generate(engine, [100, 200, 300, 400], None, n=8)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = [
            pool.submit(generate, engine, ids, [str(path)], 8),
            pool.submit(generate, engine, [100, 200, 300, 400], None, 8),
            pool.submit(generate, engine, ids, [str(path)], 8),
        ]
        results = [f.result() for f in futures]
    for got, want in zip(results, (alone, text_alone, alone)):
        assert got["output_ids"] == want["output_ids"]
        got_lp = [e[0] for e in got["meta_info"]["output_token_logprobs"]]
        want_lp = [e[0] for e in want["meta_info"]["output_token_logprobs"]]
        assert max(abs(a - b) for a, b in zip(got_lp, want_lp)) < 1e-4


@pytest.mark.parametrize(
    "images, ids_of, words",
    [
        (["http://example.com/a.png"], "placeholder", "image_data[0]: 'http://example.com/a.png' is a URL"),
        (["/no/such/picture.png"], "placeholder", "image_data[0]: image file not found: /no/such/picture.png"),
        (["data:image/png;base64,bm90IGFuIGltYWdl"], "placeholder", "image_data[0]: the data URI is not an image"),
        ([7], "placeholder", "image_data[0]: an image must be"),
        ("two", "placeholder", "image_data: 2 image(s) but the prompt has 1 image placeholder(s)"),
        ("one", "text only", "image_data: 1 image(s) but the prompt has 0 image placeholder(s)"),
        ("one", "three pads", "image_data[0]: the image fills 6 tokens but its placeholder is 3 tokens"),
    ],
)
def test_bad_image_data_is_a_400_naming_the_image(engine, vlm, images, ids_of, words):
    ids = prompt_ids(vlm[1])
    pad = vlm[0].config.image_token_id
    ids = {
        "placeholder": ids,
        "text only": [100, 200],
        "three pads": [t for i in ids for t in ([i] * 3 if i == pad else [i])],
    }[ids_of]
    red = data_uri(drawing("red"))
    images = {"two": [red, red], "one": [red]}.get(images, images) if isinstance(images, str) else images
    r = engine.post(
        "/generate", json={"input_ids": ids, "image_data": images, "sampling_params": {"max_new_tokens": 2}}
    )
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]
