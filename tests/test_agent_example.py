"""slime's `examples/coding_agent_rl` (its files unchanged) on our own sandbox: with
SLIME_AGENT_SANDBOX_BACKEND=slime its `E2BSandbox(image)` is a session of a real `slime-sandbox`
server, the image a host directory unpacked into the workspace; the example's task layer prepares
the workspace (agent user, PROBLEM_STATEMENT.md), captures the agent's diff there with git and
grades it in a fresh session (the patch goes to the session's writable /workspace). Its `generate()`
runs Codex and Claude Code there, each through the session's one egress to the example's own adapter."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import subprocess

import pytest

from slime.testing.agent_stack import assert_chain
from slime.utils.types import Sample


@pytest.fixture(scope="module")
def sandbox_url():
    from slime.sandbox.server import start_local_sandbox

    url, handle = start_local_sandbox(max_concurrency=2)
    yield url
    handle.stop()


@pytest.fixture
def swe(sandbox_url, monkeypatch):
    monkeypatch.setenv("SLIME_AGENT_SANDBOX_BACKEND", "slime")
    monkeypatch.setenv("SLIME_AGENT_SANDBOX_URL", sandbox_url)
    monkeypatch.setenv("SLIME_AGENT_SANDBOX_EGRESS", "")  # this server has no egress to offer
    import examples.coding_agent_rl.swe as module

    yield importlib.reload(module)  # its `E2BSandbox` is bound at import, from the backend variable
    monkeypatch.delenv("SLIME_AGENT_SANDBOX_BACKEND")
    importlib.reload(module)


@pytest.fixture
def image(tmp_path):
    """An "image": a host directory holding a git repository with a bug."""
    repo = tmp_path / "image" / "repo"
    repo.mkdir(parents=True)
    (repo / "add.py").write_text("def add(a, b):\n    return a - b\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "add.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "base"], check=True)
    return str(tmp_path / "image")


def test_the_example_names_our_sandbox_when_the_backend_variable_says_so(swe):
    from slime.agent.sandboxes.sandbox_backend import SlimeImageSandbox

    assert swe.E2BSandbox is SlimeImageSandbox


def test_our_sandbox_holds_the_agent_to_its_end_on_every_python(tmp_path):
    """`exec_and_wait` runs the agent through `exec_to_end` only on a `RunsToEnd` backend; a detached
    spawn dies with its exec in our sandbox. Python 3.12 checks protocols statically, so an
    `exec_to_end` reached only through `__getattr__` would not count."""
    from slime.agent.sandboxes.sandbox import RunsToEnd
    from slime.agent.sandboxes.sandbox_backend import SlimeBackendSettings, SlimeImageSandbox

    sb = SlimeImageSandbox(str(tmp_path), settings=SlimeBackendSettings(url="http://127.0.0.1:9"))
    assert isinstance(sb, RunsToEnd)


def test_the_examples_task_layer_prepares_the_workspace_and_captures_the_diff_in_our_sandbox(swe, image):
    sample = Sample(
        index=0,
        prompt="fix add",
        label="add-1",
        metadata={"image": image, "workdir": "/tmp/repo", "problem_statement": "add() subtracts"},
    )
    md = swe.get_metadata(sample)

    async def run():
        async with swe.E2BSandbox(md["image"]) as sb:
            await swe.prepare_workspace(sb, md["workdir"], md)
            statement = await sb.read_file("/tmp/repo/PROBLEM_STATEMENT.md")
            await sb.exec("cd /tmp/repo && sed -i 's/a - b/a + b/' add.py", check=True)  # what an agent would do
            return statement, await swe.git_diff(sb, md["workdir"])

    statement, diff = asyncio.run(run())
    assert statement == "add() subtracts"
    assert diff.splitlines()[-2:] == ["-    return a - b", "+    return a + b"]
    assert "PROBLEM_STATEMENT" not in diff


def image_with(tmp_path, name: str, body: str) -> str:
    repo = tmp_path / name / "repo"
    repo.mkdir(parents=True)
    (repo / "add.py").write_text(f"def add(a, b):\n    return {body}\n")
    (repo / "test_add.py").write_text(TEST_ADD)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "b"], check=True
    )
    return str(tmp_path / name)


TEST_ADD = (
    "import unittest\nfrom add import add\n\n\nclass T(unittest.TestCase):\n    def test(self):\n"
    "        self.assertEqual(add(2, 3), 5)\n"
)


def test_the_examples_grader_applies_a_real_patch_in_a_fresh_session_of_our_sandbox(swe, tmp_path):
    """The diff an agent made in one session is graded by the example's own `run_evaluation` in a
    fresh one: it writes /workspace/__cagent_patch__.diff, applies it with git and runs `eval_cmd`."""

    def md(image: str) -> dict:
        return swe.get_metadata(
            Sample(
                index=0,
                prompt="fix add",
                label="add-1",
                metadata={"image": image, "workdir": "/tmp/repo", "eval_cmd": "python3 -m unittest -q test_add"},
            )
        )

    buggy, fixed = md(image_with(tmp_path, "bug", "a - b")), md(image_with(tmp_path, "ok", "a + b"))

    async def run():
        async with swe.E2BSandbox(buggy["image"]) as sb:
            await swe.prepare_workspace(sb, buggy["workdir"], buggy)
            await sb.exec("cd /tmp/repo && sed -i 's/a - b/a + b/' add.py", check=True)  # what an agent would do
            diff = await swe.git_diff(sb, buggy["workdir"])
        return diff, await asyncio.gather(
            swe.run_evaluation(buggy, diff_text=diff, timeout_sec=60),
            swe.run_evaluation(buggy, diff_text="", timeout_sec=60),
            swe.run_evaluation(fixed, diff_text=diff, timeout_sec=60),
        )

    diff, (patched, unpatched, not_applying) = asyncio.run(run())
    assert diff.splitlines()[-2:] == ["-    return a - b", "+    return a + b"]
    assert (patched, unpatched, not_applying) == ((1.0, True), (0.0, True), (0.0, False))


FIX_CMD = "sed -i 's/a - b/a + b/' add.py"


def tool_call(name: str, arguments: dict) -> str:
    """A tool call in Qwen's format (`--tool-call-parser hermes`)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def codex_replies(case: str, turn: int) -> str:
    """Codex's `exec_command` tool runs the fix of `a - b`, then "Done." (Codex's prompt is the
    example's, the same for every sample: the image decides what the command changes)."""
    return tool_call("exec_command", {"cmd": FIX_CMD}) if turn == 0 else "Done."


def claude_replies(case: str, turn: int) -> str:
    """The same for Claude Code, through its `Bash` tool."""
    return tool_call("Bash", {"command": FIX_CMD, "description": "Fix add"}) if turn == 0 else "Done."


def run_the_example(tmp_path, monkeypatch, agent: str, replies, agent_env: dict[str, str], sandbox_args: list[str]):
    """slime's `generate()` unchanged, with `SWE_AGENT=agent`, on two samples (images whose bug is
    `a - b` and `a * b`), the agent CLI (from the npm registry, bound read-only into the sandbox, its
    `node_modules/.bin` on the session's PATH) in a session whose one egress is the example's own
    adapter, on scripted engines behind the real router. Returns the two samples, the diffs the example
    graded by instance, and the /generate bodies the engines got with what they sampled for each."""
    from transformers import AutoTokenizer

    from slime.sandbox.server import start_local_sandbox
    from slime.testing.agent_clis import CLI_CACHE
    from slime.testing.agent_stack import AgentStack
    from slime.testing.tiny_model import qwen_tokenizer_dir
    from slime.utils.misc import find_free_port

    tok = AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir()))
    stack = AgentStack(tok, qwen_tokenizer_dir(), replies, log_dir=str(tmp_path / "router")).start()
    port = find_free_port()  # the adapter's, on the host, and the egress's, inside: one URL for both
    url, sandbox = start_local_sandbox(
        max_concurrency=4,
        extra_args=[
            "--egress",
            f"gateway=127.0.0.1:{port}",
            "--egress-port",
            str(port),
            "--ro-bind",
            str(CLI_CACHE),
            *sandbox_args,
        ],
    )
    for key, value in {
        "SWE_AGENT": agent,
        "ADAPTER_PORT": str(port),
        "ADAPTER_PUBLIC_HOST": "127.0.0.1",
        "ADAPTER_BIND_HOST": "127.0.0.1",
        "SWE_AGENT_TIME_BUDGET_SEC": "180",
        "SWE_EVAL_TIMEOUT_SEC": "60",
        "SLIME_AGENT_SANDBOX_BACKEND": "slime",
        "SLIME_AGENT_SANDBOX_URL": url,
        "SLIME_AGENT_SANDBOX_ENV": json.dumps({"PATH": f"{CLI_CACHE}/node_modules/.bin:/usr/bin:/bin"}),
        **agent_env,
    }.items():
        monkeypatch.setenv(key, value)
    import examples.coding_agent_rl.generate as generate
    import examples.coding_agent_rl.swe as swe

    importlib.reload(swe)
    example = importlib.reload(generate)  # its config and backend are read at import
    graded = {}  # instance id -> the diff the example graded
    evaluate = swe.run_evaluation

    async def spy(md, *, diff_text, timeout_sec):
        graded[md["instance_id"]] = diff_text
        return await evaluate(md, diff_text=diff_text, timeout_sec=timeout_sec)

    monkeypatch.setattr(swe, "run_evaluation", spy)
    args = argparse.Namespace(
        hf_checkpoint=str(qwen_tokenizer_dir()),
        rollout_max_context_len=0,
        sglang_tool_call_parser="hermes",
        sglang_reasoning_parser=None,
        sglang_router_ip="127.0.0.1",
        sglang_router_port=stack.router.port,
    )

    def sample(index: int, name: str, body: str) -> Sample:
        return Sample(
            index=index,
            group_index=0,
            prompt="fix add",
            label=name,
            metadata={
                "image": image_with(tmp_path, name, body),
                "workdir": "/tmp/repo",
                "eval_cmd": "python3 -m unittest -q test_add",
                "problem_statement": "add() must add",
            },
        )

    async def both():
        return await asyncio.gather(
            example.generate(args, sample(0, "minus", "a - b"), {}),
            example.generate(args, sample(1, "times", "a * b"), {}),
        )

    try:
        [fixed], [unfixed] = asyncio.run(both())
        return fixed, unfixed, graded, [(b, stack.answer(b)) for b in stack.requests]
    finally:
        example._AdapterService(args).app_handle.stop()
        type(example._AdapterService).clear_instances(example._AdapterService)
        sandbox.stop()
        stack.stop()
        importlib.reload(swe)


def assert_graded_and_token_exact(fixed: Sample, unfixed: Sample, graded: dict[str, str], sampled: list) -> None:
    """The engine's tool call made the agent run `sed 's/a - b/a + b/'`: on the image whose bug is
    `a - b` the diff is applied and graded by `eval_cmd` in a fresh session (1.0); on the one whose
    bug is `a * b` it changes nothing (0.0). Each sample is its two turns, exactly as sampled."""
    assert [
        (s.status, s.reward, s.metadata["agent_exit_code"], s.metadata["grading_solved"]) for s in (fixed, unfixed)
    ] == [(Sample.Status.COMPLETED, 1.0, 0, True), (Sample.Status.COMPLETED, 0.0, 0, False)]
    assert graded["minus"].splitlines()[-2:] == ["-    return a - b", "+    return a + b"]
    assert graded["times"] == ""
    assert len(sampled) == 4, "per sample: the tool call, then the answer after its output"
    for s in (fixed, unfixed):  # exactly what the engines sampled, turn by turn
        turns = {
            tuple(b["input_ids"]): (b["input_ids"], a["output_ids"], a["log_probs"])
            for b, a in sampled
            if s.tokens[: len(b["input_ids"])] == b["input_ids"]
        }  # (both samples' first turn: one prompt)
        assert len(turns) == 2
        assert_chain(s, sorted(turns.values(), key=lambda t: len(t[0])))


@pytest.mark.slow
def test_the_examples_generate_runs_codex_in_our_sandbox_and_grades_its_patch_in_a_fresh_one(tmp_path, monkeypatch):
    """`SWE_AGENT=codex`: Codex 0.169 speaks the Responses API, and runs with its own sandbox off
    (ours is the sandbox; its own is read-only by default and would refuse the edit)."""
    from slime.testing.agent_clis import CODEX, npm_installed

    npm_installed(CODEX, "@openai/codex/bin/codex.js")
    assert_graded_and_token_exact(
        *run_the_example(
            tmp_path,
            monkeypatch,
            "codex",
            codex_replies,
            {
                "SLIME_AGENT_CODEX_WIRE_API": "responses",
                "SLIME_AGENT_CODEX_EXTRA_ARGS": "--dangerously-bypass-approvals-and-sandbox",
            },
            [],
        )
    )


@pytest.mark.slow
def test_the_examples_generate_runs_claude_code_in_our_sandbox_and_grades_its_patch_in_a_fresh_one(
    tmp_path, monkeypatch
):
    """`SWE_AGENT=claude_code`: Claude Code (its native binary, found on the session's PATH) opens
    with a ~12k-token prompt, which scripted engines take whole; its `Bash` tool runs the fix."""
    from slime.testing.agent_clis import CLAUDE_CODE, npm_installed

    npm_installed(CLAUDE_CODE, "@anthropic-ai/claude-code-linux-x64/claude")
    fixed, unfixed, graded, sampled = run_the_example(
        tmp_path,
        monkeypatch,
        "claude_code",
        claude_replies,
        {},
        ["--default-memory-mb", "4096", "--max-processes", "512"],
    )
    assert_graded_and_token_exact(fixed, unfixed, graded, sampled)
    assert min(len(b["input_ids"]) for b, _ in sampled) > 8192, "Claude Code's opening prompt is ~12k tokens"
