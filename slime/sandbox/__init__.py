"""Local SandboxFusion-compatible code sandbox (`slime-sandbox`); see server.py and runner.py."""

from slime.sandbox.server import LocalSandbox, start_local_sandbox

__all__ = ["LocalSandbox", "start_local_sandbox"]
