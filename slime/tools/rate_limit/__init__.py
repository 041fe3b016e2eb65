"""Internals of slime.tools.rate_limiter: core.py (the arbiter), client.py (per process), actor.py (Ray)."""
