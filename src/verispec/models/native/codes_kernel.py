"""The int8 layers' activation codes in one fused C pass per row (``csrc/int8_codes.c``).

Before its integer product an int8 layer turns each row of its input into codes: the channel
factors, the block rotation (float64, rounded once to float32), the row's max-abs a, the codes
trunc(x_zero + 0.5 + u / (a · x_scale)), and, after an RMSNorm, the row's scale. In torch that
is a dozen operators per layer, each a pass over memory and a dispatch (with float64 copies
around the rotation's two matmuls), and their share of a pass grows with its rows
(``benchmarks/int8_codes.py`` times both paths: on an AMD EPYC Zen 5 a one-row step ran
1.09× and a 118-token prompt 1.37× faster fused). The C kernel does it in one pass, row by
row with each row's arithmetic in a
fixed order, so a row's codes never depend on the other rows, their number or the thread
count: the property that lets a token's p be the same in a one-token step and in a
verification pass.

Its codes are the torch path's (:meth:`~verispec.models.native.linear.Int8Linear.
scaled_reference`) bar a float64 rounding difference at a float32 rounding boundary; its
row scale after an RMSNorm sums the squares in float64 (torch's in float32), so they agree
to float32 rounding. Which of the two runs is fixed per process.

Built like verispec's int4 kernel (:mod:`~verispec.models.native.cbuild`), with the
instruction set torch's own CPU kernels use (``torch.backends.cpu.get_cpu_capability``);
where it cannot be built, or ``VERISPEC_INT8_CODES=torch`` is set, the torch path runs and
:func:`status` says why.
"""

from __future__ import annotations

import ctypes
import subprocess
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from verispec.models.native import cbuild

__all__ = ["ARCH_FLAGS", "MAX_BLOCK", "MAX_Q", "RowCodes", "available", "build", "codes", "status",
           "takes"]

SOURCE = Path(__file__).with_name("csrc") / "int8_codes.c"
MAX_BLOCK = 4096  # the most channels of one rotation block (the C source's VS_MAX_BLOCK)
MAX_Q = 64  # the largest second factor of a Kronecker block (VS_MAX_Q)
BASE_FLAGS = ("-O3", "-fPIC", "-fopenmp", "-fno-math-errno", "-Wall")
#: the code generated for torch's CPU capability (x86-64 levels: AVX2 + FMA, AVX-512)
ARCH_FLAGS = {"AVX2": ("-march=x86-64-v3",),
              "AVX512": ("-march=x86-64-v4", "-mprefer-vector-width=512")}
MIN_PARALLEL = 16384  # fewer entries (M K) run on one thread (VS_MIN_PARALLEL)


def _requested() -> str:
    """``VERISPEC_INT8_CODES``: ``auto`` (default: the C kernel where it builds) or
    ``torch`` (the torch operators: the reference path, and the path of other devices)."""
    return cbuild.env_choice("VERISPEC_INT8_CODES", ("auto", "torch"))


def build(capability: str) -> ctypes.CDLL:
    """The kernel compiled for one of torch's CPU capabilities (``DEFAULT``, ``AVX2``,
    ``AVX512``), bound and checked; raises OSError or subprocess.SubprocessError where it
    cannot be built, RuntimeError where the library is not this module's."""
    flags = BASE_FLAGS + ARCH_FLAGS.get(capability, ())
    lib = cbuild.build(SOURCE, "int8-codes", flags)
    constants = (lib.vs_codes_max_block(), lib.vs_codes_max_q(), lib.vs_codes_min_parallel())
    if constants != (MAX_BLOCK, MAX_Q, MIN_PARALLEL):
        raise RuntimeError("verispec's int8 codes library has other constants")
    lib.vs_int8_codes.restype = ctypes.c_int
    lib.vs_int8_codes.argtypes = [
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,  # x, m, k, factors
        ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,  # rot_a, p, rot_c, q
        ctypes.c_float, ctypes.c_float, ctypes.c_float, ctypes.c_int, ctypes.c_double,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    return lib


@cache
def _load() -> tuple[ctypes.CDLL | None, str]:
    """(the library, what runs in words), or (None, why the torch path runs)."""
    if _requested() == "torch":
        return None, "torch operators (VERISPEC_INT8_CODES=torch)"
    why = cbuild.unbuildable()
    if why is not None:
        return None, f"torch operators ({why})"
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        lib = build(capability)
    except (OSError, subprocess.SubprocessError, RuntimeError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        return None, f"torch operators (verispec's kernel did not build: {detail.strip()[:300]})"
    return lib, f"verispec's kernel ({capability.lower()} code)"


def available() -> bool:
    """The C kernel runs here (built and loaded, not turned off)."""
    return _load()[0] is not None


def status() -> str:
    """What makes the int8 layers' activation codes here, in words."""
    return _load()[1]


def takes(rot: Tensor | None, rot_b: Tensor | None) -> bool:
    """The C kernel runs here and takes this rotation: none, or a block within its limits
    (a dense block R counts as R ⊗ [1])."""
    if not available():
        return False
    if rot is None:
        return True
    q = 1 if rot_b is None else rot_b.shape[0]
    return q <= MAX_Q and rot.shape[0] * q <= MAX_BLOCK


_ONE = torch.ones((1, 1), dtype=torch.float64)  # C = [1] for a dense rotation block


class RowCodes:
    """The kernel bound to one layer's constants, so that a call passes only the input.

    ``factors`` [K] float32 or None; ``rot`` [p, p] and ``rot_b`` [q, q] (or ``rot_b`` None:
    one dense block) or None: the block rotation, kept in float64; ``norm_eps``: the row
    scale after an RMSNorm with this eps (None: no norm). ``library``: a :func:`build` to run
    instead of this process's kernel."""

    def __init__(self, factors: Tensor | None, rot: Tensor | None, rot_b: Tensor | None,
                 x_scale: float, x_zero: int, norm_eps: float | None,
                 library: ctypes.CDLL | None = None) -> None:
        lib = library or _load()[0]
        if lib is None:
            raise RuntimeError(status())
        self._fn = lib.vs_int8_codes
        self.factors = None if factors is None else factors.float().contiguous()  # [K]
        self.rot = None if rot is None else rot.to(torch.float64).contiguous()  # [p, p]
        c = _ONE if rot is not None and rot_b is None else rot_b
        self.c = None if c is None else c.to(torch.float64).contiguous()  # [q, q]
        self._in_place = self.factors is None and self.rot is None  # no scratch rows needed
        # the arguments after x, m, k and before the scratch, codes, as_float, s, threads
        self._args = (None if self.factors is None else self.factors.data_ptr(),
                      None if self.rot is None else self.rot.data_ptr(),
                      0 if self.rot is None else self.rot.shape[0],
                      None if self.c is None else self.c.data_ptr(),
                      0 if self.c is None else self.c.shape[0],
                      1.0 / x_scale, x_zero + 0.5, float(x_zero), int(norm_eps is not None),
                      0.0 if norm_eps is None else norm_eps)

    def __call__(self, x: Tensor, as_float: bool) -> tuple[Tensor, Tensor]:
        """(codes [M, K], s [M, 1]) for x [M, K] float32 on the CPU: codes as uint8, or with
        ``as_float`` as float32 code − x_zero; s = a, the row's max-abs after the factors and
        the rotation, or after an RMSNorm a / sqrt(mean(x²) + eps)."""
        x = x.contiguous()
        m, k = x.shape
        out = torch.empty((m, k), dtype=torch.float32 if as_float else torch.uint8)
        s = torch.empty((m, 1), dtype=torch.float32)
        scratch = x if self._in_place else torch.empty_like(x)
        rc = self._fn(x.data_ptr(), m, k, *self._args, scratch.data_ptr(), out.data_ptr(),
                      int(as_float), s.data_ptr(), torch.get_num_threads())
        if rc != 0:
            shapes = [None if t is None else tuple(t.shape) for t in (self.rot, self.c)]
            raise ValueError(f"the int8 codes kernel refused x [{m}, {k}] with a rotation of "
                             f"{shapes[0]} ⊗ {shapes[1]} (code {rc})")
        return out, s


def codes(x: Tensor, factors: Tensor | None, rot: Tensor | None, rot_b: Tensor | None,
          x_scale: float, x_zero: int, *, norm_eps: float | None, as_float: bool,
          library: ctypes.CDLL | None = None) -> tuple[Tensor, Tensor]:
    """(codes [M, K], s [M, 1]) for x [M, K] float32 on the CPU, with :class:`RowCodes`'
    arguments, in one call."""
    return RowCodes(factors, rot, rot_b, x_scale, x_zero, norm_eps, library)(x, as_float)
