"""verispec's own attention over the slot cache (x86-64), in float32 or float64.

An int8 or int4 layer rounds its input to a few hundred levels, so the attention before it
must give a token the same result however many tokens its pass scores. torch's attention
reaches that only in float64 and up to a float32 rounding tie, and over scattered slots it
runs one call per run of consecutive slots; on the 2-vCPU CPUs measured, its float64
attention took about a seventh of an 8-row step of the int8 target. ``csrc/attention.c``
computes every query alone in one fixed order (scores, their maximum, the exponentials
summed in chunks that start at position 0, the values weighted in position order), reading
each row's keys and values where its slot is: a query's result never depends on the other
queries of the pass, bit for bit, and no row's cache is gathered. So the quantized models
keep a float32 cache where it runs (:func:`exact_dtype`), and float64 for torch's.

Every float32 cache on the CPU is read by it too (float32 models and the drafts): in the int4
draft's one-token step after 200 tokens on an AMD EPYC Zen 4, torch's attention call took
41 µs per layer and this kernel's 24 (each call timed in place; most of torch's time is
fixed costs).

Built once per machine like the other kernels (:mod:`~verispec.models.native.cbuild`).
``VERISPEC_ATTENTION``: ``auto`` (AVX-512 where the CPU has it, else AVX2 with FMA),
``avx2`` (the AVX2 path anywhere, to test it) or ``torch`` (torch's attention).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path

import torch
from torch import Tensor

from verispec.models.native import cbuild

__all__ = ["ATTENTION_ENV", "ISAS", "WIDTHS", "attend", "available", "bind", "exact_dtype", "isa",
           "status", "takes"]

SOURCE = Path(__file__).with_name("csrc") / "attention.c"
#: elements per vector of each cache dtype (VS_W, VS_FW): head dimensions must be a multiple
WIDTHS = {torch.float64: 8, torch.float32: 16}
MAX_HEAD_DIM = 512  # VS_MAX_D
ISAS = {1: "avx2", 2: "avx512"}  # the C source's VS_ISA_* codes
ATTENTION_ENV = "VERISPEC_ATTENTION"
FLAGS = ("-O3", "-fPIC", "-fopenmp", "-fno-math-errno", "-Wall", "-Wno-psabi")


def _requested() -> str:
    return cbuild.env_choice(ATTENTION_ENV, ("auto", "avx2", "torch"))


@cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the library, which instruction set it runs), or (None, why torch's runs)."""
    if _requested() == "torch":
        return None, f"torch's attention ({ATTENTION_ENV}=torch)"
    lib, why = cbuild.x86_library(SOURCE, "attention", FLAGS)
    if lib is None:
        return None, f"torch's attention (verispec's: {why})"
    lib.vs_attention_isa.restype = ctypes.c_int
    lib.vs_attend.restype = ctypes.c_int
    lib.vs_attend.argtypes = [ctypes.c_void_p, *[ctypes.c_int64] * 5, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                              ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int]
    if (lib.vs_attention_width(), lib.vs_attention_float_width()) != (
            WIDTHS[torch.float64], WIDTHS[torch.float32]):
        return None, "torch's attention (verispec's library has other constants)"
    return cbuild.isa_library(lib, "vs_attention_isa", ISAS, ("AVX2 with FMA", "AVX-512"),
                              ATTENTION_ENV, _requested() == "avx2", "verispec's attention",
                              "torch's attention")


def available() -> bool:
    """verispec's attention runs here."""
    return _load()[0] is not None


def status() -> str:
    """Which attention the quantized models run, in words."""
    return _load()[1]


@cache
def isa() -> int:
    """The instruction set of :data:`ISAS` it runs with here (0: none)."""
    return cbuild.chosen_isa(_load()[0], "vs_attention_isa", _requested() == "avx2")


def exact_dtype(device: torch.device, head_dim: int) -> torch.dtype:
    """The cache dtype in which a quantized model's passes give every token the same bits
    whatever else its pass holds (a target's scores then equal passes of one token): float32
    where this kernel runs on ``device`` and takes ``head_dim`` in float32 (each query alone,
    in one fixed order), float64 for torch's attention, which is pass-independent in float64
    up to a float32 rounding tie (:meth:`~verispec.models.native.model.Transformer.attend`)."""
    fits = _fits(head_dim, torch.float32)
    return torch.float32 if device.type == "cpu" and fits and available() else torch.float64


def _fits(head_dim: int, dtype: torch.dtype) -> bool:
    """Whether the kernel takes heads of ``head_dim`` over a cache of ``dtype``."""
    width = WIDTHS.get(dtype)
    return width is not None and head_dim % width == 0 and width <= head_dim <= MAX_HEAD_DIM


def takes(q: Tensor, cache_k: Tensor) -> bool:
    """Whether :func:`attend` runs these tensors: CPU, a float64 or float32 cache, a head
    dimension it takes, and the kernel built here."""
    return q.device.type == "cpu" and _fits(q.shape[-1], cache_k.dtype) and available()


def attend(q: Tensor, cache_k: Tensor, cache_v: Tensor, slots: Tensor, last: Tensor, *,
           use_isa: int | None = None, check: bool = True) -> Tensor:
    """q [R, Hkv, G k, D] (query i of a head is token i % k of its row) over the rows' slots
    of the cache's float64 or float32 [P, Hkv, L, D] keys and values -> [R, Hkv, G k, D]
    float32 (arithmetic in the cache's dtype).

    ``slots`` [R] int64: each row's slot; ``last`` [R, k] int64: the last position each
    token attends (< L). ``use_isa``: an entry of :data:`ISAS` (default: the one chosen
    here); one this CPU lacks is refused with a ValueError, not emulated. ``check=False``
    skips the checks of slots and positions against the cache (a caller that built them
    for this cache: the model's passes)."""
    lib = _load()[0]
    if lib is None:
        raise RuntimeError(status())
    chosen = isa() if use_isa is None else use_isa
    if use_isa is not None and (chosen not in ISAS or chosen > lib.vs_attention_isa()):
        raise ValueError(f"instruction set {chosen} is not one this CPU runs the attention "
                         f"kernel with (best here: {ISAS.get(lib.vs_attention_isa(), 'none')})")
    rows, heads, _, d = q.shape
    if check and (cache_k.shape != cache_v.shape or cache_k.shape[1] != heads
                  or cache_k.shape[3] != d or cache_k.dtype not in WIDTHS
                  or cache_v.dtype != cache_k.dtype
                  or not (cache_k.is_contiguous() and cache_v.is_contiguous())
                  or slots.shape != (rows,) or last.shape[0] != rows
                  or not 0 <= int(slots.min()) <= int(slots.max()) < cache_k.shape[0]
                  or int(last.max()) >= cache_k.shape[2] or int(last.min()) < 0):
        raise ValueError(f"attention of q {tuple(q.shape)} over caches {tuple(cache_k.shape)}"
                         f" with slots {tuple(slots.shape)} and last {tuple(last.shape)}: "
                         f"shapes or positions that do not match")
    q = q.float().contiguous()
    slots = slots.to(torch.int64).contiguous()
    last = last.to(torch.int64).contiguous()
    out = torch.empty(q.shape, dtype=torch.float32)
    rc = bind(q, cache_k, cache_v, slots, last, out, use_isa=chosen)()
    if rc != 0:
        raise ValueError(f"the attention kernel refused q {tuple(q.shape)} (code {rc})")
    return out


def bind(q: Tensor, cache_k: Tensor, cache_v: Tensor, slots: Tensor, last: Tensor,
         out: Tensor, *, use_isa: int | None = None,
         threads: int | None = None) -> Callable[[], int]:
    """:func:`attend` as a call bound to fixed tensors, run as often as asked: it reads q
    [R, Hkv, G k, D] float32, ``slots`` [R] and ``last`` [R, k] (int64, contiguous, checked
    by the caller as :func:`attend` checks them) as they are when it runs, writes ``out``
    (q's shape, float32) and returns the C function's code (0: done). ``use_isa``: as in
    :func:`attend`, unchecked; ``threads``: OpenMP threads (default: torch's now). The
    tensors must stay alive while the call is used."""
    lib = _load()[0]
    if lib is None:
        raise RuntimeError(status())
    if (q.dtype != torch.float32 or out.dtype != torch.float32 or out.shape != q.shape
            or not q.is_contiguous() or not out.is_contiguous()
            or slots.dtype != torch.int64 or last.dtype != torch.int64
            or not slots.is_contiguous() or not last.is_contiguous()):
        raise ValueError("the attention kernel takes contiguous float32 q and out of one shape"
                         " and contiguous int64 slots and positions")
    return partial(lib.vs_attend, q.data_ptr(), *q.shape, last.shape[1],
                   cache_k.data_ptr(), cache_v.data_ptr(), cache_k.stride(0), cache_k.stride(1),
                   slots.data_ptr(), last.data_ptr(), out.data_ptr(),
                   int(cache_k.dtype == torch.float64), isa() if use_isa is None else use_isa,
                   torch.get_num_threads() if threads is None else threads)
