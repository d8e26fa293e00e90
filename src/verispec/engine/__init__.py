"""verispec.engine."""
