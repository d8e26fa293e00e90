"""verispec's int4 kernel: exact integer products on every instruction set this CPU runs
it with, rows independent of the pass, refusal of instruction sets it does not run, and the
fallback to torch's kernel."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from native_support import cpu_flags, kernel_status_in_a_process

from verispec.models.native import int4_kernel
from verispec.models.native.linear import Int4Linear, int4_available

X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not (X86 and int4_available()),
                                reason="x86-64 with torch's CPU int4 kernel only")


def _expected_isa() -> int:
    f = cpu_flags()
    if {"avx512f", "avx512bw", "avx512_vnni", "f16c"} <= f:
        return 2
    return 1 if {"avx2", "fma", "f16c"} <= f else 0


RUNS = [i for i in int4_kernel.ISAS if i <= _expected_isa()]  # what this CPU may use
REFUSED = [i for i in (1, 2, 3) if i not in RUNS]  # what it must refuse


def _layer(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """codes [N, K] 0..15, scale and lo [N, K / 64] as float16 values."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (n, k), generator=g)
    scale = (torch.rand((n, k // 64), generator=g) * 0.01 + 1e-3).half().float()
    lo = (torch.randn((n, k // 64), generator=g) * 0.05).half().float()
    return codes, scale, lo


def _reference(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor,
               lo: torch.Tensor) -> torch.Tensor:
    """What the kernel computes, in float64: each group of x rounded to int8 by its max-abs,
    exact integer dots with the codes, then the scales; the lo term from x's own sums."""
    m, k = x.shape
    xg = x.double().view(m, k // 64, 64)  # [M, G, 64]
    a = xg.abs().amax(-1) / 127  # [M, G]
    xq = torch.round(xg / a.clamp_min(1e-30)[..., None])  # [M, G, 64] integers
    cg = codes.double().view(codes.shape[0], k // 64, 64)  # [N, G, 64]
    dots = torch.einsum("mgk,ngk->mng", xq, cg)  # exact integers
    return (dots * a[:, None, :] * scale.double()[None]).sum(-1) + \
        xg.sum(-1) @ lo.double().T  # [M, N]


def test_the_kernel_is_built_and_runs_what_this_cpu_has() -> None:
    """Where a C compiler exists the kernel builds; its best instruction set is the one the
    CPU's flags promise (AVX-512 VNNI, else AVX2)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None and not os.environ.get("CC"):
        assert not int4_kernel.available() and "no C compiler" in int4_kernel.status()
        return
    assert int4_kernel.available(), int4_kernel.status()
    asked = os.environ.get("VERISPEC_INT4_KERNEL") == "avx2"  # AVX2 even with VNNI
    assert int4_kernel.isa() == (min(_expected_isa(), 1) if asked else _expected_isa())
    assert int4_kernel.ISAS[int4_kernel.isa()] in int4_kernel.status()


@pytest.mark.parametrize("use_isa", RUNS)
def test_integer_products_are_exact_at_the_extremes(use_isa: int) -> None:
    """Codes at 15 against activations at ±127 (every sign pattern): the most a pair of
    products or the AVX2 path's int16 sums reach. A saturating sum would be far off."""
    if not int4_kernel.available():
        pytest.skip(int4_kernel.status())
    k = 256
    codes = torch.full((32, k), 15)
    codes[1::2, ::3] = 0  # rows with holes
    ones = torch.ones((32, k // 64))
    x = torch.ones((6, k))
    x[1] = -1
    x[2, ::2] = -1
    x[3, : k // 2] = -1
    x[4, 1::2] = -1
    x[5] = torch.where(torch.arange(k) % 3 == 0, -1.0, 1.0)
    packed = int4_kernel.pack(codes, ones, torch.zeros_like(ones))
    y = int4_kernel.matmul(x, packed, use_isa=use_isa)  # [6, 32]
    exact = x.double() @ codes.double().T  # integers: xq = ±127 at scale 1/127
    # float32 rounding of the scales only (a saturated int16 sum would be off by thousands)
    assert (y.double() - exact).abs().max() <= 1e-6 * 15 * k
    assert exact.abs().max() == 15 * k


@pytest.mark.parametrize("use_isa", RUNS)
@pytest.mark.parametrize("rows", [1, 2, 5, 6, 8])
def test_matches_its_reference_for_every_row_count(use_isa: int, rows: int) -> None:
    if not int4_kernel.available():
        pytest.skip(int4_kernel.status())
    codes, scale, lo = _layer(48, 320, seed=rows)
    packed = int4_kernel.pack(codes, scale, lo)
    g = torch.Generator().manual_seed(100 + rows)
    x = torch.randn((rows, 320), generator=g)
    ref = _reference(x, codes, scale, lo)
    bias, residual = torch.randn(48, generator=g), torch.randn((rows, 48), generator=g)
    tol = 1e-5 * float(ref.abs().max())
    assert (int4_kernel.matmul(x, packed, use_isa=use_isa) - ref).abs().max() <= tol
    both = int4_kernel.matmul(x, packed, bias, residual, use_isa=use_isa)
    assert (both - (ref + bias + residual)).abs().max() <= tol
    norm = torch.rand(320, generator=g) + 0.5
    u = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm
    normed = int4_kernel.matmul(x, packed, norm=norm, eps=1e-6, use_isa=use_isa)
    ref_u = _reference(u, codes, scale, lo)
    assert (normed - ref_u).abs().max() <= 1e-4 * float(ref_u.abs().max())
    gate_up = torch.randn((rows, 640), generator=g) * 4  # a gated MLP's gate and up halves
    gate_up[0, :3] = torch.tensor([-200.0, 200.0, 0.0])  # exp's far ends: silu 0, x, 0
    gated = int4_kernel.matmul(gate_up, packed, bias, residual, glu=True, use_isa=use_isa)
    h = torch.nn.functional.silu(gate_up[:, :320]) * gate_up[:, 320:]
    ref_h = _reference(h, codes, scale, lo) + bias + residual
    assert (gated - ref_h).abs().max() <= 1e-4 * float(ref_h.abs().max())
    alone = int4_kernel.matmul(gate_up[-1:], packed, bias, residual[-1:], glu=True,
                               use_isa=use_isa)
    assert torch.equal(alone, gated[-1:])  # a gated row is rounded alone too


def test_refuses_what_it_does_not_take() -> None:
    if not int4_kernel.available():
        pytest.skip(int4_kernel.status())
    packed = int4_kernel.pack(*_layer(16, 64))
    for use_isa in REFUSED:  # an instruction set this CPU lacks is refused, not emulated
        with pytest.raises(ValueError, match="instruction set"):
            int4_kernel.matmul(torch.randn(1, 64), packed, use_isa=use_isa)
    with pytest.raises(ValueError, match="N % 16"):
        int4_kernel.pack(*_layer(8, 64))
    with pytest.raises(ValueError, match="not both"):  # a norm of the gated product: no
        int4_kernel.matmul(torch.randn(1, 128), packed, norm=torch.ones(64), glu=True)


@pytest.mark.parametrize("use_isa", RUNS)
def test_a_row_gives_the_same_bits_in_any_pass(use_isa: int) -> None:
    """A row's result is what it is alone, whatever the pass around it: one tile, several
    tiles of equal rows, blocks of 16 weight rows shared unevenly by threads. This
    is what lets a target run int4 (a verification pass equals one token at a time)."""
    if not int4_kernel.available():
        pytest.skip(int4_kernel.status())
    codes, scale, lo = _layer(80, 640, seed=3)  # 5 blocks of 16 weight rows: 3 + 2 on 2 threads
    packed = int4_kernel.pack(codes, scale, lo)
    g = torch.Generator().manual_seed(7)
    x = torch.randn((19, 640), generator=g)
    x[4, 5] = 40.0  # an outlier in one row's group changes that row's scale only
    norm, bias = torch.rand(640, generator=g) + 0.5, torch.randn(80, generator=g)
    alone = torch.cat([int4_kernel.matmul(x[i: i + 1], packed, bias, norm=norm,
                                          use_isa=use_isa) for i in range(19)])
    before = torch.get_num_threads()
    # with AVX-512 VNNI one tile up to 8 rows, then 5 + 4, 6 + 6 + 5, 7 + 6 + 6; with AVX2
    # one tile up to 6 rows, then 4 + 3, 4 + 4, 5 + 4, 6 + 6 + 5, 5 + 5 + 5 + 4
    for m in (2, 6, 7, 8, 9, 17, 19):
        for threads in (1, 2):
            torch.set_num_threads(threads)
            try:
                out = int4_kernel.matmul(x[:m], packed, bias, norm=norm, use_isa=use_isa)
            finally:
                torch.set_num_threads(before)
            assert torch.equal(out, alone[:m]), (m, threads)


def test_an_int4_layer_runs_it_for_every_pass() -> None:
    if not int4_kernel.available():
        pytest.skip(int4_kernel.status())
    torch.manual_seed(0)
    w, bias = torch.randn(64, 128) * 0.05, torch.randn(64)
    lin = Int4Linear.quantize(w, bias)
    assert lin.lanes is not None
    state = lin.state("p")
    again = Int4Linear.from_state(state, "p", 1e-6)
    assert again.lanes is not None and all(torch.equal(a, b) for a, b in
                                           zip(again.lanes, lin.lanes, strict=True))
    short, long = torch.randn(3, 128), torch.randn(int4_kernel.TILE_ROWS + 4, 128)
    assert torch.equal(lin(short), int4_kernel.matmul(short, lin.lanes, lin.bias))
    assert torch.equal(lin(long), int4_kernel.matmul(long, lin.lanes, lin.bias))
    torch_out = torch.ops.aten._weight_int4pack_mm_for_cpu(
        long.bfloat16(), lin.packed, lin.group, lin.scales).float() + lin.bias
    assert not torch.equal(lin(long), torch_out)  # torch's kernel rounds otherwise
    groups = w.view(64, 2, 64)  # the layer's own codes, dequantized (as Int4Linear.quantize)
    lo = groups.amin(-1)
    scale = ((groups.amax(-1) - lo) / 15).clamp_min(1e-8)
    codes = torch.round((groups - lo[..., None]) / scale[..., None]).clamp(0, 15)
    deq = (codes * scale[..., None] + lo[..., None]).view(64, 128)
    for out, x in ((lin(short), short), (lin(long), long)):  # both near the int4 matrix
        ref = x @ deq.T + bias  # int8 or bfloat16 activations: within 2%
        assert (out - ref).abs().max() <= 0.02 * ref.abs().max()
    residual = torch.randn(3, 64)
    assert torch.allclose(lin.add_to(residual, short), residual + lin(short), atol=1e-5)


def _status_in_a_process(env: dict[str, str]) -> str:
    return kernel_status_in_a_process("int4_kernel", env)


def test_torch_kernel_runs_where_asked_or_where_the_build_fails(tmp_path: Path) -> None:
    asked = _status_in_a_process({"VERISPEC_INT4_KERNEL": "torch"})
    assert asked.startswith("False") and "VERISPEC_INT4_KERNEL=torch" in asked
    broken = _status_in_a_process({"CC": str(tmp_path / "no-such-compiler"),
                                   "VERISPEC_CACHE": str(tmp_path / "cache")})
    assert broken.startswith("False") and "did not build" in broken


def test_the_avx2_path_runs_where_asked() -> None:
    """``VERISPEC_INT4_KERNEL=avx2`` runs the path of CPUs without VNNI on any AVX2 CPU."""
    if _expected_isa() < 1:
        pytest.skip("no AVX2")
    out = _status_in_a_process({"VERISPEC_INT4_KERNEL": "avx2"})
    assert out.startswith("True") and "(avx2" in out
    with pytest.raises(subprocess.CalledProcessError):
        _status_in_a_process({"VERISPEC_INT4_KERNEL": "fast"})
