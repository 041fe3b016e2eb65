"""What images cost the rollout side (CPU time of this process; no engine, the model's time is not ours).

1. Per-turn cost of a multi-turn VLM conversation through the agent gateway's prompt path (`TurnPipeline.
   prompt_ids`: template delta, image reading and processing, placeholder expansion): every turn adds one
   tool image; turn 16 against turn 1. Each image is processed once per session (`Session.images`); the
   "reprocessed" column clears that cache before each turn, as a path that re-reads every image would.
2. The default generate's prompt work per sample (`multimodal_prompt`: processor, PNG data URIs, the
   `/generate` JSON) with one 112x112 image against the same prompt as text (tokenise, JSON).

`python -m bench.bench_vlm_rollout [--turns 16] [--samples 200]` (builds the tiny VLM under outputs/bench/).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace


def picture(i: int, size=(112, 112)):
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, "white")
    ImageDraw.Draw(img).ellipse(
        (8 + i % 20, 8, size[0] - 8, size[1] - 8 - i % 20), outline=(i * 37 % 255, 0, 90), width=3
    )
    return img


def cpu() -> float:
    return time.thread_time()


def per_turn(model: Path, turns: int, repeats: int) -> dict[str, list[float]]:
    from transformers import AutoTokenizer

    from slime.agent.gateway.images import ConversationImages
    from slime.agent.gateway.pipeline import TurnPipeline
    from slime.agent.gateway.records import ChatRequest
    from slime.agent.gateway.rendering import DeltaRender
    from slime.agent.gateway.session import SessionTable
    from slime.agent.gateway.trajectory import TrajectoryManager
    from slime.utils.images import encode_png_data_uri
    from slime.utils.prompt_images import PromptImages

    tok = AutoTokenizer.from_pretrained(str(model))
    images = PromptImages.of_checkpoint(model)
    uris = [encode_png_data_uri(picture(i)) for i in range(turns + 1)]
    answer = tok.encode(
        'Let me look closer.<tool_call>\n{"name": "zoom", "arguments": {}}\n</tool_call>', add_special_tokens=False
    ) + [tok.convert_tokens_to_ids("<|im_end|>")]
    out: dict[str, list[float]] = {"cached": [0.0] * turns, "reprocessed": [0.0] * turns, "tokens": [0] * turns}
    for mode in ("cached", "reprocessed"):
        for r in range(repeats):
            sessions = SessionTable()
            render = DeltaRender(tok, kept_prompts=0)
            pipe = TurnPipeline(
                tokenizer=tok,
                renderer=render,
                generate=None,
                manager=TrajectoryManager(),
                sessions=sessions,
                images=ConversationImages(images),
            )
            session = sessions.open(f"s{r}")
            messages = [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": uris[0]},
                        {"type": "text", "text": "What is drawn? Zoom in."},
                    ],
                }
            ]
            for turn in range(turns):
                if mode == "reprocessed":
                    session.images.clear()
                request = ChatRequest(session_id=session.sid, messages=messages)
                t0 = cpu()
                ids = pipe.prompt_ids(session, request)
                out[mode][turn] += (cpu() - t0) / repeats
                out["tokens"][turn] = len(ids)
                reply = {"role": "assistant", "content": tok.decode(answer[:-1])}
                render.remember(session, messages, None, ids, reply, answer)
                messages = messages + [
                    reply,
                    {
                        "role": "tool",
                        "content": [
                            {"type": "image", "image": uris[turn + 1]},
                            {"type": "text", "text": f"zoomed view {turn}"},
                        ],
                    },
                ]
    return out


def per_sample(model: Path, samples: int) -> dict[str, float]:
    from slime.rollout.multimodal_prompt import multimodal_prompt
    from slime.utils.processing_utils import load_processor, load_tokenizer
    from slime.utils.types import Sample

    tok, processor = load_tokenizer(model), load_processor(model)
    runtime = SimpleNamespace(tokenizer=tok, shared=lambda key, build: processor)
    text = tok.apply_chat_template(
        [
            {
                "role": "user",
                "content": [{"type": "image"}, {"type": "text", "text": "What shape is drawn? Answer in one word."}],
            }
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    plain = text.replace("<|vision_start|><|image_pad|><|vision_end|>", "")
    params = {"max_new_tokens": 64, "temperature": 1.0}
    t0 = cpu()
    for i in range(samples):
        s = Sample(index=i, prompt=text, multimodal_inputs={"images": [picture(i)], "videos": None})
        ids, image_data = multimodal_prompt(s, runtime)
        json.dumps({"input_ids": ids, "image_data": image_data, "sampling_params": params})
    with_images = (cpu() - t0) / samples
    t0 = cpu()
    for i in range(samples):
        ids = tok(plain, add_special_tokens=False)["input_ids"]
        json.dumps({"input_ids": ids, "sampling_params": params})
    text_only = (cpu() - t0) / samples
    return {"images": with_images, "text": text_only}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--samples", type=int, default=200)
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from slime.testing.tiny_model import build_tiny_vlm

    model = build_tiny_vlm(Path("outputs/bench/tiny-vlm"))
    load = os.getloadavg()[0]
    turns = per_turn(model, a.turns, a.repeats)
    print(
        f"multi-turn VLM prompt path (gateway, one new 112x112 image per turn, {a.repeats} sessions each; "
        f"load {load:.1f}): CPU ms per turn"
    )
    print(f"{'turn':>5} {'tokens':>7} {'cached':>9} {'reprocessed':>12}")
    for t in range(a.turns):
        print(
            f"{t + 1:>5} {turns['tokens'][t]:>7} {turns['cached'][t] * 1e3:>9.2f} {turns['reprocessed'][t] * 1e3:>12.2f}"
        )
    last, first = turns["cached"][-1], turns["cached"][0]
    print(
        f"turn {a.turns} / turn 1: cached {last / first:.2f}x, reprocessed "
        f"{turns['reprocessed'][-1] / turns['reprocessed'][0]:.2f}x"
    )
    sample = per_sample(model, a.samples)
    print(
        f"default generate prompt work per sample ({a.samples} samples; load {os.getloadavg()[0]:.1f}): "
        f"one 112x112 image {sample['images'] * 1e3:.2f} ms CPU, text only {sample['text'] * 1e3:.2f} ms CPU "
        f"({sample['images'] / sample['text']:.1f}x)"
    )


if __name__ == "__main__":
    main()
