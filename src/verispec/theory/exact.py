"""Exact laws by enumeration on toy models (float64), for tests and for teaching.

The walk and the laws live with the engine (:mod:`verispec.engine.exact`), so that each
method can declare its own exact law where it lives; this module re-exports them.
:func:`target_law` is autoregressive sampling from the target; lossless methods must make
:func:`speculative_law` (or their own law) equal to it.
"""

from verispec.engine.exact import (
    Law,
    draft_blocks,
    expected_accepted,
    speculative_law,
    target_law,
    tv_distance,
    walk,
    warped,
)

__all__ = [
    "Law",
    "draft_blocks",
    "expected_accepted",
    "speculative_law",
    "target_law",
    "tv_distance",
    "walk",
    "warped",
]
