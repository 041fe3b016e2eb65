"""slime's `slime.backends.megatron_utils` path: only what plugins import (`cp_utils`)."""
