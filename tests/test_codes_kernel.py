"""verispec's fused int8 activation codes (``codes_kernel``): the torch operators' codes, a
row's codes independent of the batch and the threads, the same codes from every instruction
set this CPU runs, and the torch path where the kernel is not built or not wanted."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from native_support import kernel_status_in_a_process

from verispec.models.native import codes_kernel
from verispec.models.native.linear import Int8Linear, default_kernel
from verispec.models.native.weights import _online_rotation

HAS_CC = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))
needs_kernel = pytest.mark.skipif(not codes_kernel.available(), reason=codes_kernel.status())
#: torch's CPU capabilities in order; the kernel is built for each one this CPU runs
LEVELS = ("DEFAULT", "AVX2", "AVX512")
#: (name, K, rotation block: (p, hadamard) or None, RMSNorm in front, channel factors)
LAYERS = [
    ("norm", 1536, None, True, False),
    ("norm-factors", 1536, None, True, True),
    ("plain", 896, None, False, False),
    ("hadamard-16x16", 2048, (256, True), False, False),
    ("hadamard-8x8", 1536, (64, True), False, False),
    ("hadamard-16x8", 1024, (128, True), False, False),
    ("dense-64", 512, (64, False), False, False),
    ("factors-rotated", 1024, (64, True), False, True),
]


def _layer(k: int, block: tuple[int, bool] | None, norm: bool, factors: bool,
           n: int = 48) -> Int8Linear:
    g = torch.Generator().manual_seed(k)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, generator=g) * 0.01 + 1e-4
    weight = (torch.rand(k, generator=g) + 0.5) if factors else torch.ones(k) if norm else None
    rot, rot_b = _online_rotation(block[0], 1, block[1]) if block else (None, None)
    return Int8Linear.from_int8(w, scale, None, weight, 1e-6, default_kernel(), rot, False,
                                rot_b)


def _inputs(m: int, k: int, seed: int = 0) -> torch.Tensor:
    """[m, k] with a few outlier channels, as activations have."""
    g = torch.Generator().manual_seed(seed)
    outliers = 1.0 + 30.0 * (torch.rand(k, generator=g) < 0.01)
    return torch.randn((m, k), generator=g) * outliers


def _reference_codes(layer: Int8Linear, x: torch.Tensor, as_float: bool) -> torch.Tensor:
    """The codes the torch operators make (the steps of ``scaled_reference``)."""
    u = x if layer._factors is None else x * layer._factors
    if layer.rot is not None:
        u = layer._rotate(u)
    a = layer._row_scale(u)
    kern = layer.kernel
    codes = torch.addcdiv(layer._half, u, a, value=1.0 / kern.x_scale)
    return codes.trunc().sub(kern.x_zero) if as_float else codes.to(torch.uint8)


def _codes(layer: Int8Linear, x: torch.Tensor, as_float: bool,
           library: object = None) -> tuple[torch.Tensor, torch.Tensor]:
    return codes_kernel.codes(x, layer._factors, layer.rot, layer.rot_b, layer.kernel.x_scale,
                              layer.kernel.x_zero, as_float=as_float, library=library,
                              norm_eps=None if layer.norm is None else layer.eps)


def test_built_where_a_compiler_exists() -> None:
    """With a C compiler the kernel builds, for the instruction set torch's kernels use."""
    if not HAS_CC:
        assert not codes_kernel.available() and "no C compiler" in codes_kernel.status()
        return
    assert codes_kernel.available(), codes_kernel.status()
    capability = torch.backends.cpu.get_cpu_capability().lower()
    assert codes_kernel.status() == f"verispec's kernel ({capability} code)"


@needs_kernel
@pytest.mark.parametrize("as_float", [False, True], ids=["uint8", "float"])
@pytest.mark.parametrize(("name", "k", "block", "norm", "factors"), LAYERS,
                         ids=[x[0] for x in LAYERS])
def test_codes_and_outputs_equal_the_torch_operators(name: str, k: int,
                                                     block: tuple[int, bool] | None,
                                                     norm: bool, factors: bool,
                                                     as_float: bool) -> None:
    """Every code equals the torch path's, at one row and at passes that spread over the
    threads; the row scale is the same (after an RMSNorm: to float32 rounding, its squares
    summed in float64), and so are the layer's outputs."""
    layer = _layer(k, block, norm, factors)
    assert layer._fused
    for m in (1, 5, 40):
        x = _inputs(m, k, seed=m)
        got, s = _codes(layer, x, as_float)
        assert got.dtype == (torch.float32 if as_float else torch.uint8)
        assert torch.equal(got, _reference_codes(layer, x, as_float)), (name, m)
        y, s_ref = layer.scaled_reference(x)
        if layer.norm is not None:
            assert torch.allclose(s, s_ref, rtol=1e-6, atol=0.0)
        else:
            assert torch.equal(s, s_ref)
        fused_y, fused_s = layer._scaled(x)
        assert torch.equal(fused_y, y) and torch.equal(fused_s, s)


@needs_kernel
@pytest.mark.parametrize("block", [None, (256, True), (64, True), (64, False)],
                         ids=["none", "16x16", "8x8", "dense-64"])
def test_a_rows_codes_do_not_depend_on_the_batch_or_the_threads(
        block: tuple[int, bool] | None) -> None:
    """Row r's codes and scale alone, in a pass of 37 rows (spread over the threads), and on
    one thread are bit for bit the same: the property that makes a token's p the same in a
    one-token step and in a verification pass."""
    k = 2048
    layer = _layer(k, block, norm=block is None, factors=False)
    x = _inputs(37, k)
    assert x.numel() >= codes_kernel.MIN_PARALLEL > k  # the batch is spread, one row is not
    together, s_together = _codes(layer, x, False)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single, s_single = _codes(layer, x, False)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, single) and torch.equal(s_together, s_single)
    for r in (0, 17, 36):
        alone, s_alone = _codes(layer, x[r:r + 1], False)
        assert torch.equal(alone[0], together[r]) and torch.equal(s_alone[0], s_together[r])


@needs_kernel
def test_a_row_of_zeros_gets_the_zero_point_and_a_zero_output() -> None:
    layer = _layer(1024, (64, True), norm=False, factors=False)
    x = _inputs(3, 1024)
    x[1] = 0.0
    codes, s = _codes(layer, x, False)
    assert (codes[1] == layer.kernel.x_zero).all() and s[1].item() == 0.0
    as_float, _ = _codes(layer, x, True)
    assert (as_float[1] == 0.0).all()
    out = layer(x)
    assert (out[1] == 0.0).all() and torch.isfinite(out).all()


@needs_kernel
@pytest.mark.parametrize("norm", [False, True])
def test_a_row_with_a_nan_or_an_infinity_gives_a_nan_output(norm: bool) -> None:
    """Never a finite output made from such a row (its codes are not defined); the other
    rows are untouched."""
    layer = _layer(1024, None if norm else (64, True), norm=norm, factors=False)
    x = _inputs(4, 1024)
    clean = layer(x)
    x[1, 7], x[2, 300] = float("nan"), float("inf")
    out = layer(x)
    assert out[1].isnan().all() and out[2].isnan().all()
    assert torch.equal(out[0], clean[0]) and torch.equal(out[3], clean[3])


@needs_kernel
def test_rotations_it_cannot_take_run_the_torch_path_and_bad_ones_are_refused() -> None:
    assert not codes_kernel.takes(torch.eye(2), torch.eye(128))  # q above MAX_Q
    assert not codes_kernel.takes(torch.eye(4097), None)  # a block above MAX_BLOCK
    assert codes_kernel.takes(torch.eye(64), torch.eye(64)) and codes_kernel.takes(None, None)
    layer = Int8Linear.from_int8(torch.ones((16, 256), dtype=torch.int8), torch.ones(16),
                                 kernel=default_kernel(), rot=torch.eye(2), rot_b=torch.eye(128))
    assert not layer._fused  # the torch path runs it
    x = torch.randn(2, 256)
    y, s = layer.scaled_reference(x)
    assert torch.equal(layer(x), y * s)
    with pytest.raises(ValueError, match="refused"):  # blocks of 64 do not tile 100 channels
        codes_kernel.codes(torch.randn(2, 100), None, torch.eye(8), torch.eye(8), 1 / 127,
                           128, norm_eps=None, as_float=False)


def _levels_here() -> list[str]:
    here = torch.backends.cpu.get_cpu_capability()
    return list(LEVELS[: LEVELS.index(here) + 1]) if here in LEVELS else ["DEFAULT"]


@needs_kernel
@pytest.mark.parametrize("level", LEVELS)
def test_every_instruction_set_this_cpu_runs_gives_the_same_codes(level: str) -> None:
    """The builds for AVX-512, AVX2 and no vector extension (the code of other CPUs, run
    here where this CPU has them) make the same codes; a level this CPU lacks is not run."""
    if level not in _levels_here():
        assert torch.backends.cpu.get_cpu_capability() != level
        pytest.skip(f"this CPU does not run {level} code")
    library = codes_kernel.build(level)
    for k, block, norm in ((2048, (256, True), False), (1536, (64, True), False),
                           (1536, None, True)):
        layer = _layer(k, block, norm, factors=False)
        x = _inputs(9, k)
        got, s = _codes(layer, x, False, library)
        want, s_want = _codes(layer, x, False)
        assert torch.equal(got, want)
        assert torch.allclose(s, s_want, rtol=1e-6, atol=0.0)


def _status_in_a_process(env: dict[str, str]) -> str:
    return kernel_status_in_a_process("codes_kernel", env)


def test_the_torch_path_runs_where_asked_or_where_the_build_fails(tmp_path: Path) -> None:
    asked = _status_in_a_process({"VERISPEC_INT8_CODES": "torch"})
    assert asked.startswith("False") and "VERISPEC_INT8_CODES=torch" in asked
    broken = _status_in_a_process({"CC": str(tmp_path / "no-such-compiler"),
                                   "VERISPEC_CACHE": str(tmp_path / "cache")})
    assert broken.startswith("False") and "did not build" in broken
    with pytest.raises(subprocess.CalledProcessError):
        _status_in_a_process({"VERISPEC_INT8_CODES": "fast"})
