"""verispec's own weight-only int4 kernel (x86-64): the draft's steps, and an int4 target's.

torch's CPU int4 matmul (``_weight_int4pack_mm_for_cpu``) turns every weight into a float
and multiplies it by a bfloat16 activation; for one row that arithmetic, not the memory,
bounds it (it runs at about half the memory bandwidth on the CPUs measured, and on one core
at half its two-core speed). ``csrc/int4_gemv.c`` instead rounds each group of 64 input
channels of a row to int8 (scale max|x| / 127) and takes exact integer dot products of the
4-bit codes with those int8 codes — ``vpdpbusd`` with AVX-512 VNNI; ``vpmaddubsw``, whose
int16 pair sums (at most 2 · 15 · 127) cannot saturate, with AVX2 — over 16 weight rows
interleaved in the lanes of a vector, so no horizontal sums are needed. With AVX-512 VNNI
the low and high nibbles' products run as two independent chains of ``vpdpbusd`` per row
(added once per group), which the multi-row passes of a target need on CPUs that run a
512-bit ``vpdpbusd`` as two halves (the source names the measurement).

Every row is rounded and summed alone, in the same order whatever the pass: passes longer
than :data:`TILE_ROWS` rows (6 on the AVX2 path) run in tiles of equal rows, and a row's
result is bit for bit what it is in a pass of its own. That is what lets a target run int4
(a verification pass scores its tokens as passes of one token would). The activations'
rounding makes the outputs differ from torch's kernel by about 1% of their scale; torch's
kernel rounds as the pass decides, so a target never runs it.

The C source is compiled once per machine (about a second) into verispec's cache directory
and linked against the OpenMP runtime torch itself loads, so its threads are torch's. Where
it cannot be built (no C compiler, not x86-64, no AVX2) or ``VERISPEC_INT4_KERNEL=torch`` is
set, torch's kernel runs, and :func:`status` says why; ``VERISPEC_INT4_KERNEL=avx2`` runs its
AVX2 path on a CPU with AVX-512 VNNI too.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path

import torch
from torch import Tensor

from verispec.models.native import cbuild

__all__ = ["GROUP", "ISAS", "LANES", "TILE_ROWS", "available", "bind", "isa", "load_library",
           "matmul", "pack", "status"]

SOURCE = Path(__file__).with_name("csrc") / "int4_gemv.c"
GROUP = 64  # input channels per scale (the C source's VS_GROUP)
LANES = 16  # weight rows interleaved per block (VS_LANES)
TILE_ROWS = 8  # rows of x per tile (VS_TILE_ROWS); longer passes run in tiles of equal rows
ISAS = {1: "avx2", 2: "avx512-vnni"}  # the C source's VS_ISA_* codes
INT4_ENV = "VERISPEC_INT4_KERNEL"
FLAGS = ("-O3", "-fPIC", "-fopenmp", "-fno-math-errno", "-Wall")


@cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the library, which instruction set it runs), or (None, why torch's kernel runs)."""
    if _requested() == "torch":
        return None, "torch's int4 kernel (VERISPEC_INT4_KERNEL=torch)"
    return load_library(SOURCE)


def load_library(source: Path, stem: str = "int4-gemv") -> tuple[ctypes.CDLL | None, str]:
    """:func:`_load`'s result for a build of ``source``, a version of ``csrc/int4_gemv.c``
    (``benchmarks/int4_builds.py`` times two versions side by side)."""
    lib, why = cbuild.x86_library(source, stem, FLAGS)
    if lib is None:
        return None, f"torch's int4 kernel (verispec's: {why})"
    lib.vs_int4_isa.restype = ctypes.c_int
    lib.vs_int4_mm.restype = ctypes.c_int
    lib.vs_int4_mm.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                               ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                               ctypes.c_int, ctypes.c_int, ctypes.c_int]
    constants = (lib.vs_int4_group(), lib.vs_int4_lanes(), lib.vs_int4_tile_rows())
    if constants != (GROUP, LANES, TILE_ROWS):
        return None, f"torch's int4 kernel (verispec's library has constants {constants})"
    return cbuild.isa_library(lib, "vs_int4_isa", ISAS, ("AVX2", "AVX-512 VNNI"), INT4_ENV,
                              _requested() == "avx2", "verispec's int4 kernel",
                              "torch's int4 kernel")


def _requested() -> str:
    """``VERISPEC_INT4_KERNEL``: ``auto`` (default: verispec's kernel with the best
    instruction set here), ``avx2`` (verispec's kernel, AVX2 even where AVX-512 VNNI
    exists: the path of CPUs without it, to test and time it anywhere) or ``torch``."""
    return cbuild.env_choice(INT4_ENV, ("auto", "avx2", "torch"))


def available() -> bool:
    """verispec's kernel runs here (built, loaded, and the CPU has AVX2 or AVX-512 VNNI)."""
    return _load()[0] is not None


def status() -> str:
    """Which int4 kernel int4 layers run, in words."""
    return _load()[1]


@cache
def isa() -> int:
    """The instruction set of :data:`ISAS` the kernel runs with here (0: none): the best
    this CPU has, or AVX2 where ``VERISPEC_INT4_KERNEL=avx2`` asks."""
    return cbuild.chosen_isa(_load()[0], "vs_int4_isa", _requested() == "avx2")


def pack(codes: Tensor, scale: Tensor, lo: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's layout of W = codes · scale + lo per group of :data:`GROUP` channels.

    codes [N, K] integers 0..15, scale and lo [N, K / GROUP] float; N a multiple of
    :data:`LANES`, K of :data:`GROUP`. Returns (nibbles uint8 [N / 16, G, 8, 16, 4]: block b,
    group g, step t, lane i, byte j holds the codes of row 16 b + i at channels
    64 g + 4 t + j (low nibble) and that + 32 (high nibble); scale and lo as float16
    [N / 16, G, 16])."""
    n, k = codes.shape
    if n % LANES or k % GROUP:
        raise ValueError(f"the int4 kernel takes [N, K] with N % {LANES} == 0 and "
                         f"K % {GROUP} == 0, got [{n}, {k}]")
    blocks, groups = n // LANES, k // GROUP
    c = codes.to(torch.uint8).view(blocks, LANES, groups, 2, GROUP // 8, 4)
    nibbles = (c[:, :, :, 0] | (c[:, :, :, 1] << 4)).permute(0, 2, 3, 1, 4).contiguous()

    def lanes(t: Tensor) -> Tensor:  # [N, G] -> [N / 16, G, 16] float16
        return t.to(torch.float16).view(blocks, LANES, groups).permute(0, 2, 1).contiguous()

    return nibbles, lanes(scale), lanes(lo)


def matmul(x: Tensor, packed: tuple[Tensor, Tensor, Tensor], bias: Tensor | None = None,
           residual: Tensor | None = None, norm: Tensor | None = None, eps: float = 1e-6, *,
           glu: bool = False, use_isa: int | None = None) -> Tensor:
    """x [M, K] float32 (any M; each row's result is what it would be alone, bit for bit)
    -> [M, N]: u Wᵀ (+ bias) (+ residual), W from
    :func:`pack`'s ``packed``, u = x, or with ``norm`` [K] float32 its RMSNorm
    x / sqrt(mean(x²) + eps) ⊙ norm, or with ``glu`` (x [M, 2 K]: a gated MLP's gate and up
    projections side by side) silu(x[:, :K]) ⊙ x[:, K:], computed in the kernel as it rounds
    its input. ``use_isa``: an entry of :data:`ISAS` (default: the best here); one this CPU
    lacks is refused with a ValueError, not emulated."""
    x = x.float().contiguous()
    n = packed[1].shape[0] * LANES
    out = (torch.empty((x.shape[0], n), dtype=torch.float32) if residual is None
           else residual.float().clone(memory_format=torch.contiguous_format))
    call = bind(x, packed, out, bias, norm, eps, accumulate=residual is not None, glu=glu,
                use_isa=use_isa)
    rc = call()
    if rc != 0:
        raise ValueError(f"the int4 kernel refused x {tuple(x.shape)} against [{n}, "
                         f"{x.shape[1] // (2 if glu else 1)}] (code {rc})")
    return out


def bind(x: Tensor, packed: tuple[Tensor, Tensor, Tensor], out: Tensor,
         bias: Tensor | None = None, norm: Tensor | None = None, eps: float = 1e-6, *,
         accumulate: bool = False, glu: bool = False, use_isa: int | None = None,
         threads: int | None = None) -> Callable[[], int]:
    """:func:`matmul`'s product as a call bound to fixed tensors, run as often as asked: the
    call reads x [M, K] (or [M, 2 K] with ``glu``) and writes ``out`` [M, N] (``accumulate``:
    adds to what ``out`` holds, as :func:`matmul` adds its ``residual``), both float32 and
    contiguous, and returns the C function's code (0: done). ``threads``: OpenMP threads
    (default: torch's now). The tensors must stay alive while the call is used."""
    lib = _load()[0]
    if lib is None:
        raise RuntimeError(status())
    nibbles, scale, lo = packed
    m, k = x.shape[0], x.shape[1] // (2 if glu else 1)
    if glu and norm is not None:
        raise ValueError("the int4 kernel takes a norm or a gated input, not both")
    n = scale.shape[0] * LANES
    chosen = isa() if use_isa is None else use_isa  # isa(): checked once per process
    if use_isa is not None and (chosen not in ISAS or chosen > lib.vs_int4_isa()):
        raise ValueError(f"instruction set {chosen} is not one this CPU runs the int4 kernel "
                         f"with (best here: {ISAS.get(lib.vs_int4_isa(), 'none')})")
    for name, t in (("x", x), ("out", out)):
        if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
            raise ValueError(f"the int4 kernel takes a contiguous float32 CPU {name}")
    if out.shape != (m, n):
        raise ValueError(f"the int4 kernel writes [{m}, {n}], not {tuple(out.shape)}")
    return partial(lib.vs_int4_mm, x.data_ptr(), m, k,
                   None if norm is None else norm.data_ptr(), eps, nibbles.data_ptr(),
                   scale.data_ptr(), lo.data_ptr(), n,
                   None if bias is None else bias.data_ptr(), out.data_ptr(), int(accumulate),
                   int(glu), chosen, torch.get_num_threads() if threads is None else threads)
