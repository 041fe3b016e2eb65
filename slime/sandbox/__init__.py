"""Local SandboxFusion-compatible code sandbox (`slime-sandbox`); see server.py and runner.py."""

__all__ = ["LocalSandbox", "start_local_sandbox"]


def __getattr__(name: str):
    # lazy: `python -m slime.sandbox.server` must not find the module imported already
    if name in __all__:
        from slime.sandbox import server

        return getattr(server, name)
    raise AttributeError(name)
