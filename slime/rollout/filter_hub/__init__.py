"""Dynamic sampling filters (`--dynamic-sampling-filter-path`), slime's `filter_hub`: functions
`fn(args, samples, **kwargs) -> DynamicFilterOutput | bool` that decide whether a finished
group is kept for training."""
