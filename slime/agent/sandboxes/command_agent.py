"""`CommandAgent`: any agent command, run once per sample inside a sandbox session (`--agent-command`).

Per sample: a session whose one way out is the gateway, its workspace seeded from the sample
(`workspace.WorkspaceSeed`), the command run there within `--agent-timeout` with the OpenAI and
Anthropic base URLs and API keys of the sample's gateway session (its key, the only credential the
sandbox holds: other sessions' ids, URLs and keys are refused), the workspace copied out, the session closed
whatever happened. Then the reward: the grading command in a FRESH session holding the agent's
workspace, run in the grader's own directory with the sample's `grade_files` (`grading.py`: nothing
in the workspace can shadow them; exit 0: 1.0, else 0.0), as slime's coding example grades a diff
in a clean sandbox. Both sessions hold a `SandboxPool` permit.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import sys
import time
from typing import Any

from slime.agent.sandboxes.grading import GRADER_DIR, grader_env, install_grader
from slime.agent.gateway.protocols.common import flatten_content
from slime.agent.sandboxes.sandbox import Sandbox
from slime.agent.sandboxes.sandbox_pool import EGRESS, SandboxPool
from slime.agent.sandboxes.workspace import WorkspaceError, WorkspaceSeed, download, upload
from slime.utils.types import Sample

WORKDIR = "/tmp/work"  # the workspace inside a session (the session's tmpfs)
OUTPUT_TAIL = 2000  # characters of the agent's and grader's output kept in the sample's metadata
EXEC_GRACE = 30.0  # seconds past a command's own time limit before the host gives up on the session


@dataclasses.dataclass(frozen=True)
class CommandAgentConfig:
    command: str
    timeout: float = 1800.0
    grade_command: str | None = None  # for samples without metadata.grade_command
    grade_timeout: float = 600.0

    @classmethod
    def of(cls, config: Any) -> CommandAgentConfig:
        """From the agent flags (`slime.agent.flags.AgentConfig`)."""
        return cls(
            command=config.agent_command.replace("{python}", sys.executable),
            timeout=float(config.agent_timeout),
            grade_command=config.agent_grade_command,
            grade_timeout=float(config.agent_grade_timeout),
        )


@dataclasses.dataclass(frozen=True)
class AgentOutcome:
    """What an agent run gave: its reward (None: none, the reward model scores), what went wrong
    with the agent (`error`: its turns still train) and, when the sample cannot be scored at all,
    why (`failure`, a short reason: the sample fails)."""

    reward: float | None = None
    error: str | None = None
    failure: str | None = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


def prompt_text(prompt: Any) -> str:
    """The task text of a sample's prompt: the string, or the last user message of a chat."""
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt or [] if isinstance(m, dict) and m.get("role") == "user"]
    return flatten_content(users[-1].get("content")) if users else ""


class CommandAgent:
    def __init__(self, config: CommandAgentConfig, pool: SandboxPool) -> None:
        self.config, self.pool = config, pool

    async def run(self, sample: Sample, *, session_key: str, base_path: str) -> AgentOutcome:
        """Run the command for `sample`; `session_key` is its gateway session's key and `base_path`
        that session's gateway path (`/s/<key>`), all the sandbox is given to reach the gateway."""
        try:
            seed = WorkspaceSeed.from_metadata(sample.metadata, f"sample index={sample.index}")
            tarball = await asyncio.to_thread(seed.tarball)
        except WorkspaceError as e:  # (a git checkout can fail at run time; preflight checked the fields)
            return AgentOutcome(error=str(e), failure="agent_bad_workspace")
        t0 = time.monotonic()
        try:
            exit_code, output, workspace = await self._run_agent(sample, tarball, session_key, base_path)
        except Exception as e:  # noqa: BLE001 - no workspace to grade: the sample fails, the reason is kept
            return AgentOutcome(error=f"{type(e).__name__}: {e}", failure="agent_sandbox_error")
        meta = {
            "agent_exit_code": exit_code,
            "agent_output": output[-OUTPUT_TAIL:],
            "agent_seconds": round(time.monotonic() - t0, 3),
        }
        error = None if exit_code == 0 else f"--agent-command exited with {exit_code}"
        command = seed.grade_command or self.config.grade_command
        if command is None:
            return AgentOutcome(error=error, metadata=meta)
        try:
            solved, grade_output = await self.grade(workspace, seed, command)
        except Exception as e:  # noqa: BLE001 - an ungraded sample must not get an invented reward
            return AgentOutcome(
                error=f"grading: {type(e).__name__}: {e}", failure="agent_grading_failed", metadata=meta
            )
        meta.update(grading_solved=solved, grade_output=grade_output[-OUTPUT_TAIL:])
        return AgentOutcome(reward=1.0 if solved else 0.0, error=error, metadata=meta)

    async def _run_agent(
        self, sample: Sample, tarball: bytes, session_key: str, base_path: str
    ) -> tuple[int, str, bytes]:
        async with self.pool.session(egress=EGRESS) as sb:
            await sb.exec(f"mkdir -p {WORKDIR}", check=True, timeout=30)
            await upload(sb, WORKDIR, tarball)
            gateway = sb.egress_url + base_path
            env = {
                "OPENAI_BASE_URL": f"{gateway}/v1",
                "OPENAI_API_KEY": session_key,
                "ANTHROPIC_BASE_URL": gateway,
                "ANTHROPIC_API_KEY": session_key,
                "SLIME_AGENT_PROMPT": prompt_text(sample.prompt),
                "HOME": "/home/agent",
            }
            code, output = await run_command(sb, self.config.command, env=env, timeout=self.config.timeout)
            return code, output, await download(sb, WORKDIR)

    async def grade(self, workspace: bytes, seed: WorkspaceSeed, command: str) -> tuple[bool, str]:
        """Run `command` in a fresh session holding `workspace`, from the grader's own directory
        holding `seed.grade_files` (see `grading.py`)."""
        async with self.pool.session(egress=None) as sb:
            await sb.exec(f"mkdir -p {WORKDIR}", check=True, timeout=30)
            await upload(sb, WORKDIR, workspace)
            await install_grader(sb, seed.grade_files, WORKDIR)
            code, output = await run_command(
                sb, command, env=grader_env(WORKDIR), timeout=self.config.grade_timeout, cwd=GRADER_DIR
            )
        return code == 0, output


async def run_command(
    sb: Sandbox, command: str, *, env: dict[str, str], timeout: float, cwd: str = WORKDIR
) -> tuple[int, str]:
    """`command` in `cwd` (the workspace) within `timeout` seconds: (exit code, stdout + stderr)."""
    res = await asyncio.wait_for(
        sb.exec(f"cd {cwd} && {command}", env=env, timeout=max(1, math.ceil(timeout))), timeout + EXEC_GRACE
    )
    return res.returncode, res.stdout + res.stderr
