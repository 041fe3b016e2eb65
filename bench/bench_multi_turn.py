"""Per-turn orchestration cost of the multi-turn loop vs. re-rendering the whole history.

Both approaches run in one process, interleaved trajectory by trajectory, against the same
zero-latency scripted engine behind the real sglang-router, with the same 32-tool-call
conversations (a calculator call per turn, Qwen3 chat template with tools):
  - delta:    slime's loop (append the sampled ids, render only the tool results' delta);
  - rerender: the same loop, but after each tool turn the whole conversation is re-rendered
              with the chat template and re-tokenised (the O(n^2) approach of slime issue #2285).
"Orchestration cost of turn k" = time spent in the loop between the engine's answer for turn k
and the request for turn k+1, excluding the engine round trip and the tool's own run time.
Reported: the median over trajectories for each turn.

    python -m bench.bench_multi_turn [--turns 32] [--trajectories 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from rollout_plugins.multi_turn import MultiTurnContext, Trajectory  # noqa: E402
from slime.fleet.router import Router  # noqa: E402
from slime.testing.scripted_engine import ScriptedEngine  # noqa: E402
from slime.testing.runtime import bind_runtime  # noqa: E402
from slime.tools.flags import tool_defaults  # noqa: E402
from slime.testing.tiny_model import qwen_tokenizer_dir  # noqa: E402
from slime.utils.types import Sample  # noqa: E402


class RerenderTrajectory(Trajectory):
    """The baseline: after every tool turn, render + tokenise the whole conversation again."""

    def add_tool_turn(self, tool_msgs, model_ids, turn):
        self.messages.extend(tool_msgs)
        ids = self.ctx.delta.encode(self.ctx.delta.render(self.messages, self.schemas, add_generation_prompt=True))
        added = len(ids) - len(self.ids)
        self.ids = ids
        self.mask += [0] * added
        self.logps += [0.0] * added
        return True


def outputs(tok, turns: int) -> list[list[int]]:
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    outs = []
    for t in range(turns + 1):
        if t < turns:
            call = json.dumps({"name": "calculator", "arguments": {"expression": f"{t} * 3 + 1"}})
            text = f"<think>\nStep {t}: I need the value of {t} * 3 + 1.\n</think>\n\n<tool_call>\n{call}\n</tool_call>"
        else:
            text = "<think>\nDone.\n</think>\n\nThe answer is #### 97"
        outs.append(tok.encode(text, add_special_tokens=False) + [im_end])
    return outs


async def run(args, kinds, n: int) -> dict[str, list[list[float]]]:
    ctx = MultiTurnContext.get(args)
    curves: dict[str, list[list[float]]] = {k: [] for k in kinds}
    lengths: dict[str, list[int]] = {}
    finals: dict[str, list[int]] = {}
    for i in range(n):
        for kind, cls in kinds.items():
            s = Sample(
                index=i,
                prompt=[
                    {"role": "system", "content": "You are a math expert."},
                    {"role": "user", "content": "Add up 32 values with the calculator."},
                ],
                metadata={"tools_kwargs": {"calculator": {}}},
            )
            traj = cls(ctx, args, s, {"temperature": 1.0, "max_new_tokens": args.rollout_max_response_len})
            s = await traj.run()
            assert s.status == Sample.Status.COMPLETED, (kind, s.metadata)
            curves[kind].append(s.metadata["turn_overhead_s"])
            finals[kind] = s.tokens
            lengths[kind] = [sp["end"] for sp in s.metadata["turn_spans"] if sp["role"] == "tool"]
        # apples to apples: both approaches must have built the very same token sequence
        assert finals["delta"] == finals["rerender"], "delta and re-render token sequences differ"
    curves["_context"] = [[traj.prompt_len + e for e in lengths["delta"]]]
    return curves


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--turns", type=int, default=32)
    p.add_argument("--trajectories", type=int, default=30)
    cli = p.parse_args()
    from transformers import AutoTokenizer

    model = str(qwen_tokenizer_dir())
    tok = AutoTokenizer.from_pretrained(model)
    outs = outputs(tok, cli.turns)
    im_start = tok.convert_tokens_to_ids("<|im_start|>")

    def script(body):  # turn = assistant prompts so far: system, user, assistant + (tool, assistant) per turn
        return {"output_ids": outs[(body["input_ids"].count(im_start) - 3) // 2], "finish_type": "stop"}

    engine = ScriptedEngine(script, model).start()
    router = Router(log_dir=tempfile.mkdtemp(prefix="bench-mt-")).start()
    try:
        router.add_worker(engine.url)
        args = argparse.Namespace(
            **{
                **tool_defaults(),
                "sglang_router_ip": "127.0.0.1",
                "sglang_router_port": router.port,
                "hf_checkpoint": model,
                "rollout_max_response_len": 100_000,
                "rollout_max_context_len": None,
                "sglang_server_concurrency": 8,
                "request_timeout": 30.0,
                "request_max_retries": 1,
                "max_turns": cli.turns + 1,
                "tool_config_path": str(ROOT / "configs" / "example_tool.yaml"),
            }
        )
        bind_runtime(args, tokenizer=tok)
        curves = asyncio.run(run(args, {"delta": Trajectory, "rerender": RerenderTrajectory}, cli.trajectories))
    finally:
        router.stop()
        engine.stop()

    def med(kind: str, turn: int) -> float:
        return statistics.median(c[turn - 1] for c in curves[kind]) * 1e3

    ctx_len = curves["_context"][0]
    print(
        f"{cli.turns} tool turns per trajectory, {cli.trajectories} trajectories per approach, interleaved; "
        "zero-latency scripted engine behind sglang-router; Qwen3 chat template with tools."
    )
    print(
        "Cost of turn k = loop time between the engine's answer for turn k and the request for turn k+1, "
        "without the engine round trip and the tool's run time (median over trajectories). "
        "Both approaches produced identical token sequences."
    )
    print("| turn | context tokens | delta (slime) ms | re-render ms |")
    print("|---:|---:|---:|---:|")
    shown = sorted({1, 2, 4, 8, 16, 24, cli.turns} & set(range(1, cli.turns + 1)))
    for t in shown:
        print(f"| {t} | {ctx_len[t - 1]} | {med('delta', t):.3f} | {med('rerender', t):.3f} |")
    r_delta, r_re = med("delta", cli.turns) / med("delta", 1), med("rerender", cli.turns) / med("rerender", 1)
    print(f"\nratio turn {cli.turns} / turn 1: delta {r_delta:.2f}x (limit 1.5x), re-render {r_re:.2f}x")
    return 0 if r_delta <= 1.5 else 1


if __name__ == "__main__":
    sys.exit(main())
