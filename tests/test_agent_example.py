"""slime's `examples/coding_agent_rl` (its files unchanged) on our own sandbox: with
SLIME_AGENT_SANDBOX_BACKEND=slime its `E2BSandbox(image)` is a session of a real `slime-sandbox`
server, the image a host directory unpacked into the workspace; the example's task layer prepares
the workspace (agent user, PROBLEM_STATEMENT.md) and captures the agent's diff there with git."""

from __future__ import annotations

import asyncio
import importlib
import subprocess

import pytest

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
    from slime.agent.sandbox_backend import SlimeImageSandbox

    assert swe.E2BSandbox is SlimeImageSandbox


def test_the_examples_task_layer_prepares_the_workspace_and_captures_the_diff_in_our_sandbox(swe, image):
    sample = Sample(index=0, prompt="fix add", label="add-1",
                    metadata={"image": image, "workdir": "/tmp/repo", "problem_statement": "add() subtracts"})
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
