"""verispec's rotary embedding and cache store in one call (x86-64), for CPU passes.

A one-token pass of the embedded draft spends about a tenth of its time outside its matmuls
and attention, in some twenty small tensor operations per layer: the half swap and two
products of the rotary embedding, the writes of the new keys and values into the cache, and
the permutation of the queries into the attention's layout. ``csrc/rope_store.c`` does all
of them in one call per layer, token by token with the arithmetic of those operations on an
x86-64 CPU with FMA (x · cos rounded to float32, the other half's product added in one
fused multiply-add: the same bits where torch's kernels fuse it too, as on the AMD EPYC
Zen 4), so a token's bits do not depend on its pass.

Built once per machine like the other kernels (:mod:`~verispec.models.native.cbuild`; plain
C, run with FMA instructions where the CPU has them, and an exact fused multiply-add in
software where not). ``VERISPEC_ROPE_KERNEL``: ``auto`` (this kernel where it
builds) or ``torch`` (the tensor operations).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path

import torch
from torch import Tensor

from verispec.models.native import cbuild

__all__ = ["ROPE_ENV", "available", "bind", "rope_store", "status", "takes"]

SOURCE = Path(__file__).with_name("csrc") / "rope_store.c"
ROPE_ENV = "VERISPEC_ROPE_KERNEL"
MAX_HEAD_DIM = 1024  # the C source's vs_rope_max_head_dim()
FLAGS = ("-O3", "-fPIC", "-fopenmp", "-fno-math-errno", "-Wall")
CACHE_DTYPES = {torch.float32: 0, torch.float64: 1}  # the C source's ``wide`` flag


@cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the library, "verispec's ..."), or (None, why the tensor operations run)."""
    if cbuild.env_choice(ROPE_ENV, ("auto", "torch")) == "torch":
        return None, f"torch's tensor operations ({ROPE_ENV}=torch)"
    lib, why = cbuild.x86_library(SOURCE, "rope-store", FLAGS)
    if lib is None:
        return None, f"torch's tensor operations (verispec's kernel: {why})"
    lib.vs_rope_store.restype = ctypes.c_int
    lib.vs_rope_store.argtypes = [ctypes.c_void_p, *[ctypes.c_int64] * 5, *[ctypes.c_void_p] * 6,
                                  ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p,
                                  ctypes.c_int]
    if lib.vs_rope_max_head_dim() != MAX_HEAD_DIM:
        return None, "torch's tensor operations (verispec's library has other constants)"
    return lib, "verispec's rotary embedding and cache store"


def available() -> bool:
    """The kernel runs here."""
    return _load()[0] is not None


def status() -> str:
    """What applies the rotary embedding and stores keys and values, in words."""
    return _load()[1]


def takes(activations: Tensor, cos: Tensor, cache_k: Tensor) -> bool:
    """Whether :func:`rope_store` runs for these tensors: on the CPU, float32 activations
    (a layer's input or its q/k/v) and tables, a float32 or float64 cache with contiguous
    positions, and the kernel built."""
    d = cos.shape[-1]
    return (activations.device.type == "cpu" and activations.dtype == torch.float32
            and cos.dtype == torch.float32 and cache_k.dtype in CACHE_DTYPES
            and cache_k.stride(3) == 1 and cache_k.stride(2) == d and d <= MAX_HEAD_DIM
            and available())


def rope_store(qkv: Tensor, heads: int, kv_heads: int, cos: Tensor, sin: Tensor,
               positions: Tensor, slots: Tensor, cache_k: Tensor, cache_v: Tensor, *,
               check: bool = True) -> Tensor:
    """qkv [R, k, Hq + 2 Hkv, D] float32 -> q [R, Hkv, G k, D] float32 (query i of a kv head
    is query head i // k of its group, token i % k), rotated; the keys (rotated) and the
    values stored in ``cache_k`` / ``cache_v`` [P, Hkv, L, D] at each row's slot and each
    token's position.

    ``cos``, ``sin`` [N, D]: the model's tables (``sin`` with its first half negated);
    ``positions`` [R, k] int64, each below N and L; ``slots`` [R] int64, each below P.
    ``check=False`` skips the checks of shapes, positions and slots against the tables and
    the cache (a caller that built them for this cache: the model's passes)."""
    lib = _load()[0]
    if lib is None:
        raise RuntimeError(status())
    rows, k, width, d = qkv.shape
    if check and (width != heads + 2 * kv_heads or heads % kv_heads
                  or cos.shape != sin.shape or cos.shape[1] != d or not cos.is_contiguous()
                  or not sin.is_contiguous() or cache_k.shape != cache_v.shape
                  or cache_k.shape[1] != kv_heads or cache_k.shape[3] != d
                  or positions.shape != (rows, k) or slots.shape != (rows,)
                  or not 0 <= int(positions.min()) <= int(positions.max())
                  < min(cos.shape[0], cache_k.shape[2])
                  or not 0 <= int(slots.min()) <= int(slots.max()) < cache_k.shape[0]):
        raise ValueError(f"rotary embedding of qkv {tuple(qkv.shape)} into caches "
                         f"{tuple(cache_k.shape)} at positions {tuple(positions.shape)} and "
                         f"slots {tuple(slots.shape)}: shapes, positions or slots that do not "
                         f"match")
    qkv = qkv.contiguous()
    positions = positions.to(torch.int64).contiguous()
    slots = slots.to(torch.int64).contiguous()
    q = torch.empty((rows, kv_heads, heads // kv_heads * k, d), dtype=torch.float32)
    rc = bind(qkv, heads, kv_heads, cos, sin, positions, slots, cache_k, cache_v, q)()
    if rc != 0:
        raise ValueError(f"the rotary kernel refused qkv {tuple(qkv.shape)} (code {rc})")
    return q


def bind(qkv: Tensor, heads: int, kv_heads: int, cos: Tensor, sin: Tensor, positions: Tensor,
         slots: Tensor, cache_k: Tensor, cache_v: Tensor, q: Tensor,
         threads: int | None = None) -> Callable[[], int]:
    """:func:`rope_store` as a call bound to fixed tensors, run as often as asked: it reads
    qkv [R, k, Hq + 2 Hkv, D], ``positions`` [R, k] and ``slots`` [R] (int64, contiguous,
    checked by the caller as :func:`rope_store` checks them) as they are when it runs,
    writes q [R, Hkv, G k, D] float32 and the caches, and returns the C function's code (0:
    done). ``threads``: OpenMP threads (default: torch's now). The tensors must stay alive
    while the call is used."""
    lib = _load()[0]
    if lib is None:
        raise RuntimeError(status())
    rows, k, _, d = qkv.shape
    if cache_k.stride() != cache_v.stride() or cache_k.dtype != cache_v.dtype:
        raise ValueError("keys and values need caches of one layout and dtype")
    if (not qkv.is_contiguous() or not q.is_contiguous() or q.dtype != torch.float32
            or q.shape != (rows, kv_heads, heads // kv_heads * k, d)
            or positions.dtype != torch.int64 or slots.dtype != torch.int64
            or not positions.is_contiguous() or not slots.is_contiguous()):
        raise ValueError("the rotary kernel takes contiguous qkv, q [R, Hkv, G k, D] float32 "
                         "and contiguous int64 positions and slots")
    return partial(lib.vs_rope_store, qkv.data_ptr(), rows, k, heads, kv_heads, d,
                   cos.data_ptr(), sin.data_ptr(), positions.data_ptr(), slots.data_ptr(),
                   cache_k.data_ptr(), cache_v.data_ptr(), cache_k.stride(0), cache_k.stride(1),
                   CACHE_DTYPES[cache_k.dtype], q.data_ptr(),
                   torch.get_num_threads() if threads is None else threads)
