"""slime: rollout orchestration for RL of large language models."""

__version__ = "0.1.0"
