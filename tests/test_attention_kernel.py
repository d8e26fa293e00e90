"""verispec's float64 attention kernel: torch's float64 attention to float32 rounding, every
query's bits independent of the pass, each instruction set this CPU runs it with, refusal of
those it does not, and torch's attention where asked."""

from __future__ import annotations

import os
import platform
import subprocess

import pytest
import torch
from native_support import cpu_flags, kernel_status_in_a_process

from verispec.models.native import attention_kernel

X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not (X86 and attention_kernel.available()),
                                reason=f"x86-64 with the kernel built only "
                                       f"({attention_kernel.status()})")

FLAGS = cpu_flags()
BEST = 2 if "avx512f" in FLAGS else 1 if {"avx2", "fma"} <= FLAGS else 0  # the CPU's flags
RUNS = [i for i in attention_kernel.ISAS if i <= BEST]  # what this CPU may use
REFUSED = [i for i in (1, 2, 3) if i not in RUNS]  # what it must refuse


def test_the_kernel_runs_what_this_cpu_has() -> None:
    """Its best instruction set is the one the CPU's flags promise (AVX-512, else AVX2 with
    FMA), or AVX2 where ``VERISPEC_ATTENTION=avx2`` asks."""
    expected = 1 if os.environ.get(attention_kernel.ATTENTION_ENV) == "avx2" else BEST
    assert attention_kernel.isa() == expected
    assert f"({attention_kernel.ISAS[expected]}" in attention_kernel.status()


def _cache(slots: int = 5, heads: int = 2, length: int = 40, d: int = 64,
           seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """keys and values [P, Hkv, L, D] float64."""
    g = torch.Generator().manual_seed(seed)
    shape = (slots, heads, length, d)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 2,
            torch.randn(shape, generator=g, dtype=torch.float64))


def _reference(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, slots: list[int],
               last: torch.Tensor) -> torch.Tensor:
    """[R, Hkv, G k, D] float64, one query at a time with torch."""
    rows, heads, group_k, d = q.shape
    k = last.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for r in range(rows):
        for h in range(heads):
            for i in range(group_k):
                n = int(last[r, i % k]) + 1
                scores = keys[slots[r], h, :n] @ q[r, h, i].double() / d ** 0.5  # [n]
                out[r, h, i] = torch.softmax(scores, 0) @ values[slots[r], h, :n]
    return out


def _pass(rows: int, k: int, group: int, heads: int = 2, d: int = 64,
          seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((rows, heads, group * k, d), generator=g) * 3


@pytest.mark.parametrize("use_isa", RUNS)
def test_matches_torch_float64_attention(use_isa: int) -> None:
    """Scattered slots, ragged rows (each token its own last position), grouped heads, a
    query that sees one position only."""
    keys, values = _cache()
    slots = [4, 0, 2]
    last = torch.tensor([[0, 1, 2], [17, 18, 19], [36, 37, 39]])  # [R, k]
    q = _pass(3, 3, group=3)
    out = attention_kernel.attend(q, keys, values, torch.tensor(slots), last, use_isa=use_isa)
    ref = _reference(q, keys, values, slots, last)
    assert out.dtype == torch.float32
    assert float((out.double() - ref).abs().max()) <= 1e-6 * float(ref.abs().max())


@pytest.mark.parametrize("use_isa", RUNS)
def test_a_query_gives_the_same_bits_in_any_pass(use_isa: int) -> None:
    """k tokens in one pass, or each alone; a row alone or beside others in any slots; one
    thread or two: the same bits for every query."""
    keys, values = _cache(length=64, d=128)
    q = _pass(2, 5, group=6, d=128, seed=2)
    slots, base = torch.tensor([3, 1]), torch.tensor([[40], [11]])
    last = base + torch.arange(5)  # [2, 5]
    whole = attention_kernel.attend(q, keys, values, slots, last, use_isa=use_isa)
    view = whole.view(2, 2, 6, 5, 128)  # [R, Hkv, G, k, D]
    for r in range(2):
        for j in range(5):
            one = q.view(2, 2, 6, 5, 128)[r: r + 1, :, :, j].reshape(1, 2, 6, 128)
            alone = attention_kernel.attend(one, keys, values, slots[r: r + 1],
                                            last[r: r + 1, j: j + 1], use_isa=use_isa)
            assert torch.equal(alone.view(1, 2, 6, 128), view[r: r + 1, :, :, j])
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(attention_kernel.attend(q, keys, values, slots, last,
                                                   use_isa=use_isa), whole)
    finally:
        torch.set_num_threads(before)
    swapped = attention_kernel.attend(q.flip(0), keys, values, slots.flip(0), last.flip(0),
                                      use_isa=use_isa)
    assert torch.equal(swapped.flip(0), whole)


def test_refuses_what_it_does_not_take() -> None:
    keys, values = _cache()
    q, slots, last = _pass(1, 1, group=2), torch.tensor([0]), torch.tensor([[5]])
    for use_isa in REFUSED:  # an instruction set this CPU lacks is refused, not emulated
        with pytest.raises(ValueError, match="instruction set"):
            attention_kernel.attend(q, keys, values, slots, last, use_isa=use_isa)
    with pytest.raises(ValueError, match="do not match"):  # a position beyond the cache
        attention_kernel.attend(q, keys, values, slots, torch.tensor([[40]]))
    with pytest.raises(ValueError, match="do not match"):  # a slot beyond the cache
        attention_kernel.attend(q, keys, values, torch.tensor([5]), last)
    assert attention_kernel.takes(q, keys)
    assert not attention_kernel.takes(q, keys.float())  # float32 caches: torch's attention
    assert not attention_kernel.takes(q[..., :60], keys[..., :60])  # D not a multiple of 8


def test_torch_attention_runs_where_asked() -> None:
    asked = kernel_status_in_a_process("attention_kernel", {"VERISPEC_ATTENTION": "torch"})
    assert asked.startswith("False") and "VERISPEC_ATTENTION=torch" in asked
    avx2 = kernel_status_in_a_process("attention_kernel", {"VERISPEC_ATTENTION": "avx2"})
    assert avx2.startswith("True") and "(avx2" in avx2
    with pytest.raises(subprocess.CalledProcessError):
        kernel_status_in_a_process("attention_kernel", {"VERISPEC_ATTENTION": "fast"})
