"""Issue 29, rewards an agent cannot game: `CommandAgent` grades in a fresh sandbox session from the
grader's own directory, so a workspace cannot shadow the grader's test module (a planted
`test_<name>/` package), the test runner (a planted `unittest/` package) or pytest (a planted
`conftest.py`, or a plugin the workspace registers by an entry point, that passes every test): unfixed code scores 0, fixed code still 1. And copy-out has
no size cap below the sandbox's own disk limit: a 10 MB workspace is copied out and graded."""

from __future__ import annotations

import asyncio
import sys

import pytest

from slime.agent.sandboxes.workspace import WorkspaceSeed, pack
from slime.utils.types import Sample
from tests.test_sandbox import ISOLATED

pytestmark = pytest.mark.skipif(not ISOLATED, reason="the sandbox needs namespaces/uid switching")

BUGGY, FIXED = "def add(a, b):\n    return a - b\n", "def add(a, b):\n    return a + b\n"
UNITTEST = (
    "import unittest\n\nfrom add import add\n\n\nclass TestAdd(unittest.TestCase):\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
PYTEST = "from add import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
PASS_EVERYTHING = """import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    report.outcome, report.longrepr = "passed", None
"""
PLANTS = {
    "a test_<name> package shadowing the grader's test module": (
        {"test_add/__init__.py": "", "test_add.py": UNITTEST.replace("5", "-1")},
        {"test_add.py": UNITTEST},
        "{python} -m unittest -q test_add",
    ),
    "a unittest package shadowing the test runner": (
        {"unittest/__init__.py": "", "unittest/__main__.py": "raise SystemExit(0)\n"},
        {"test_add.py": UNITTEST},
        'cd "$SLIME_WORKSPACE" && {python} -m unittest -q test_add',
    ),
    "a pytest plugin registered by an entry point of the workspace": (
        {
            "evil_plugin.py": PASS_EVERYTHING,
            "evil_plugin-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: evil-plugin\nVersion: 1.0\n",
            "evil_plugin-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evil_plugin\n",
        },
        {"test_add.py": PYTEST},
        'cd "$SLIME_WORKSPACE" && {python} -m pytest -q -p no:randomly -p no:cacheprovider '
        '"$SLIME_GRADER_DIR/test_add.py"',
    ),
    "a conftest.py that passes every test": (
        {"conftest.py": PASS_EVERYTHING, "pytest.ini": "[pytest]\naddopts = -p no:randomly\n"},
        {"test_add.py": PYTEST},
        "{python} -m pytest -q -p no:randomly -p no:cacheprovider test_add.py",
    ),
}


@pytest.fixture(scope="module")
def pool():
    from slime.agent.sandboxes.sandbox_pool import SandboxPool
    from slime.agent.sandboxes.sandbox_slime import SlimeSandbox
    from slime.sandbox.server import start_local_sandbox

    ro = sorted({sys.prefix, sys.base_prefix})
    egress = ["--egress", "gateway=127.0.0.1:9"]  # (the agent's session needs one; nothing listens there)
    url, handle = start_local_sandbox(max_concurrency=2, extra_args=egress + [a for p in ro for a in ("--ro-bind", p)])
    yield SandboxPool(lambda egress: SlimeSandbox(url, egress=egress), concurrency=2, cluster_wide=False)
    handle.stop()


def grade(pool, workspace: dict[str, str], grade_files: dict[str, str], command: str) -> tuple[bool, str]:
    from slime.agent.sandboxes.command_agent import CommandAgent, CommandAgentConfig

    agent = CommandAgent(CommandAgentConfig(command="true"), pool)
    seed = WorkspaceSeed(grade_files=grade_files)
    return asyncio.run(agent.grade(pack(workspace), seed, command.format(python=sys.executable)))


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_a_planted_package_cannot_make_unfixed_code_pass_and_fixed_code_still_passes(pool, plant):
    planted, grade_files, command = PLANTS[plant]
    unfixed, out = grade(pool, {"add.py": BUGGY, **planted}, grade_files, command)
    assert not unfixed, f"unfixed code passed with {plant}:\n{out}"
    fixed, out = grade(pool, {"add.py": FIXED, **planted}, grade_files, command)
    assert fixed, f"fixed code failed with {plant}:\n{out}"


def test_the_workspace_is_importable_after_the_standard_library_and_named_by_slime_workspace(pool):
    probe = (
        "import json, os, sys, add\n"
        "print(json.__file__.startswith(sys.base_prefix),"
        " add.__file__ == os.environ['SLIME_WORKSPACE'] + '/add.py',"
        " os.getcwd() == os.environ['SLIME_GRADER_DIR'])\n"
    )
    solved, out = grade(
        pool, {"add.py": FIXED, "json.py": "raise SystemExit(0)\n"}, {"probe.py": probe}, "{python} probe.py"
    )
    assert solved and out.strip() == "True True True", out


def test_a_10_mb_workspace_is_copied_out_and_graded(pool):
    from slime.agent.sandboxes.command_agent import CommandAgent, CommandAgentConfig

    make = "head -c 10000000 /dev/urandom > big.bin && sha256sum big.bin > big.sha256"
    agent = CommandAgent(
        CommandAgentConfig(command=make, timeout=120, grade_command='cd "$SLIME_WORKSPACE" && sha256sum -c big.sha256'),
        pool,
    )
    outcome = asyncio.run(
        agent.run(Sample(index=0, prompt="p", metadata={"files": {"seed.txt": "s"}}), session_key="k", base_path="/s/k")
    )
    assert (outcome.reward, outcome.failure, outcome.error) == (1.0, None, None), outcome
    assert "big.bin: OK" in outcome.metadata["grade_output"]
