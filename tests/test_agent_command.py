"""`--agent-command` end to end at small size: the demo's ReAct agent (`configs/agent_demo/react_agent.py`,
the `openai` SDK) runs in a real sandbox session whose one way out is the real gateway, in front of
a scripted engine behind the real sglang-router; a fresh session grades the agent's workspace.
The recorded trajectory is exactly what the engine sampled (mask 1, its log-probs), every tool and
template delta masked 0, and the reward is the grader's exit status."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from pathlib import Path

import pytest

from slime.agent.gateway.server import GatewayConfig
from slime.testing.agent_stack import AgentStack, assert_chain
from slime.utils.types import Sample

DEMO = Path(__file__).resolve().parent.parent / "configs" / "agent_demo"
FIXED = "def add(a, b):\n    return a + b\n"
REPLIES = {
    "fix": [
        "<tool_call>\n"
        + json.dumps({"name": "write_file", "arguments": {"path": "add.py", "content": FIXED}})
        + "\n</tool_call>",
        '<tool_call>\n{"name": "run_tests", "arguments": {}}\n</tool_call>',
        "Fixed.",
    ],
    "idle": ["I cannot fix it."],
}


def replies(case: str, turn: int) -> str:
    script = REPLIES[case]
    return script[min(turn, len(script) - 1)]


def demo_task(label: str) -> dict:
    rows = [json.loads(line) for line in (DEMO / "tasks.jsonl").read_text().splitlines()]
    return next(r for r in rows if r["label"] == label)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = AgentStack.started_on_tiny_qwen(
        replies, config=GatewayConfig(max_context_tokens=4096), log_dir=str(tmp_path_factory.mktemp("router"))
    )
    yield s
    s.stop()


@pytest.fixture
def runtime(stack):
    from slime.agent.flags import agent_defaults
    from slime.rollout.runtime import unbind
    from slime.testing.runtime import bind_runtime
    from slime.tools.flags import tool_defaults

    args = argparse.Namespace(
        **{
            **agent_defaults(),
            **tool_defaults(),
            "sglang_router_ip": "127.0.0.1",
            "sglang_router_port": stack.router.port,
            "hf_checkpoint": stack.model_dir,
            "sglang_server_concurrency": 16,
            "rollout_max_context_len": 4096,
            "request_timeout": 30.0,
            "request_max_retries": 0,
            "agent_sandbox_concurrency": 2,
            "agent_command": f"{{python}} {DEMO / 'react_agent.py'} --max-turns 4",
            "agent_sandbox_ro_path": [str(DEMO)],
            "agent_timeout": 120.0,
            "agent_grade_timeout": 60.0,
        }
    )
    rt = bind_runtime(args, tokenizer=stack.tok, engine_urls=[e.url for e in stack.engines])
    yield rt
    rt.close_shared()
    unbind(rt)


def sample_of(case: str, index: int) -> Sample:
    task = demo_task("add")
    return Sample(index=index, group_index=0, prompt=f"case={case} {task['prompt']}", metadata=task["metadata"])


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_demo_agent_fixes_a_task_in_the_sandbox_and_the_grader_rewards_it(stack, runtime):
    from slime.agent.rollout import COMMAND_AGENT_KEY, GATEWAY_KEY, generate

    async def both():
        return await asyncio.gather(
            generate(runtime.args, sample_of("fix", 0), {"max_new_tokens": 256}),
            generate(runtime.args, sample_of("idle", 1), {"max_new_tokens": 256}),
        )

    [fixed], [idle] = asyncio.run(both())
    assert (fixed.reward, fixed.metadata["grading_solved"], fixed.metadata["agent_exit_code"]) == (1.0, True, 0)
    assert (idle.reward, idle.metadata["grading_solved"], idle.metadata["agent_exit_code"]) == (0.0, False, 0)
    assert "turn 2: finish=stop tool_calls=0" in fixed.metadata["agent_output"]
    assert "FAILED (failures=1)" in idle.metadata["grade_output"], "the bug is still there"
    for sample, case, turns in ((fixed, "fix", 3), (idle, "idle", 1)):
        bodies = stack.requests_of(case)
        assert len(bodies) == turns
        answers = [stack.answer(b) for b in bodies]
        assert_chain(sample, [(b["input_ids"], a["output_ids"], a["log_probs"]) for b, a in zip(bodies, answers)])
    gateway_port = runtime.shared(GATEWAY_KEY, lambda: None).port
    runtime.close_shared()
    assert refused(gateway_port), "closing the runtime stops its gateway"
    assert runtime.shared(COMMAND_AGENT_KEY, lambda: None) is not None


def test_closing_the_runtime_runs_what_plugins_registered_newest_first_even_past_a_failure():
    from slime.rollout.runtime import RolloutRuntime

    rt = RolloutRuntime(args=None, client=None)
    done = []

    def broken():
        done.append("broken")
        raise RuntimeError("stuck server")

    for closer in (lambda: done.append("gateway"), broken, lambda: done.append("sandbox")):
        rt.on_close(closer)
    rt.close_shared()
    rt.close_shared()  # closers run once
    assert done == ["sandbox", "broken", "gateway"]


def test_an_agent_past_its_time_limit_is_stopped_graded_and_every_session_closed():
    import urllib.request

    from slime.agent.sandboxes.command_agent import CommandAgent, CommandAgentConfig
    from slime.agent.sandboxes.sandbox_pool import SandboxPool
    from slime.agent.sandboxes.sandbox_slime import SlimeSandbox
    from slime.sandbox.server import start_local_sandbox

    url, server = start_local_sandbox(max_concurrency=2, extra_args=["--egress", "gateway=127.0.0.1:9"])
    try:
        pool = SandboxPool(lambda egress: SlimeSandbox(url, egress=egress), concurrency=2, cluster_wide=False)
        grade = 'cd "$SLIME_WORKSPACE" && test -f edited.txt && test -f seed.txt'  # (grading runs in its own dir)
        agent = CommandAgent(
            CommandAgentConfig(command="echo started; touch edited.txt; sleep 60", timeout=2, grade_command=grade), pool
        )
        sample = Sample(index=0, prompt="p", metadata={"files": {"seed.txt": "s"}})
        outcome = asyncio.run(agent.run(sample, session_key="k", base_path="/s/k"))
        with urllib.request.urlopen(url + "/sessions") as r:
            table = json.load(r)
    finally:
        server.stop()
    assert outcome.error == "--agent-command exited with 124"
    assert (outcome.reward, outcome.failure, outcome.metadata["agent_exit_code"]) == (1.0, None, 124)
    assert outcome.metadata["agent_output"].startswith("started\n")
    assert (table["sessions"], table["opened"]) == ([], 2), "the agent's and the grader's session, both closed"


def test_a_sandbox_that_cannot_be_reached_fails_the_sample_without_a_reward():
    from slime.agent.sandboxes.command_agent import CommandAgent, CommandAgentConfig
    from slime.agent.sandboxes.sandbox_pool import SandboxPool
    from slime.agent.sandboxes.sandbox_slime import SlimeSandbox

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens there
    pool = SandboxPool(lambda egress: SlimeSandbox(dead, egress=egress), concurrency=1, cluster_wide=False)
    agent = CommandAgent(CommandAgentConfig(command="true", grade_command="true"), pool)
    outcome = asyncio.run(agent.run(Sample(index=0, prompt="p"), session_key="k", base_path="/s/k"))
    assert (outcome.reward, outcome.failure) == (None, "agent_sandbox_error")
    assert outcome.error.startswith("ClientConnectorError: Cannot connect to host 127.0.0.1")


def test_the_pool_holds_a_permit_for_each_sessions_whole_life():
    from slime.agent.sandboxes.sandbox_pool import SandboxPool

    events: list[str] = []

    class Recorder:
        def __init__(self, egress):
            self.egress = egress

        async def __aenter__(self):
            events.append(f"open {self.egress}")
            return self

        async def __aexit__(self, *exc):
            events.append(f"close {self.egress}")

    pool = SandboxPool(Recorder, concurrency=1, cluster_wide=False)

    async def use(egress, gate: asyncio.Event | None, opened: asyncio.Event | None):
        async with pool.session(egress=egress):
            if opened:
                opened.set()
            if gate:
                await gate.wait()

    async def main():
        gate, opened = asyncio.Event(), asyncio.Event()
        first = asyncio.create_task(use("a", gate, opened))
        await opened.wait()
        second = asyncio.create_task(use("b", None, None))
        await asyncio.sleep(0)  # the second asks for its permit while the first holds the only one
        assert events == ["open a"]
        gate.set()
        await asyncio.gather(first, second)

    asyncio.run(main())
    assert events == ["open a", "close a", "open b", "close b"]
    with pytest.raises(ValueError, match="--agent-sandbox-concurrency must be >= 1, got 0"):
        SandboxPool(Recorder, concurrency=0, cluster_wide=False)


def test_a_git_seed_that_cannot_be_checked_out_fails_the_sample_naming_the_repository(tmp_path):
    from slime.agent.sandboxes.command_agent import CommandAgent, CommandAgentConfig
    from slime.agent.sandboxes.sandbox_pool import SandboxPool

    def no_sandbox(egress):
        raise AssertionError("no session is opened for a workspace that cannot be seeded")

    agent = CommandAgent(CommandAgentConfig(command="true"), SandboxPool(no_sandbox, concurrency=1, cluster_wide=False))
    sample = Sample(index=3, prompt="p", metadata={"git": {"repo": str(tmp_path / "missing")}})
    outcome = asyncio.run(agent.run(sample, session_key="k", base_path="/s/k"))
    assert (outcome.reward, outcome.failure) == (None, "agent_bad_workspace")
    assert outcome.error.startswith(f"metadata.git: `git clone --quiet --no-checkout {tmp_path / 'missing'}")
