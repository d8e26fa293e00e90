"""verispec's own exact int8 matmul for passes of a few rows (x86-64): the ``verispec``
library of :mod:`verispec.models.native.kernels`.

oneDNN's and fbgemm's int8 matmuls are built for many rows: on the CPUs measured an 8-row
pass of the target cost about 1.6× a one-row pass on them, although both read the same
weights once. The decoding passes of a server (one row per request) and of verification
(γ + 1 rows) are that small. ``csrc/int8_gemm.c`` reads panels of 32 weight rows as one
stream, once for up to 9 rows of a pass (longer passes in tiles of equal rows that reuse a
panel from the cache), and takes 16 rows' products of 4 channels in one instruction:
``vpdpbusd`` with AVX-512 VNNI (every product into an int32), ``vpmaddubsw`` with AVX2
(pairs into an int16: exact with 7-bit codes only, which the self-test of :mod:`kernels`
finds out). On an AMD EPYC Zen 5 it ran the whole target's one-row step 1.17×, an 8-row
step 1.35× and a 9-token verification 1.41× faster than oneDNN
(``benchmarks/int8_gemm.py``).

Its result is float32(Σ (code − zero) · w) · out_scale — the exact integer rounded once and
multiplied once, as the other libraries' results are — so a layer gives the same bits
whichever library runs a pass, and a mixed kernel (``verispec+onednn/8``) can run the small
passes here and the wide ones (prompts) on oneDNN.

Built once per machine like the int4 kernel (:mod:`~verispec.models.native.cbuild`).
``VERISPEC_INT8_GEMM``: ``auto`` (the best instruction set here), ``avx2`` (its AVX2 path
even where AVX-512 VNNI exists: the path of CPUs without VNNI, to test and time anywhere) or
``off`` (not offered: the table's other kernels run).
"""

from __future__ import annotations

import ctypes
import hashlib
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from verispec.models.native import cbuild

__all__ = ["GEMM_ENV", "ISAS", "PANEL", "STEP", "available", "identity", "isa", "load_library",
           "matmul", "pack", "status"]

SOURCE = Path(__file__).with_name("csrc") / "int8_gemm.c"
PANEL = 32  # weight rows per panel (the C source's VS_PANEL)
STEP = 4  # input channels per lane and step (VS_STEP)
WEIGHT_OFFSET = 128  # the packed weights are unsigned bytes w + 128 (VS_WEIGHT_OFFSET)
ISAS = {1: "avx2", 2: "avx512-vnni"}  # the C source's VS_ISA_* codes
GEMM_ENV = "VERISPEC_INT8_GEMM"
FLAGS = ("-O3", "-fPIC", "-fopenmp", "-fno-math-errno", "-Wall")


def _requested() -> str:
    return cbuild.env_choice(GEMM_ENV, ("auto", "avx2", "off"))


@cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the library, which instruction set it runs), or (None, why it is not offered)."""
    if _requested() == "off":
        return None, f"not offered ({GEMM_ENV}=off)"
    return load_library(SOURCE)


def load_library(source: Path, stem: str = "int8-gemm") -> tuple[ctypes.CDLL | None, str]:
    """:func:`_load`'s result for a build of ``source``, a version of ``csrc/int8_gemm.c``
    (``benchmarks/int4_builds.py --kernel int8`` times two versions side by side)."""
    lib, why = cbuild.x86_library(source, stem, FLAGS)
    if lib is None:
        return None, f"not offered ({why})"
    lib.vs_gemm_isa.restype = ctypes.c_int
    lib.vs_int8_mm.restype = ctypes.c_int
    lib.vs_int8_mm.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                               ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    if (lib.vs_gemm_panel(), lib.vs_gemm_step()) != (PANEL, STEP):
        return None, "not offered (its library has other constants)"
    return cbuild.isa_library(lib, "vs_gemm_isa", ISAS, ("AVX2", "AVX-512 VNNI"), GEMM_ENV,
                              _requested() == "avx2", "verispec's int8 matmul", "not offered")


def available() -> bool:
    """The kernel is built and offered here."""
    return _load()[0] is not None


def status() -> str:
    """Whether the kernel is offered here and with which instruction set, in words."""
    return _load()[1]


@cache
def isa() -> int:
    """The instruction set of :data:`ISAS` it runs with (0: not offered)."""
    return cbuild.chosen_isa(_load()[0], "vs_gemm_isa", _requested() == "avx2")


def identity() -> str:
    """What the kernel's timings depend on: a hash of its source and the instruction set
    it runs with ("off" where it is not offered)."""
    if not available():
        return "off"
    return f"{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]}-{ISAS[isa()]}"


def pack(qweight: Tensor) -> Tensor:
    """int8 weights [N, K] -> the kernel's layout uint8 [ceil(N / 32), ceil(K / 4), 32, 4]:
    panel p, step t, row i, byte j holds w[32 p + i, 4 t + j] + 128 (0 past the last row or
    channel, where the codes are 0 too or the row is not stored)."""
    n, k = qweight.shape
    panels, steps = -(-n // PANEL), -(-k // STEP)
    u = torch.zeros((panels * PANEL, steps * STEP), dtype=torch.int16)
    u[:n, :k] = qweight.to(torch.int16) + WEIGHT_OFFSET
    u = u.to(torch.uint8).view(panels, PANEL, steps, STEP)  # [P, 32, K4, 4]
    return u.permute(0, 2, 1, 3).contiguous()  # [P, K4, 32, 4]


def matmul(codes: Tensor, zero: int, packed: Tensor, out_scale: Tensor, *,
           use_isa: int | None = None) -> Tensor:
    """codes uint8 [M, K] around ``zero`` -> [M, N] float32: float32(Σ_k (codes − zero) ·
    w) · out_scale, with w the int8 weights of :func:`pack`'s ``packed`` and ``out_scale``
    [N] float32. ``use_isa``: an entry of :data:`ISAS` (default :func:`isa`); one this CPU
    lacks is refused with a ValueError, not emulated."""
    lib = _load()[0]
    if lib is None:
        raise RuntimeError(status())
    chosen = isa() if use_isa is None else use_isa  # isa(): checked once per process
    if use_isa is not None and (chosen not in ISAS or chosen > lib.vs_gemm_isa()):
        raise ValueError(f"instruction set {chosen} is not one this CPU runs the int8 matmul "
                         f"with (best here: {ISAS.get(lib.vs_gemm_isa(), 'none')})")
    codes, out_scale = codes.contiguous(), out_scale.contiguous()
    m, k = codes.shape
    n = out_scale.numel()
    if (codes.dtype != torch.uint8 or packed.shape[1] != -(-k // STEP)
            or packed.shape[0] != -(-n // PANEL) or out_scale.dtype != torch.float32):
        raise ValueError(f"the int8 matmul takes uint8 codes [M, K] against packed weights of "
                         f"[N, K]; got {codes.dtype} [{m}, {k}] against {tuple(packed.shape)} "
                         f"with {n} scales")
    out = torch.empty((m, n), dtype=torch.float32)
    if m == 0:
        return out
    rc = lib.vs_int8_mm(codes.data_ptr(), m, k, zero, packed.data_ptr(), n,
                        out_scale.data_ptr(), out.data_ptr(), chosen,
                        torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"the int8 matmul refused codes [{m}, {k}] around {zero} against "
                         f"[{n}, {k}] (code {rc})")
    return out
