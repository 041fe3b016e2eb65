"""A multi-turn rollout whose tool calls run in the local sandbox.

The engine is the scripted SGLang-protocol engine behind the real sglang-router (a tiny random
model cannot be made to emit a tool call), the rollout is `rollout_plugins.multi_turn.generate`,
the tool is `SandboxFusionTool` loaded from the shipped YAML shape with `sandbox_fusion_url: local`,
and the code really runs in `slime-sandbox`.
"""

from __future__ import annotations

import argparse
import json
import re
import textwrap

import pytest
import requests

pytest.importorskip("rollout_plugins.multi_turn")

from rollout_plugins.multi_turn import generate  # noqa: E402
from slime.testing.runtime import bind_runtime  # noqa: E402
from slime.tools.services import ToolServices  # noqa: E402
from slime.tools.flags import tool_defaults  # noqa: E402
from slime.rollout.runtime import close_tool_sets  # noqa: E402
from slime.utils.types import Sample  # noqa: E402

IM_END = 151645
TURNS = [
    "<think>\nadd them up\n</think>\n\n<tool_call>\n"
    + json.dumps({"name": "code_interpreter", "arguments": {"code": "print(sum(range(10)))"}})
    + "\n</tool_call>",
    "<tool_call>\n"
    + json.dumps({"name": "code_interpreter", "arguments": {"code": "print('so far')\n1/0"}})
    + "\n</tool_call>",
    "<tool_call>\n"
    + json.dumps(
        {
            "name": "code_interpreter",
            "arguments": {"code": "import os\nprint(os.environ.get('SLIME_MT_SECRET', 'no-secret'))"},
        }
    )
    + "\n</tool_call>",
    "The answer is #### 45",
]

YAML = """
tools:
  - class_name: slime.tools.sandbox_fusion_tool.SandboxFusionTool
    config: {type: native, sandbox_fusion_url: local, enable_global_rate_limit: false, rate_limit: 4,
             default_timeout: 10}
    tool_schema:
      type: function
      function:
        name: code_interpreter
        description: Run Python code.
        parameters: {type: object, properties: {code: {type: string}}, required: [code]}
"""


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    from slime.testing.tiny_model import qwen_tokenizer_dir

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))


@pytest.fixture(scope="module")
def stack(tok, tmp_path_factory):
    from slime.fleet.router import Router
    from slime.testing.scripted_engine import ScriptedEngine
    from slime.sandbox.server import start_local_sandbox
    from tests.test_sandbox import ISOLATED
    from slime.testing.tiny_model import qwen_tokenizer_dir

    seen: list[str] = []

    def script(body: dict) -> dict:
        text = tok.decode(body["input_ids"], skip_special_tokens=False)
        seen.append(text)
        turn = text.count("<|im_start|>assistant") - 1
        ids = tok.encode(TURNS[turn], add_special_tokens=False) + [IM_END]
        return {"output_ids": ids, "finish_type": "stop", "log_probs": [-0.1] * len(ids)}

    url, sandbox = start_local_sandbox(max_concurrency=2, allow_no_isolation=not ISOLATED)
    mp = pytest.MonkeyPatch()
    mp.setenv("SLIME_MT_SECRET", "should-not-leak")
    model_dir = str(qwen_tokenizer_dir())
    engine = ScriptedEngine(script, model_dir).start()
    router = Router(log_dir=str(tmp_path_factory.mktemp("router"))).start()
    router.add_worker(engine.url)
    cfg = tmp_path_factory.mktemp("cfg") / "tools.yaml"
    cfg.write_text(textwrap.dedent(YAML))
    yield {"router": router, "engine": engine, "config": str(cfg), "model": model_dir, "sandbox": url, "seen": seen}
    router.stop()
    engine.stop()
    sandbox.stop()
    mp.undo()


async def test_multi_turn_rollout_runs_code_in_the_sandbox(stack, tok, runtime_closed_on_the_test_loop):
    args = argparse.Namespace(
        **{
            **tool_defaults(),
            "sglang_router_ip": "127.0.0.1",
            "sglang_router_port": stack["router"].port,
            "hf_checkpoint": stack["model"],
            "rollout_max_response_len": 2048,
            "rollout_max_context_len": None,
            "sglang_server_concurrency": 8,
            "request_timeout": 60.0,
            "request_max_retries": 0,
            "tool_config_path": stack["config"],
            "rm_type": "gsm8k",
            "custom_rm_path": None,
            "group_rm": False,
        }
    )
    bind_runtime(args, tokenizer=tok, tool_services=ToolServices(sandbox_url=stack["sandbox"]))  # the manager's
    sample = Sample(index=0, prompt=[{"role": "user", "content": "What is 0+1+...+9? Use code."}], label="45")
    try:
        sample = await generate(
            args,
            sample,
            {
                "temperature": 1.0,
                "top_p": 1.0,
                "top_k": -1,
                "max_new_tokens": 512,
                "skip_special_tokens": False,
                "no_stop_trim": True,
            },
        )
    finally:
        await close_tool_sets()  # the sandbox tool's HTTP session lives on this test's loop
    md = sample.metadata
    assert sample.status == Sample.Status.COMPLETED, md
    assert md["tool_calls"] == {"code_interpreter": 3} and md["tool_errors"] == [], {
        k: v for k, v in md.items() if k != "messages"
    }
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", sample.response, re.S)
    assert responses[0].strip() == "45"  # exactly what was printed
    assert responses[1].startswith("Runtime error (exit code 1).") and "so far" in responses[1]
    assert "ZeroDivisionError" in responses[1]
    assert responses[2].strip() == "no-secret"  # runs get a clean environment
    # the model's next turn was conditioned on the sandbox output, with the tool tokens masked out
    assert "<tool_response>\n45\n" in stack["seen"][1]
    assert 0 in sample.loss_mask and sample.loss_mask[-1] == 1
    st = requests.get(stack["sandbox"] + "/v1/stats").json()
    assert st["total"] == 3 and st["running"] == 0
