"""The trainer-facing side of a rollout: the DP / micro-batch schedule (`schedule`), one batch per
data-parallel rank with tensors (`rank_batches`), and Megatron THD packing of a micro-batch
(`packing`, the only module here that imports megatron-core)."""
