"""torch's CPU worker threads, handed back by a thread that has finished its torch work.

torch runs its parallel CPU operations (elementwise kernels, reductions, MKL's small
matmuls) on OpenMP, GNU libgomp in the PyPI wheels. libgomp keeps one team of worker threads
for every thread that has started a parallel region, for as long as that thread lives. Once
the workers of all teams together outnumber the cores, libgomp stops letting them spin
between regions: every parallel operation of the second team then waits for sleeping workers
to wake. A server that loads its models on one thread and decodes on another (the scheduler
thread) is exactly that case: on a 2-core AMD EPYC Zen 5 plain decoding with the int8
target took 65.6 ms per token on a second thread against 36.4 ms on the loading thread, its
parallel kernels 3–10× slower (``benchmarks/thread_pools.py``).

:func:`release_worker_threads` ends the calling thread's team (OpenMP 5's
``omp_pause_resource_all``): a thread calls it when it is done with torch for now, and its
next parallel region, if any, builds a new team. Where the runtime does not offer the call
(another OpenMP, no OpenMP at all) nothing happens.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
from typing import Any

import torch

__all__ = ["release_worker_threads"]

#: ``omp_pause_soft``: the runtime frees its threads and may keep other resources.
OMP_PAUSE_SOFT = 1


@functools.cache
def _openmp() -> Any | None:
    """The OpenMP runtime torch loaded (its own copy in ``torch/lib`` first, then any in
    the process's global namespace) that offers ``omp_pause_resource_all``; None if none."""
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    candidates = sorted(path for name in ("libgomp*.so*", "libiomp*.so*")
                        for path in glob.glob(os.path.join(lib_dir, name)))
    for path in [*candidates, None]:
        try:
            lib = ctypes.CDLL(path)
        except (OSError, TypeError):  # TypeError: no global namespace to open (Windows)
            continue
        if hasattr(lib, "omp_pause_resource_all"):
            lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
            lib.omp_pause_resource_all.restype = ctypes.c_int
            return lib
    return None


def release_worker_threads() -> bool:
    """End the OpenMP worker team of the calling thread (see the module docstring); True if
    the runtime did so, False where it offers no such call or refused (inside a parallel
    region)."""
    lib = _openmp()
    return lib is not None and lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0
