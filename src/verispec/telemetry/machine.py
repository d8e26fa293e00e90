"""What the CPU is: its model and the instruction-set flags that decide which kernels run.

Read once from ``/proc/cpuinfo`` (empty where it does not exist) and shared by the
precision choice, the int8 weight cache's signature and the benchmark reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

__all__ = ["CpuInfo", "cpu_info"]


@dataclass(frozen=True)
class CpuInfo:
    """The first processor's ``model name``, ``cpu family``, ``model`` and ``flags``."""

    model_name: str = "unknown CPU"
    family: str = "?"
    model: str = "?"
    flags: frozenset[str] = frozenset()


@cache
def cpu_info() -> CpuInfo:
    """The CPU described by ``/proc/cpuinfo`` (defaults where it cannot be read)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = (x.strip() for x in line.partition(":"))
                if key in ("model name", "cpu family", "model", "flags"):
                    fields.setdefault(key, value)
                if not key and fields:  # the end of the first processor's block
                    break
    except OSError:
        pass
    return CpuInfo(fields.get("model name", "unknown CPU"), fields.get("cpu family", "?"),
                   fields.get("model", "?"), frozenset(fields.get("flags", "").split()))
