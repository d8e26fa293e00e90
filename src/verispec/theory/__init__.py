"""Exact laws and closed forms from the papers, for tests, teaching and benchmarks."""

from verispec.theory.exact import (
    Law,
    expected_accepted,
    speculative_law,
    target_law,
    tv_distance,
    warped,
)

__all__ = ["Law", "expected_accepted", "speculative_law", "target_law", "tv_distance", "warped"]
