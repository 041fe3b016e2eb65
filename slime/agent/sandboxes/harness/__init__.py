"""Agent CLIs run in a sandbox against the gateway (Claude Code, Codex)."""

from .claude_code import ClaudeCodeHarness
from .codex import CodexHarness
from .common import BaseHarness, HarnessConfig, HarnessContext

__all__ = ["BaseHarness", "ClaudeCodeHarness", "CodexHarness", "HarnessConfig", "HarnessContext"]
