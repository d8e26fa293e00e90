"""verispec.models."""
