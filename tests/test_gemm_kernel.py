"""verispec's own int8 matmul (``gemm_kernel``, the ``verispec`` library of the int8 table):
the exact integer product, rounded once and scaled once, on every instruction set this CPU
runs it with; the same bits as oneDNN and fbgemm; rows independent of the pass and of the
threads; 8-bit codes saturating on its AVX2 path (why the table refuses them there); refusal
of what it does not take."""

from __future__ import annotations

import os
import platform
import shutil

import pytest
import torch
from native_support import kernel_status_in_a_process

import verispec.models.native.kernels as kernels
from verispec.models.native import gemm_kernel
from verispec.models.native.kernels import Int8Kernel
from verispec.telemetry.machine import cpu_info

X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not X86, reason="verispec's int8 matmul is for x86-64")
needs_kernel = pytest.mark.skipif(not gemm_kernel.available(), reason=gemm_kernel.status())


def _expected_isa() -> int:
    flags = cpu_info().flags
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        return 2
    return 1 if "avx2" in flags else 0


RUNS = [i for i in gemm_kernel.ISAS if i <= _expected_isa()]  # what this CPU may use
WIDTHS = {8: 128, 7: 64}  # code bits -> zero point
#: [N, K]: a panel and a half, channels not a multiple of 4, one row, a model-sized layer
SHAPES = ((48, 13), (1, 4), (37, 130), (256, 1536))
ROWS = (1, 2, 5, 9, 10, 19)  # one tile, a full tile, tiles of equal rows (10: 5 + 5)


def _layer(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    return w, torch.rand(n, generator=g) * 0.01 + 1e-4  # [N, K] int8, [N] float32


def _codes(m: int, k: int, bits: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, 2**bits, (m, k), generator=g, dtype=torch.uint8)  # [M, K]


def _exact(codes: torch.Tensor, zero: int, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32(Σ (codes − zero) w) · scale: the integer sum exact in float64 (|sum| < 2^53),
    rounded to float32 once, then one float32 multiplication."""
    return ((codes.double() - zero) @ w.double().T).float() * scale  # [M, N]


def test_the_kernel_is_built_and_runs_what_this_cpu_has() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("CC"):
        assert not gemm_kernel.available() and "no C compiler" in gemm_kernel.status()
        return
    assert gemm_kernel.available(), gemm_kernel.status()
    capped = os.environ.get(gemm_kernel.GEMM_ENV) == "avx2"
    assert gemm_kernel.isa() == (min(_expected_isa(), 1) if capped else _expected_isa())
    assert gemm_kernel.ISAS[gemm_kernel.isa()] in gemm_kernel.status()


#: (instruction set, code bits) the kernel is exact with: 8-bit codes on the VNNI path only
#: (the AVX2 path saturates them: test_extreme_codes_are_exact_where_the_width_is_allowed)
EXACT = [(i, b) for i in RUNS for b in (8, 7) if not (b == 8 and i == 1)]


@needs_kernel
@pytest.mark.parametrize(("use_isa", "bits"), EXACT)
def test_products_are_exact_rounded_once_and_scaled_once(use_isa: int, bits: int) -> None:
    """Every shape and pass size: the bits of the exact integer product, rounded once and
    scaled once."""
    for n, k in SHAPES:
        w, scale = _layer(n, k)
        packed = gemm_kernel.pack(w)
        for m in ROWS:
            codes = _codes(m, k, bits)
            got = gemm_kernel.matmul(codes, WIDTHS[bits], packed, scale, use_isa=use_isa)
            assert torch.equal(got, _exact(codes, WIDTHS[bits], w, scale)), (n, k, m)


def _adversarial(k: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [4, K] at ±127 in every sign pattern, codes [4, K] at the extremes)."""
    w = torch.full((4, k), 127, dtype=torch.int8)
    w[1] = -127
    w[2, ::2] = -127
    w[3, 1::2] = -127
    return w, torch.tensor([255, 1, 255, 1], dtype=torch.uint8)[:, None].repeat(1, k)


@needs_kernel
@pytest.mark.parametrize("use_isa", RUNS)
def test_extreme_codes_are_exact_where_the_width_is_allowed(use_isa: int) -> None:
    """Weights ±127 against codes at the extremes: exact for 7-bit codes on every path and
    for 8-bit codes on the VNNI path; 8-bit codes on the AVX2 path add pairs of products
    into a saturating int16 and come out far off, which the table's self-test sees."""
    w, extremes = _adversarial()
    ones = torch.ones(w.shape[0])
    for bits in (7, 8):
        zero = WIDTHS[bits]
        codes = extremes if bits == 8 else (extremes.long() // 2 + 1).to(torch.uint8)  # 1..128
        codes = codes.clamp(max=2**bits - 1)
        got = gemm_kernel.matmul(codes, zero, gemm_kernel.pack(w), ones, use_isa=use_isa)
        exact = _exact(codes, zero, w, ones)
        error = float((got - exact).abs().max() / exact.abs().max())
        if bits == 8 and use_isa == 1:
            assert error > 1e-2
        else:
            assert error == 0.0, (bits, use_isa)


@needs_kernel
def test_rows_do_not_depend_on_the_pass_or_the_threads() -> None:
    """A row's result is the same bits alone, in any pass, with one thread or two."""
    w, scale = _layer(96, 200)
    packed, codes = gemm_kernel.pack(w), _codes(19, 200, 8 if 2 in RUNS else 7)
    zero = 128 if 2 in RUNS else 64
    full = gemm_kernel.matmul(codes, zero, packed, scale)
    for m in (1, 3, 9, 10):
        assert torch.equal(gemm_kernel.matmul(codes[m - 1:2 * m - 1], zero, packed, scale),
                           full[m - 1:2 * m - 1])
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(gemm_kernel.matmul(codes, zero, packed, scale), full)
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_the_same_bits_as_the_other_libraries() -> None:
    """Through the table's product, verispec's kernel gives oneDNN's and fbgemm's bits for
    every proven kernel of its code width: what lets a mixed kernel send each pass to either
    library."""
    w, scale = _layer(256, 1536)
    for kernel in kernels.proven():
        if "verispec" not in kernel.libraries:
            continue
        packed = kernels.pack_all(kernel, w)
        for m in (1, 4, 9, 20):
            codes = _codes(m, 1536, kernel.bits)
            out = {library: kernels.product(
                kernel, packed, codes if library != "fbgemm" else codes.float() - kernel.x_zero,
                scale * kernel.x_scale, library) for library in kernel.libraries}
            assert torch.equal(out["verispec"], out[kernel.wide]), (kernel, m)  # type: ignore[index]


@needs_kernel
def test_what_it_does_not_take_is_refused() -> None:
    w, scale = _layer(32, 8)
    packed = gemm_kernel.pack(w)
    with pytest.raises(ValueError, match="instruction set 3"):
        gemm_kernel.matmul(_codes(1, 8, 7), 64, packed, scale, use_isa=3)
    with pytest.raises(ValueError, match=r"code -3"):  # 200 − 64 does not fit an int8
        gemm_kernel.matmul(torch.full((1, 8), 200, dtype=torch.uint8), 64, packed, scale)
    with pytest.raises(ValueError, match="uint8 codes"):
        gemm_kernel.matmul(_codes(1, 8, 7).float(), 64, packed, scale)
    with pytest.raises(ValueError, match="uint8 codes"):  # the weights of another width
        gemm_kernel.matmul(_codes(1, 12, 7), 64, packed, scale)
    assert gemm_kernel.matmul(_codes(0, 8, 7), 64, packed, scale).shape == (0, 32)


def test_off_and_avx2_requests() -> None:
    """``VERISPEC_INT8_GEMM=off`` takes the kernel out of the table (its entries say why);
    ``avx2`` runs the AVX2 path on any CPU that has it; another value is an error."""
    text = kernel_status_in_a_process("gemm_kernel", {gemm_kernel.GEMM_ENV: "off"})
    assert text.startswith("False not offered (VERISPEC_INT8_GEMM=off)")
    if gemm_kernel.available():
        text = kernel_status_in_a_process("gemm_kernel", {gemm_kernel.GEMM_ENV: "avx2"})
        assert text.startswith("True verispec's int8 matmul (avx2")
    with pytest.raises(ValueError, match="auto, avx2 or off"):
        os.environ[gemm_kernel.GEMM_ENV] = "fast"
        try:
            gemm_kernel._requested()
        finally:
            del os.environ[gemm_kernel.GEMM_ENV]


def test_the_table_names_why_its_kernel_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where verispec's kernel is not offered, its table entries are absent with its reason
    and the other kernels are chosen as before."""
    monkeypatch.setattr(gemm_kernel, "_load", lambda: (None, "not offered (a test)"))
    kernels._self_test.cache_clear()
    kernels.proven.cache_clear()
    try:
        verdicts = kernels._self_test()
        for kernel in (Int8Kernel("verispec", 8, "onednn"), Int8Kernel("verispec", 7, "onednn")):
            assert verdicts[kernel] == "verispec's kernel not offered (a test)"
        assert all("verispec" not in k.libraries for k in kernels.proven())
    finally:
        kernels._self_test.cache_clear()
        kernels.proven.cache_clear()
