"""Which int8 kernel the native runtime uses on this CPU, and with how many activation bits.

An int8 layer multiplies uint8 activation codes by int8 weights. Where the CPU has VNNI
(``vpdpbusd``) the kernels add each product into an int32 and every dot product is exact.
Without it (AVX2 only: AMD before Zen 4, Intel before Ice Lake / Cascade Lake) oneDNN and
fbgemm add *pairs* of products into a **saturating int16** (``vpmaddubsw``) before widening:
with codes up to 255 and weights up to ±127 a pair reaches 64,770 > 32,767 and the result is
silently wrong, in a way that depends on the pass size (rows see each other).

So an activation code width is a property of a (library, CPU) pair:

* **8-bit codes** — 1..255 around zero point 128 (scale 1/127): exact only where the kernel
  accumulates in int32;
* **7-bit codes** — 1..127 around zero point 64 (scale 1/63): a pair sums to at most
  2·127·127 = 32,258 < 32,767, so every integer dot product is exact on any x86-64 CPU with
  AVX2.

Flags can mislead (a hypervisor may hide them; ``ONEDNN_MAX_CPU_ISA`` and
``FBGEMM_ENABLE_INSTRUCTIONS`` change what the libraries run; fbgemm uses VNNI only with
``avx512_vnni``), so every candidate proves itself: :func:`proven` runs an adversarial product
(weights ±127, inputs at the extreme codes, both signs, several pass sizes) through it and
keeps it only when the result is the exact integer product and every row of random layers
comes out the same bit for bit whatever the pass size (:func:`varying_pass_sizes`). Among
the proven kernels of the widest code width the fastest on this CPU is used (:func:`choose`,
a short timing made once and recorded in verispec's cache directory);
``VERISPEC_INT8_KERNEL`` (e.g. ``fbgemm/7``) overrides the choice. The table :data:`KERNELS`
has one entry per CPU architecture; an architecture without an entry (aarch64 today) gets no
int8.

**One epilogue for every library.** Both libraries are given the same codes (quantized here,
rounding half up) and unit weight scales, so each returns float32(Σ (code − zero)·w), the
exact integer dot product rounded once; the per-channel and per-code scales are applied
afterwards, the same way for every library. Two libraries then compute the same layer bit
for bit, and a **mixed** kernel (``fbgemm+onednn/8``) may run each pass on the library that
is faster for its number of rows: fbgemm's matrix-vector code for one-row decoding steps,
oneDNN's (AMX or VNNI) matrix-matrix code for the passes that score several tokens.
Where one library is faster at a pass size depends on the CPU and on the model (a model's
weights stream from memory, which a single small layer does not show), so the rows from
which the second library runs are timed on the model's own layers at its first load
(:func:`verispec.models.native.linear.split_pass_sizes`).

**verispec's own library.** ``verispec`` (:mod:`~verispec.models.native.gemm_kernel`) is a
matmul for passes of a few rows that reads every weight once for up to 9 rows of codes; it
returns the same float32 of the exact integer sum, so it enters the table as the narrow
library of mixed kernels: ``verispec+onednn/8`` first (VNNI), ``verispec+onednn/7`` after
``fbgemm+onednn/7`` (its AVX2 path ran slower than fbgemm's under the ISA caps of a VNNI
CPU, so it is there to be proven and chosen by ``VERISPEC_INT8_KERNEL``).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import verispec.models.native.gemm_kernel as gemm_kernel
import verispec.models.native.onednn as onednn
from verispec.telemetry.machine import cpu_info

__all__ = ["ALL_ROWS", "KERNELS", "KERNEL_ENV", "NO_ROWS", "Int8Kernel", "choose",
           "exactness_error", "library_of", "matmul", "median_seconds", "pack", "pack_all", "parse",
           "product", "proven", "record", "recorded", "report", "signature", "varying_pass_sizes"]

KERNEL_ENV = "VERISPEC_INT8_KERNEL"  # overrides the choice: library/bits, e.g. fbgemm/7
#: what oneDNN, fbgemm and verispec's own kernel read to cap the instruction set they use
ISA_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "FBGEMM_ENABLE_INSTRUCTIONS",
           gemm_kernel.GEMM_ENV)
SELF_TEST_K = 256  # input width of the adversarial product (|result| < 2^24: exact in float32)
SELF_TEST_ROWS = (1, 3, 8, 37)  # pass sizes the adversarial product is run at
#: rows from which a mixed kernel's second library runs in the self-test (so both run)
SELF_TEST_WIDE_FROM = 3
ALL_ROWS = 1  # ``wide_from`` that runs every pass on a mixed kernel's second library
NO_ROWS = 2**62  # ``wide_from`` that runs every pass on its first library
#: [N, K] of the random layers a kernel must be batch-invariant on (small layers take other
#: code paths: oneDNN's AMX and VNNI paths scaled differently at 256 x 1536)
INVARIANCE_SHAPES = ((64, 32), (32, 64), (256, 256), (256, 1536))
INVARIANCE_ROWS = (1, 2, 3, 4, 5, 8, 9, 17, 33)  # pass sizes compared with one full pass
INVARIANCE_FULL = 64
TIMING_SHAPE = (4096, 1024)  # [N, K] of the layer the candidates are timed on
TIMING_ROWS = (1, 4)  # the pass sizes decoding uses most
TIMING_REPEATS = 15


@dataclass(frozen=True)
class Int8Kernel:
    """An int8 matmul library and the width of the activation codes it is fed."""

    library: str  # "onednn" | "fbgemm": runs every pass (a mixed kernel: the narrow ones)
    bits: int  # 8: codes 1..255 around 128; 7: codes 1..127 around 64
    wide: str | None = None  # a mixed kernel's library for passes of many rows

    @property
    def libraries(self) -> tuple[str, ...]:
        """The libraries whose packed weights a layer holds: (library,) or (library, wide)."""
        return (self.library,) if self.wide is None else (self.library, self.wide)

    @property
    def name(self) -> str:
        """The libraries joined by ``+`` (``fbgemm+onednn``): how tables and files name it."""
        return "+".join(self.libraries)

    @property
    def saves_packed(self) -> bool:
        """Its layers are cached in packed form (oneDNN alone: packing takes seconds);
        fbgemm and mixed kernels cache the int8 weights and pack them at load."""
        return self.libraries == ("onednn",)

    @property
    def x_scale(self) -> float:
        """The value of one code step for an input in [-1, 1]."""
        return 1.0 / (2 ** (self.bits - 1) - 1)

    @property
    def x_zero(self) -> int:
        """The code of 0."""
        return 2 ** (self.bits - 1)

    def __str__(self) -> str:
        return f"{self.name}/{self.bits}"


#: candidates per CPU architecture, in order of preference when timings tie; a proven mixed
#: kernel is preferred to its libraries alone (its timing per model may still use one only)
KERNELS: dict[str, tuple[Int8Kernel, ...]] = {
    "x86_64": (Int8Kernel("verispec", 8, "onednn"), Int8Kernel("fbgemm", 8, "onednn"),
               Int8Kernel("onednn", 8), Int8Kernel("fbgemm", 8),
               Int8Kernel("fbgemm", 7, "onednn"), Int8Kernel("verispec", 7, "onednn"),
               Int8Kernel("fbgemm", 7), Int8Kernel("onednn", 7)),
}


def _arch() -> str:
    machine = platform.machine().lower()
    return "x86_64" if machine in ("x86_64", "amd64") else machine


def _present(kernel: Int8Kernel) -> bool:
    """Every library of ``kernel`` is in this torch build."""
    return all(onednn.available() if library == "onednn"
               else gemm_kernel.available() if library == "verispec"
               else "fbgemm" in torch.backends.quantized.supported_engines
               for library in kernel.libraries)


def parse(text: str) -> Int8Kernel:
    """``library/bits`` (``onednn/8``, ``fbgemm/7``, ...) -> a kernel of the table."""
    known = [k for ks in KERNELS.values() for k in ks]
    for k in known:
        if str(k) == text.strip():
            return k
    raise ValueError(f"unknown int8 kernel {text!r}; one of {', '.join(map(str, known))}")


# -- running one -------------------------------------------------------------------------------


def pack(library: str, qweight: Tensor) -> object:
    """``library``'s packed form of int8 weights [N, K], with unit weight scales (the scales
    are applied after the product, the same way for every library: :func:`matmul`)."""
    if library == "onednn":
        return onednn.pack(qweight)
    if library == "verispec":
        return gemm_kernel.pack(qweight)
    with warnings.catch_warnings():  # quantized tensors are announced as moving to torchao
        warnings.simplefilter("ignore")
        n = qweight.shape[0]
        q = torch._make_per_channel_quantized_tensor(
            qweight, torch.ones(n, dtype=torch.float64), torch.zeros(n, dtype=torch.int64), 0)
        return torch.ops.quantized.linear_prepack(q, None)


def pack_all(kernel: Int8Kernel, qweight: Tensor) -> dict[str, object]:
    """{library: packed weights} for every library of ``kernel``."""
    return {library: pack(library, qweight) for library in kernel.libraries}


def matmul(kernel: Int8Kernel, packed: dict[str, object], u: Tensor, a: Tensor,
           out_scale: Tensor, half: Tensor, wide_from: int = NO_ROWS) -> Tensor:
    """[M, N]: Σ_k code(u[m, k] / a[m]) · W[n, k] · out_scale[n] for inputs ``u`` [M, K] and
    their row max-abs ``a`` [M, 1] (so u / a lies in [-1, 1]); ``out_scale`` [N]: each
    weight row's scale times x_scale; ``packed``: the packed weights per library
    (:func:`pack_all`); ``half`` the scalar x_zero + 0.5. A mixed kernel runs passes of
    ``wide_from`` rows or more on its second library.

    Codes are trunc(u / a / x_scale + x_zero + 0.5), made here for every library; each
    library returns float32 of the exact integer product (unit scales), and the scales are
    applied here: the libraries agree bit for bit (with AMX, oneDNN's own scaling rounded
    differently on its AMX and AVX-512 VNNI paths, so rows saw each other)."""
    library = library_of(kernel, u.shape[0], wide_from)
    codes = torch.addcdiv(half, u, a, value=1.0 / kernel.x_scale)  # [M, K], code + fraction
    if library != "fbgemm":
        codes = codes.to(torch.uint8)
    else:  # fbgemm quantizes its float input itself: give it integers (code − x_zero)
        codes = codes.trunc_().sub_(kernel.x_zero)
    return product(kernel, packed, codes, out_scale, library)


def library_of(kernel: Int8Kernel, rows: int, wide_from: int = NO_ROWS) -> str:
    """The library that runs a pass of ``rows`` rows: a mixed kernel's second one from
    ``wide_from`` rows on."""
    return kernel.wide if kernel.wide is not None and rows >= wide_from else kernel.library


def product(kernel: Int8Kernel, packed: dict[str, object], codes: Tensor, out_scale: Tensor,
            library: str) -> Tensor:
    """[M, N]: the integer product of ``codes`` [M, K] with the weights, times ``out_scale``
    [N]. The codes as ``library`` takes them: uint8 for oneDNN and verispec's kernel, float32
    code − x_zero for fbgemm (which quantizes its float input itself, exactly for integers)."""
    n = out_scale.numel()
    if library == "verispec":  # the same rounding, with out_scale applied in the kernel
        return gemm_kernel.matmul(codes, kernel.x_zero, packed["verispec"], out_scale)
    if library == "onednn":
        acc = torch.ops.onednn.qlinear_pointwise(
            codes, 1.0, kernel.x_zero, packed["onednn"], _unit(n), _zeros(n),
            None, 1.0, 0, torch.float32, "none", [], "")  # [M, N]
    else:
        acc = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            codes, 1.0, kernel.x_zero, packed["fbgemm"])
    return acc.mul_(out_scale)


@cache
def _zeros(n: int) -> Tensor:
    """[n] int64 zeros: the weights' zero points oneDNN is given."""
    return torch.zeros(n, dtype=torch.int64)


@cache
def _unit(n: int) -> Tensor:
    """[n] float32 ones: the weight scales oneDNN is given (:func:`matmul`)."""
    return torch.ones(n)


# -- proving and timing ----------------------------------------------------------------------


def _adversarial() -> tuple[Tensor, Tensor]:
    """(weights int8 [6, K], inputs [6, K] in [-1, 1]): every sign pattern of ±127 weights
    against inputs at the extreme codes, where a saturating int16 pair sum is furthest off."""
    k = SELF_TEST_K
    w = torch.full((6, k), 127, dtype=torch.int8)
    w[1] = -127
    w[2, ::2] = -127
    w[3, 1::2] = -127
    w[4, : k // 2] = -127
    w[5] = torch.where(torch.arange(k) % 3 == 0, -127, 127).to(torch.int8)
    v = torch.ones(6, k)
    v[1] = -1.0
    v[2, ::2] = -1.0
    v[3, 1::2] = -1.0
    v[4, k // 2:] = -1.0
    v[5] = torch.where(torch.arange(k) % 4 == 0, 1.0, -1.0)
    return w, v


def exactness_error(kernel: Int8Kernel) -> float:
    """Max relative error of ``kernel`` on the adversarial product at every pass size of
    :data:`SELF_TEST_ROWS` (0.0 up to float32 rounding: about 1e-7 where it is exact)."""
    w, v = _adversarial()
    scale = torch.full((w.shape[0],), kernel.x_scale)  # [6] unit weight scales × x_scale
    half = torch.tensor(kernel.x_zero + 0.5)
    packed = pack_all(kernel, w)
    worst = 0.0
    for rows in SELF_TEST_ROWS:
        x = v.repeat(-(-rows // v.shape[0]), 1)[:rows]  # [rows, K]
        codes = torch.round(x.double() / kernel.x_scale)  # code − zero point
        exact = codes @ w.double().T * kernel.x_scale  # [rows, 6]
        got = matmul(kernel, packed, x, torch.ones(rows, 1), scale, half,
                     SELF_TEST_WIDE_FROM).double()
        worst = max(worst, float((got - exact).abs().max() / exact.abs().max()))
    return worst


EXACT_TOLERANCE = 1e-5  # relative; float32 rounding is ~1e-7, a saturated pair ~1e-1 or more


def varying_pass_sizes(kernel: Int8Kernel) -> list[int]:
    """The pass sizes of :data:`INVARIANCE_ROWS` at which some row of a random layer (each
    shape of :data:`INVARIANCE_SHAPES`) comes out other than in one pass of
    :data:`INVARIANCE_FULL` rows, bit for bit (empty: rows never see each other). A library
    may run other code paths for other pass sizes and layer shapes; exact integer products
    are not enough if the float epilogue then rounds differently. A mixed kernel runs its
    second library from :data:`SELF_TEST_WIDE_FROM` rows, so its two libraries must agree."""
    g = torch.Generator().manual_seed(0)
    varying: set[int] = set()
    for n, k in INVARIANCE_SHAPES:
        w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
        scale = (torch.rand(n, generator=g) * 0.01 + 1e-3) * kernel.x_scale  # [N]
        half, packed = torch.tensor(kernel.x_zero + 0.5), pack_all(kernel, w)
        x = torch.randn((INVARIANCE_FULL, k), generator=g)  # [M, K]
        a = x.abs().amax(1, keepdim=True)  # [M, 1]
        full = matmul(kernel, packed, x, a, scale, half, SELF_TEST_WIDE_FROM)  # [M, N]
        varying |= {m for m in INVARIANCE_ROWS if not torch.equal(
            matmul(kernel, packed, x[:m], a[:m], scale, half, SELF_TEST_WIDE_FROM), full[:m])}
    return sorted(varying)


@cache
def _self_test() -> dict[Int8Kernel, float | str]:
    """Every kernel of this CPU's table: its :func:`exactness_error`, or why it has none
    (its library is absent from this torch, cannot run here at all, or its rows see each
    other: :func:`varying_pass_sizes`)."""
    out: dict[Int8Kernel, float | str] = {}
    for kernel in KERNELS.get(_arch(), ()):
        if not _present(kernel):
            out[kernel] = (f"verispec's kernel {gemm_kernel.status()}"
                           if "verispec" in kernel.libraries and not gemm_kernel.available()
                           else "not in this torch")
            continue
        try:
            out[kernel] = exactness_error(kernel)
            varying = varying_pass_sizes(kernel)
        except RuntimeError as exc:
            out[kernel] = f"cannot run ({exc})"
            continue
        if varying:
            out[kernel] = (f"rows see each other: passes of {', '.join(map(str, varying))} "
                           f"rows differ from one of {INVARIANCE_FULL}")
    return out


@cache
def proven() -> tuple[Int8Kernel, ...]:
    """The kernels of this CPU's table that are present in this torch and exact here."""
    return tuple(k for k, error in _self_test().items()
                 if isinstance(error, float) and error <= EXACT_TOLERANCE)


def _time(kernel: Int8Kernel) -> float:
    """Median seconds of one pass summed over :data:`TIMING_ROWS` on a random layer."""
    g = torch.Generator().manual_seed(0)
    n, k = TIMING_SHAPE
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.full((n,), 0.01 * kernel.x_scale)
    half, packed = torch.tensor(kernel.x_zero + 0.5), pack_all(kernel, w)
    total = 0.0
    for rows in TIMING_ROWS:
        x, ones = torch.rand((rows, k), generator=g) * 2 - 1, torch.ones(rows, 1)
        total += median_seconds(
            lambda: matmul(kernel, packed, x, ones, scale, half))  # noqa: B023
    return total


@cache
def signature() -> str:
    """What a packed layout and the exactness of a code width depend on: torch (which pins
    oneDNN and fbgemm), the CPU's vector flags, the ISA caps in the environment, what the
    self-test found and verispec's own kernel (its source and instruction set: the timings
    recorded under this signature are of that code)."""
    flags = " ".join(sorted(x for x in cpu_info().flags
                            if x.startswith(("avx", "amx", "fma", "f16c"))))
    caps = ",".join(f"{e}={os.environ.get(e, '')}" for e in ISA_ENV)
    text = (f"{torch.__version__}|{_arch()}|{flags}|{caps}|{','.join(map(str, proven()))}|"
            f"{gemm_kernel.identity()}")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _record_file(name: str) -> Path:
    from verispec.models.fetch import cache_dir

    return cache_dir() / "quantized" / f"{name}-{signature()}.json"


def _choice_file() -> Path:
    return _record_file("int8-kernel")


def recorded(name: str, measure: Callable[[], dict[str, Any]],
             valid: Callable[[dict[str, Any]], bool] = lambda _: True) -> dict[str, Any]:
    """A measurement made once per machine :func:`signature`: the record ``name`` in
    verispec's cache directory where it exists and ``valid`` accepts it, else ``measure()``,
    written there (atomically: a concurrent reader sees the old record or the new)."""
    file = _record_file(name)
    try:
        record = json.loads(file.read_text())
        if isinstance(record, dict) and valid(record):
            return record
    except (OSError, ValueError, KeyError, TypeError):
        pass
    record = measure()
    from verispec.models.fetch import save_record

    save_record(file, record)
    return record


def median_seconds(call: Callable[[], object], repeats: int = TIMING_REPEATS) -> float:
    """Median wall time of ``call()`` over ``repeats`` runs, the first two left out."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:])


def _timed_choice(candidates: list[Int8Kernel]) -> tuple[Int8Kernel, str]:
    """The fastest of ``candidates``, timed once per machine signature and recorded."""
    names = [str(k) for k in candidates]

    def measure() -> dict[str, Any]:
        times = {str(k): _time(k) for k in candidates}
        best = min(candidates, key=lambda k: times[str(k)])
        shown = ", ".join(f"{name} {t * 1e3:.2f} ms" for name, t in times.items())
        reason = f"fastest here ({shown}; rows {'+'.join(map(str, TIMING_ROWS))})"
        return {"kernel": str(best), "reason": reason, "times": times}

    record = recorded("int8-kernel", measure, lambda r: r.get("kernel") in names)
    return parse(record["kernel"]), str(record["reason"])


def choose() -> tuple[Int8Kernel | None, str]:
    """(the int8 kernel to use here, why), or (None, why there is none)."""
    if _arch() not in KERNELS:
        return None, (f"no int8 kernel for {platform.machine()} CPUs (x86-64 only; an ARM "
                      "entry would use PyTorch's KleidiAI kernels)")
    ok = proven()
    override = os.environ.get(KERNEL_ENV)
    if override:
        kernel = parse(override)
        if kernel not in ok:
            found = _self_test().get(kernel, "not in this CPU's table")
            why = f"error {found:.2g}" if isinstance(found, float) else found
            raise ValueError(f"{KERNEL_ENV}={override}: {kernel} is not exact on this CPU "
                             f"({why}; proven here: {', '.join(map(str, ok)) or 'none'})")
        return kernel, f"{kernel} ({KERNEL_ENV})"
    if not ok:
        return None, "no int8 kernel of this torch computes exact integer products on this CPU"
    bits = max(k.bits for k in ok)
    widest = [k for k in ok if k.bits == bits]
    why = ("8-bit codes: the kernels accumulate in int32 here (VNNI)" if bits == 8 else
           "7-bit codes: 8-bit codes saturate int16 pair sums without VNNI")
    mixed = [k for k in widest if k.wide is not None]
    if mixed:
        return mixed[0], (f"{mixed[0]}; {why}; the libraries agree bit for bit here, so each "
                          "pass runs on the faster one for its rows (timed per model)")
    if len(widest) == 1:
        return widest[0], f"{widest[0]}; {why}"
    kernel, timing = _timed_choice(widest)
    return kernel, f"{kernel}; {why}; {timing}"


def record() -> dict[str, Any]:
    """What :func:`choose` sees on this CPU, as data (``verispec models kernels --out``): the
    ISA caps in the environment, every kernel of this CPU's table with its max relative error
    on the adversarial product (None where it could not run, with the reason as its verdict)
    and its verdict (exact, or refused), and the choice with its reason."""
    kernels = []
    for kernel, error in _self_test().items():
        failed = isinstance(error, str)
        verdict = error if failed else "exact" if kernel in proven() else "refused"
        kernels.append({"kernel": kernel.name, "bits": kernel.bits,
                        "error": None if failed else error, "verdict": verdict})
    kernel, why = choose()
    return {"caps": {e: os.environ[e] for e in ISA_ENV if os.environ.get(e)},
            "kernels": kernels, "chosen": None if kernel is None else str(kernel), "why": why}


def report(data: dict[str, Any] | None = None) -> list[str]:
    """A :func:`record` (this CPU's when None) as text lines: the caps, a table of the
    kernels and their verdicts, and the choice (``verispec models kernels``)."""
    data = record() if data is None else data
    caps = ", ".join(f"{e}={v}" for e, v in data["caps"].items()) or "none"
    lines = [f"ISA caps: {caps}", "| kernel | codes | max relative error | here |",
             "|---|---|---|---|"]
    for row in data["kernels"]:
        shown = "–" if row["error"] is None else f"{row['error']:.2g}"
        lines.append(f"| {row['kernel']} | {row['bits']} bits | {shown} | {row['verdict']} |")
    lines.append(f"chosen: {data['chosen'] or 'none'} ({data['why']})")
    return lines
