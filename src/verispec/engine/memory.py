"""Large host tensors without page faults: the C allocator keeps the blocks the engine frees.

Every iteration allocates and frees host tensors of B × (γ + 1) × V floats — the warped p,
the draft's q, the verifier's weights (24 MB each at B = 8, γ = 4 on a 151,936-token
vocabulary). glibc's malloc serves a block that large with a fresh ``mmap`` and unmaps it on
``free`` (its adaptive threshold rises only after a free and falls back whenever the heap is
trimmed), so the next iteration faults every page in again and the kernel zeroes it: on a
2-vCPU AMD EPYC that was a third of the engine's time outside the model passes at B = 8
(``benchmarks/engine_overhead.py``: 280,000 minor page faults in 18 iterations; 2,400 with
the settings below).

:func:`keep_freed_memory` sets glibc's ``M_MMAP_THRESHOLD`` to its largest accepted value
(32 MiB), so blocks below it come from the heap and are reused, and ``M_TRIM_THRESHOLD`` to
512 MiB, so the heap keeps up to that much freed memory instead of returning it to the
kernel at every free. Blocks of 32 MiB or more are still mapped per allocation and returned
on free (loading weights stays as lean as before). The price is a resident size that stays
at its peak rather than shrinking between iterations — what PyTorch's CUDA caching allocator,
jemalloc and tcmalloc also do. The engine applies it once per process; ``VERISPEC_MALLOC=system``
leaves the allocator as it is. Elsewhere than Linux with glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

__all__ = ["MALLOC_ENV", "MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_memory"]

MALLOC_ENV = "VERISPEC_MALLOC"  # "system": leave malloc's settings alone
MMAP_THRESHOLD = 32 << 20  # bytes; glibc refuses larger values on 64-bit
TRIM_THRESHOLD = 512 << 20  # bytes of free heap top kept before it is returned
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameter numbers (malloc.h)

_applied: bool | None = None  # None: not tried yet


def keep_freed_memory() -> bool:
    """Make glibc's malloc reuse freed blocks below 32 MiB (see the module docstring).

    Idempotent; returns whether the settings are in effect in this process.
    """
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def _apply() -> bool:
    choice = os.environ.get(MALLOC_ENV, "")
    if choice == "system":
        return False
    if choice:
        raise ValueError(f"{MALLOC_ENV} must be 'system' or unset, got {choice!r}")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # mallopt returns 1 on success; setting either value also stops glibc's adaptive threshold
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
