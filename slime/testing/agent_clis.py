"""Agent CLIs from the npm registry for tests: installed once per machine into
`$SLIME_CACHE/agent-clis` (default ~/.cache/slime/agent-clis) with `npm install`; when npm cannot
fetch one the caller fails with npm's own error (never a skip)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from slime.utils.cache_dir import slime_cache_dir

CLAUDE_CODE = "@anthropic-ai/claude-code@2.1.328"
CODEX = "@openai/codex@0.169.0"
CLI_CACHE = slime_cache_dir() / "agent-clis"


def npm_installed(package: str, entry: str) -> Path:
    """`entry` (a path under node_modules) of `package`, installed into CLI_CACHE on first use."""
    path = CLI_CACHE / "node_modules" / entry
    if not path.exists():
        CLI_CACHE.mkdir(parents=True, exist_ok=True)
        npm = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CLI_CACHE), package],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert npm.returncode == 0 and path.exists(), f"npm install {package} failed:\n{npm.stderr[-2000:]}"
    return path
