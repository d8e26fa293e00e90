"""Measurement helpers: peak memory during a call, per-prompt seeds, perplexity scoring.

Peak memory is the peak of the process's resident set size (RSS, weights included) while
the measured call runs, sampled from ``/proc/self/statm`` by a background thread every
``interval_s`` seconds (plus on entry and exit), or ``torch.cuda.max_memory_allocated`` on
CUDA. Where neither exists it is None: never guessed.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Self

import torch

from verispec.models.base import CausalLM
from verispec.models.native.kernels import ISA_ENV, choose
from verispec.telemetry.machine import cpu_info

__all__ = ["MemoryMeter", "derive_seed", "machine_description", "rescore", "rss_bytes",
           "score_nll"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


#: CPU flags that decide which int8 / bf16 kernels run.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16",
                "amx_int8")


def machine_description() -> str:
    """The CPU model, its cores and kernel-relevant flags, and the GPU if there is one."""
    cpu = cpu_info()
    model, flags = f"{cpu.model_name} (family {cpu.family}, model {cpu.model})", cpu.flags
    have = [x for x in KERNEL_FLAGS if x in flags]
    lacking = [x for x in KERNEL_FLAGS if x not in flags]
    text = (f"{model}, {os.cpu_count()} cores, flags {' '.join(have) or 'unknown'}"
            + (f" (no {' '.join(lacking)})" if lacking else "") if flags else model)
    caps = [f"{e}={os.environ[e]}" for e in ISA_ENV if os.environ.get(e)]
    if caps:  # a VNNI CPU dispatching as one without it
        text += f"; ISA capped ({' '.join(caps)}: emulated AVX2)"
    try:
        kernel, _ = choose()
    except ValueError as e:  # a bad override
        text += f"; int8 kernel: {e}"
    else:
        if kernel is not None:
            text += f"; int8 kernel {kernel}"
    if torch.cuda.is_available():
        text += f"; GPU {torch.cuda.get_device_name(0)}"
    return text


def rss_bytes() -> int | None:
    """Resident set size of this process in bytes (None where /proc is unavailable)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class MemoryMeter:
    """Context manager: ``peak_mb`` is the peak memory while the block ran (None if unknown).

    ``source`` says what was measured: ``"cuda max_memory_allocated"``, ``"process RSS"`` or
    ``"unavailable"``.
    """

    def __init__(self, device: torch.device | str = "cpu", interval_s: float = 0.02) -> None:
        self.device = torch.device(device)
        self.interval_s = interval_s
        self.peak_mb: float | None = None
        self.source = "unavailable"
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        value = rss_bytes()
        if value is not None and value > self._peak:
            self._peak = value

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> Self:
        self._peak = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.source = "cuda max_memory_allocated"
            return self
        self._sample()
        if self._peak:
            self.source = "process RSS"
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, daemon=True, name="rss-poll")
            self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.device.type == "cuda":
            self.peak_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
            return
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()
            self.peak_mb = self._peak / 2**20


def derive_seed(seed: int, repeat: int, prompt_id: str) -> int:
    """The seed of one (repeat, prompt): the same for every method (common random numbers,
    so that paired comparisons compare methods, not luck), different across repeats."""
    digest = hashlib.sha256(f"{seed}/{repeat}/{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def rescore(target: CausalLM, prompt: Sequence[int], output: Sequence[int]) -> torch.Tensor:
    """The target's raw logits [n, V] of each of the n output tokens, in one pass (the
    target's cache is reset before and after)."""
    target.reset()
    target.add_rows([list(prompt[:-1])])
    try:
        return target.extend([[prompt[-1], *output[:-1]]])[0]  # [n, V]
    finally:
        target.reset()


def score_nll(target: CausalLM, prompt: Sequence[int], output: Sequence[int],
              logits: torch.Tensor | None = None) -> float:
    """Σ −log p(output_i | prompt, output_<i) under the *unwarped* target, in one pass.

    Used for outputs of systems that do not report it (the peers); ``logits`` from
    :func:`rescore` may be given to save the pass.
    """
    if not output:
        return 0.0
    logits = rescore(target, prompt, output) if logits is None else logits
    logp = torch.log_softmax(logits.double(), dim=-1)  # [n, V] float64
    picked = logp.gather(-1, torch.tensor(list(output), device=logp.device)[:, None])
    return -float(picked.sum())
