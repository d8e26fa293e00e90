"""verispec.drafters."""
