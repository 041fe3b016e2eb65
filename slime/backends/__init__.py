"""slime's `slime.backends` path, for the few trainer helpers that plugins import from it."""
