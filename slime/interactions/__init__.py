"""verl-style interactions: a simulated user answering the model between turns (see `registry`)."""

from slime.interactions.base import BaseInteraction

__all__ = ["BaseInteraction"]
