"""Internals of slime.tools.rate_limiter: core.py is the arbiter (the limiter's Ray actor)."""
