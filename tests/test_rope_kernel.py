"""verispec's rotary embedding and cache store: what the model's tensor operations compute
(queries in the attention's layout, rotated keys and the values in the cache, float32 and
float64 caches, scattered slots, ragged positions), every token's bits independent of its
pass, refusal of positions and slots outside the cache, and the tensor operations where
asked."""

from __future__ import annotations

import platform
import subprocess

import pytest
import torch
from native_support import kernel_status_in_a_process

from verispec.models.native import rope_kernel
from verispec.models.native.config import NativeConfig
from verispec.models.native.model import Transformer
from verispec.models.slots import Layout

X86 = platform.machine().lower() in ("x86_64", "amd64")
pytestmark = pytest.mark.skipif(not (X86 and rope_kernel.available()),
                                reason=f"x86-64 with the kernel built only "
                                       f"({rope_kernel.status()})")

HEADS, KV_HEADS, D = 6, 2, 16  # G = 3


def _net(cache_dtype: torch.dtype) -> Transformer:
    """A weightless one-layer Transformer: only its RoPE tables, config and cache are used."""
    config = NativeConfig(vocab_size=32, hidden=HEADS * D, intermediate=8, layers=1,
                          heads=HEADS, kv_heads=KV_HEADS, head_dim=D, rope_theta=10000.0,
                          norm_eps=1e-6, max_positions=None, tied=True)
    blocks: list = [None]  # one layer's cache; no weights
    return Transformer(config, torch.zeros(32, HEADS * D), blocks, None,  # type: ignore[arg-type]
                       dtype=torch.float32, device=torch.device("cpu"),
                       attention_dtype=cache_dtype)


def _qkv(rows: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((rows, k, HEADS + 2 * KV_HEADS, D), generator=g) * 3  # [R, k, ., D]


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("lengths", "ks", "slots"), [
    ([5, 5, 5], [3, 3, 3], [0, 1, 2]),  # rows of one length in slots 0..R-1
    ([7, 2, 11], [4, 4, 4], [3, 0, 2]),  # ragged rows in scattered slots
    ([9], [1], [4]),  # one token of one row
])
def test_matches_the_tensor_operations(cache_dtype: torch.dtype, lengths: list[int],
                                       ks: list[int], slots: list[int]) -> None:
    net = _net(cache_dtype)
    step = net.step(lengths, ks, None, slots)
    qkv = _qkv(len(lengths), max(ks))
    keys, values = net.new_cache(5, 32)
    for t in (*keys, *values):
        t.fill_(0.5)  # positions the pass does not write must keep this
    want_k, want_v = keys[0].clone(), values[0].clone()
    want_q = net.rope_store(qkv, step, want_k, want_v)  # [R, Hkv, G k, D]
    assert rope_kernel.takes(qkv, net.cos, keys[0])
    q = rope_kernel.rope_store(qkv, HEADS, KV_HEADS, net.cos, net.sin, step.last,
                               step.layout.slots, keys[0], values[0])
    assert q.shape == want_q.shape
    torch.testing.assert_close(q, want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(keys[0], want_k, rtol=1e-6, atol=1e-6)
    assert torch.equal(values[0], want_v)  # values are stored as they are


def test_a_token_gets_the_same_bits_in_any_pass() -> None:
    """k tokens of R rows in one pass, or each token alone: the same queries and cache."""
    net = _net(torch.float64)
    lengths, slots = [3, 8], [1, 0]
    qkv = _qkv(2, 4, seed=1)
    keys, values = net.new_cache(2, 16)
    step = net.step(lengths, [4, 4], None, slots)
    whole = rope_kernel.rope_store(qkv, HEADS, KV_HEADS, net.cos, net.sin, step.last,
                                   step.layout.slots, keys[0], values[0])
    view = whole.view(2, KV_HEADS, HEADS // KV_HEADS, 4, D)  # [R, Hkv, G, k, D]
    alone_k, alone_v = net.new_cache(2, 16)
    for r in range(2):
        for j in range(4):
            one = net.step([lengths[r] + j], [1], None, [slots[r]])
            q = rope_kernel.rope_store(qkv[r: r + 1, j: j + 1].contiguous(), HEADS, KV_HEADS,
                                       net.cos, net.sin, one.last, one.layout.slots,
                                       alone_k[0], alone_v[0])
            assert torch.equal(q.view(KV_HEADS, HEADS // KV_HEADS, D), view[r, :, :, j])
    for r, (n, slot) in enumerate(zip(lengths, slots, strict=True)):
        span = slice(n, n + 4)
        assert torch.equal(alone_k[0][slot, :, span], keys[0][slot, :, span])
        assert torch.equal(alone_v[0][slot, :, span], values[0][slot, :, span]), r


def test_refuses_positions_and_slots_outside_the_cache() -> None:
    net = _net(torch.float64)
    keys, values = net.new_cache(2, 8)
    net.rope(16)
    qkv = _qkv(1, 2)
    slots = torch.tensor([1])
    for positions in (torch.tensor([[7, 8]]), torch.tensor([[-1, 0]])):  # beyond L, negative
        with pytest.raises(ValueError, match="do not match"):
            rope_kernel.rope_store(qkv, HEADS, KV_HEADS, net.cos, net.sin, positions, slots,
                                   keys[0], values[0])
    with pytest.raises(ValueError, match="do not match"):  # a slot beyond the cache
        rope_kernel.rope_store(qkv, HEADS, KV_HEADS, net.cos, net.sin, torch.tensor([[0, 1]]),
                               torch.tensor([2]), keys[0], values[0])
    with pytest.raises(ValueError, match="do not match"):  # heads that do not add up
        rope_kernel.rope_store(qkv, HEADS - 2, KV_HEADS, net.cos, net.sin,
                               torch.tensor([[0, 1]]), slots, keys[0], values[0])


def test_what_it_takes() -> None:
    net = _net(torch.float64)
    keys, _ = net.new_cache(1, 8)
    net.rope(8)
    qkv = _qkv(1, 1)
    assert rope_kernel.takes(qkv, net.cos, keys[0])
    assert not rope_kernel.takes(qkv.double(), net.cos, keys[0])  # float32 activations only
    assert not rope_kernel.takes(qkv, net.cos, keys[0].to(torch.bfloat16))
    assert not rope_kernel.takes(qkv, net.cos, keys[0].transpose(2, 3))  # positions strided
    assert Layout.of([0], 1, torch.device("cpu")).first == 0


def test_tensor_operations_run_where_asked() -> None:
    asked = kernel_status_in_a_process("rope_kernel", {"VERISPEC_ROPE_KERNEL": "torch"})
    assert asked.startswith("False") and "VERISPEC_ROPE_KERNEL=torch" in asked
    with pytest.raises(subprocess.CalledProcessError):
        kernel_status_in_a_process("rope_kernel", {"VERISPEC_ROPE_KERNEL": "fast"})
