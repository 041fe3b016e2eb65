"""A harness: one agent CLI's lifecycle in a sandbox -- install it, write its config, run it to
completion against the gateway. The task (workspace, grading) is the caller's.

`BaseHarness.run` creates the agent user, writes the config and launches; a CLI harness supplies
`install_cli`, `write_config` and `launch_and_wait`, usually through `install_npm_cli` and
`run_agent`. Harnesses are plain instances holding only their `HarnessConfig`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import lzma
import os
import shutil
import tempfile
from abc import ABC, abstractmethod
from pathlib import Path

from slime.agent.sandboxes import sandbox as _sandbox
from slime.agent.sandboxes.sandbox import Sandbox, exec_and_wait

NPM_INSTALL_RETRIES = 3  # transient npm failures (exit 217, disk flakes) are retried in place
NPM_INSTALL_BACKOFF_SEC = 2.0


@dataclasses.dataclass(frozen=True)
class HarnessContext:
    """What one run needs, free of task fields. `session_id` is the session's key, the one
    credential the CLI is given (its API key): with the gateway a minted secret, with slime's
    adapters the sid they were opened with. `model_label` is only what the CLI is told: the
    gateway serves whatever the engines hold."""

    workdir: str
    session_id: str
    adapter_url: str
    model_label: str = "slime-actor"


@dataclasses.dataclass(frozen=True)
class HarnessConfig:
    """Host tarballs to install from, extra CLI arguments / environment for the launch, and the
    wire API a CLI with a choice (Codex) speaks (None: the harness's own default)."""

    node_tarball: Path | None = None
    cli_tarball: Path | None = None
    extra_args: str = ""
    extra_env: dict[str, str] = dataclasses.field(default_factory=dict)
    wire_api: str | None = None

    @classmethod
    def from_env(cls, cli: str) -> HarnessConfig:
        """slime's variables: SLIME_AGENT_NODE_TARBALL, SLIME_AGENT_<CLI>_TARBALL, _EXTRA_ARGS, _EXTRA_ENVS;
        ours: SLIME_AGENT_<CLI>_WIRE_API."""

        def path(name: str) -> Path | None:
            return Path(os.environ[name]) if os.environ.get(name) else None

        extra_env = os.environ.get(f"SLIME_AGENT_{cli}_EXTRA_ENVS", "").strip()
        return cls(
            node_tarball=path("SLIME_AGENT_NODE_TARBALL"),
            cli_tarball=path(f"SLIME_AGENT_{cli}_TARBALL"),
            extra_args=os.environ.get(f"SLIME_AGENT_{cli}_EXTRA_ARGS", "").strip(),
            extra_env=json.loads(extra_env) if extra_env else {},
            wire_api=os.environ.get(f"SLIME_AGENT_{cli}_WIRE_API", "").strip() or None,
        )


class BaseHarness(ABC):
    name = ""
    env_prefix = ""  # the <CLI> of HarnessConfig.from_env

    def __init__(self, config: HarnessConfig | None = None) -> None:
        self.config = config if config is not None else HarnessConfig.from_env(self.env_prefix)

    @abstractmethod
    async def install_cli(self, sb: Sandbox) -> None: ...

    @abstractmethod
    async def write_config(self, sb: Sandbox, ctx: HarnessContext) -> None: ...

    @abstractmethod
    async def launch_and_wait(self, sb: Sandbox, ctx: HarnessContext, prompt: str, time_budget_sec: int) -> int:
        """Run the agent to completion; its exit code (EXIT_TIME_BUDGET_EXCEEDED when out of time)."""

    async def run(
        self, sb: Sandbox, *, workdir: str, session_id: str, adapter_url: str, time_budget_sec: int, prompt: str
    ) -> int:
        """Agent user, then config, then launch. The workspace must be prepared before."""
        await _sandbox.ensure_agent_user(sb, workdir)
        ctx = HarnessContext(workdir=workdir, session_id=session_id, adapter_url=adapter_url)
        await self.write_config(sb, ctx)
        return await self.launch_and_wait(sb, ctx, prompt, time_budget_sec)

    def tarballs(self) -> tuple[Path, Path]:
        cfg = self.config
        if cfg.node_tarball is None or cfg.cli_tarball is None:
            raise RuntimeError(
                f"{type(self).__name__}: no Node or CLI tarball to install from; set "
                f"HarnessConfig(node_tarball=..., cli_tarball=...) or SLIME_AGENT_NODE_TARBALL and "
                f"SLIME_AGENT_{self.env_prefix}_TARBALL"
            )
        return cfg.node_tarball, cfg.cli_tarball


async def run_agent(sb: Sandbox, *, workdir: str, start_cmd: str, env: dict[str, str], time_budget_sec: int) -> int:
    """Run `start_cmd` as the agent user in `workdir`; its output goes to .harness/trajectory.jsonl."""
    meta_dir = f"{workdir}/.harness"
    await sb.exec(f"mkdir -p {meta_dir}{give_to_agent(sb, meta_dir)}", user="root", check=True, timeout=30)
    code, _ = await exec_and_wait(
        sb,
        cmd=start_cmd,
        user="agent",
        env=env,
        workdir=workdir,
        out_file=f"{meta_dir}/trajectory.jsonl",
        time_budget_sec=time_budget_sec,
        tag="run",
    )
    return code


def give_to_agent(sb: Sandbox, paths: str) -> str:
    """The shell suffix that hands `paths` to the agent user; none on a one-uid backend (ours),
    where everything is the agent's already."""
    return "" if getattr(sb, "one_user", False) else f" && chown -R agent:agent {paths}"


async def cli_present(sb: Sandbox, check_cmd: str) -> bool:
    """The CLI runs already (bound read-only into the sandbox, or part of its image): nothing to install."""
    code, _, _ = await sb.exec(check_cmd, user="root", timeout=60)
    return code == 0


async def install_npm_cli(sb: Sandbox, *, node_runtime: Path, npm_package: Path, check_cmd: str) -> None:
    """Node from its tarball, then the CLI's npm tarball installed globally, then `check_cmd`."""
    await install_node22(sb, node_runtime)
    await sb.write_file("/tmp/harness-cli.tgz", npm_package)
    cmd = f"npm install -g --prefix=/usr/local --no-audit --no-fund /tmp/harness-cli.tgz && {check_cmd}"
    code, log = 0, ""
    for attempt in range(NPM_INSTALL_RETRIES):
        code, log = await exec_and_wait(sb, cmd=cmd, user="root", time_budget_sec=300, tag="harness-npm-install")
        if code == 0:
            return
        if attempt + 1 < NPM_INSTALL_RETRIES:
            await asyncio.sleep(NPM_INSTALL_BACKOFF_SEC * (attempt + 1))
    raise RuntimeError(f"npm install failed after {NPM_INSTALL_RETRIES} attempts (exit {code}):\n{log[-1000:]}")


async def install_node22(sb: Sandbox, host_tarball: Path) -> None:
    """Node over the image's own (often too old for the CLI). An .xz tarball is unpacked on the
    host once, so images without xz can still `tar xf` it."""
    host_tarball = Path(host_tarball)
    if host_tarball.suffix == ".xz":
        plain = Path(tempfile.gettempdir()) / f"slime-agent.{host_tarball.stem}.tar"
        if not plain.exists():
            part = plain.with_suffix(".partial")
            with lzma.open(host_tarball, "rb") as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(part, plain)
        host_tarball = plain
    await sb.write_file("/tmp/node22.tar", host_tarball)
    await sb.exec(
        "set -e && mkdir -p /opt/node22 && tar xf /tmp/node22.tar -C /opt/node22 --strip-components=1 && "
        "for b in node npm npx; do ln -sf /opt/node22/bin/$b /usr/local/bin/$b; done && "
        "hash -r 2>/dev/null || true && node --version && npm --version",
        user="root",
        timeout=180,
        check=True,
    )
