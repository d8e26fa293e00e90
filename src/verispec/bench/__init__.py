"""verispec.bench."""
