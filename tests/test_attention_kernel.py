"""verispec's attention kernel over float64 and float32 caches: torch's float64 attention to
float32 rounding (float64 caches) or to float32 arithmetic (float32 caches), every query's
bits independent of the pass, each instruction set this CPU runs it with, refusal of those
it does not, and torch's attention where asked."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

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


DTYPES = [torch.float64, torch.float32]
#: |kernel - float64 reference| / max |reference| allowed per cache dtype: float32 rounding of
#: the result, or float32 arithmetic throughout
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-5}


def _cache(slots: int = 5, heads: int = 2, length: int = 40, d: int = 64, seed: int = 0,
           dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """keys and values [P, Hkv, L, D] (drawn in float64, stored in ``dtype``)."""
    g = torch.Generator().manual_seed(seed)
    shape = (slots, heads, length, d)
    return ((torch.randn(shape, generator=g, dtype=torch.float64) * 2).to(dtype),
            torch.randn(shape, generator=g, dtype=torch.float64).to(dtype))


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
                scores = keys[slots[r], h, :n].double() @ q[r, h, i].double() / d ** 0.5  # [n]
                out[r, h, i] = torch.softmax(scores, 0) @ values[slots[r], h, :n].double()
    return out


def _pass(rows: int, k: int, group: int, heads: int = 2, d: int = 64,
          seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((rows, heads, group * k, d), generator=g) * 3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_isa", RUNS)
def test_matches_torch_float64_attention(use_isa: int, dtype: torch.dtype) -> None:
    """Scattered slots, ragged rows (each token its own last position), grouped heads, a
    query that sees one position only."""
    keys, values = _cache(dtype=dtype)
    slots = [4, 0, 2]
    last = torch.tensor([[0, 1, 2], [17, 18, 19], [36, 37, 39]])  # [R, k]
    q = _pass(3, 3, group=3)
    out = attention_kernel.attend(q, keys, values, torch.tensor(slots), last, use_isa=use_isa)
    ref = _reference(q, keys, values, slots, last)
    assert out.dtype == torch.float32
    assert float((out.double() - ref).abs().max()) <= TOLERANCE[dtype] * float(ref.abs().max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("use_isa", RUNS)
def test_a_query_gives_the_same_bits_in_any_pass(use_isa: int, dtype: torch.dtype) -> None:
    """k tokens in one pass, or each alone; a row alone or beside others in any slots; one
    thread or two: the same bits for every query."""
    keys, values = _cache(length=64, d=128, dtype=dtype)
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
    assert attention_kernel.takes(q, keys) and attention_kernel.takes(q, keys.float())
    assert not attention_kernel.takes(q, keys.bfloat16())  # other caches: torch's attention
    assert not attention_kernel.takes(q[..., :60], keys[..., :60])  # D not a multiple of 8
    assert not attention_kernel.takes(q[..., :56], keys[..., :56].float())  # nor of 16
    with pytest.raises(ValueError, match="do not match"):  # keys and values of two dtypes
        attention_kernel.attend(q, keys, values.float(), slots, last)


def test_quantized_models_keep_the_cache_this_kernel_makes_exact() -> None:
    """float32 where the kernel runs on the device and takes the head dimension in float32,
    float64 (torch's attention) elsewhere."""
    cpu = torch.device("cpu")
    assert attention_kernel.exact_dtype(cpu, 64) == torch.float32
    assert attention_kernel.exact_dtype(cpu, 8) == torch.float64  # float64 vectors only
    assert attention_kernel.exact_dtype(torch.device("meta"), 64) == torch.float64


def test_torch_attention_runs_where_asked() -> None:
    asked = kernel_status_in_a_process("attention_kernel", {"VERISPEC_ATTENTION": "torch"})
    assert asked.startswith("False") and "VERISPEC_ATTENTION=torch" in asked
    code = ("import torch; from verispec.models.native import attention_kernel as k; "
            "print(k.exact_dtype(torch.device('cpu'), 64))")
    dtype = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "VERISPEC_ATTENTION": "torch"}, check=True,
                           timeout=120).stdout.strip()
    assert dtype == "torch.float64"  # torch's attention: quantized models keep float64
    avx2 = kernel_status_in_a_process("attention_kernel", {"VERISPEC_ATTENTION": "avx2"})
    assert avx2.startswith("True") and "(avx2" in avx2
    with pytest.raises(subprocess.CalledProcessError):
        kernel_status_in_a_process("attention_kernel", {"VERISPEC_ATTENTION": "fast"})


def test_which_passes_run_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float32 model (no ``exact_attention``) attends with the kernel in passes of up to
    OWN_ATTENTION_MAX_TOKENS tokens per row and with torch's in longer ones (prompts); an
    int4 target (``exact_attention``) attends with it in every pass, over a float32 cache."""
    from conftest import TinyTokenizer, make_tiny_model

    from verispec.models.native import from_hf_module, int4_kernel
    from verispec.models.native.model import OWN_ATTENTION_MAX_TOKENS

    calls: list[int] = []  # tokens per row of each call of the kernel
    attend = attention_kernel.attend

    def counted(q: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(args[3].shape[1])  # type: ignore[attr-defined]  # last [R, k]
        return attend(q, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(attention_kernel, "attend", counted)
    module = make_tiny_model(seed=5, hidden_size=64)  # 4 heads of 16: the float32 path fits
    dense = from_hf_module(module, TinyTokenizer(), "f", "float32")
    assert dense.net.attention_dtype == torch.float32 and not dense.net.exact_attention
    layers = dense.net.config.layers
    dense.add_rows([[1, 2, 3] * 10])  # 30 tokens: torch's attention
    assert calls == []
    dense.extend([[4] * OWN_ATTENTION_MAX_TOKENS])
    assert calls == [OWN_ATTENTION_MAX_TOKENS] * layers
    if not int4_kernel.available():
        return
    target = from_hf_module(module, TinyTokenizer(), "t", "int4", exact_passes=True)
    assert target.net.exact_attention and target.net.attention_dtype == torch.float32
    calls.clear()
    target.add_rows([[1, 2, 3] * 10])
    target.extend([[4] * (OWN_ATTENTION_MAX_TOKENS + 1)])
    assert calls and calls[-1] == OWN_ATTENTION_MAX_TOKENS + 1 and 30 in calls
