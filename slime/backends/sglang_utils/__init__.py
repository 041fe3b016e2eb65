"""slime's `slime.backends.sglang_utils` path: what rollout plugins import from it (`server_control`)."""
