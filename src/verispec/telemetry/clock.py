"""A wall clock that waits for the device's queued work first."""

from __future__ import annotations

import time

import torch

__all__ = ["now"]


def now(device: torch.device) -> float:
    """``time.perf_counter()`` after the device's queued work has finished (CUDA syncs)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
