"""The error of a 2xx answer nobody can use, on its own: a module that only checks answers (the engine
actors' weight-version check) gets it without importing aiohttp with `slime.utils.http_retry` (~0.2 CPU s
of every engine actor's start)."""

from __future__ import annotations


class AnswerError(ValueError):
    """A 2xx answer the caller cannot use (cut, not JSON, wrong shape): retried like a 5xx."""

    def __init__(self, message: str, reason: str = "bad_answer"):
        super().__init__(message)
        self.reason = reason
