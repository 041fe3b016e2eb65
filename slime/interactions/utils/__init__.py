"""verl's `verl.interactions.utils` path, for code written against verl's interaction registry."""
