"""Replayed passes (kernel calls bound once per pass shape and cache) against the
layer-by-layer pass: the same bits, where they apply, and nowhere else."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import TinyTokenizer, make_tiny_model
from native_support import own_cache, seq  # noqa: F401 (fixture)

from verispec.models.native import (
    NativeCausalLM,
    attention_kernel,
    from_hf_module,
    int4_kernel,
    replay,
    rope_kernel,
)

KERNELS = (int4_kernel.available() and rope_kernel.available()
           and attention_kernel.available())


@pytest.fixture(scope="module")
def module() -> Any:
    """64 wide: every layer fits the int4 kernel's groups of 64 and its 16-row blocks."""
    return make_tiny_model(seed=3, hidden_size=64)


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return tmp_path_factory.mktemp("verispec-cache")


def _int4(module: Any, replayed: bool) -> NativeCausalLM:
    m = from_hf_module(module, TinyTokenizer(), "int4", "int4", exact_passes=True)
    m.net.replay = replayed
    return m


def _drive(m: NativeCausalLM) -> list[torch.Tensor]:
    """Ragged rows, passes of 1–6 tokens, rollbacks, a fork, a reordering, a new row in a
    freed slot and the cache growing (asserted): the logits of every pass."""
    out = []
    m.add_rows([seq(9, 1), seq(4, 2), seq(13, 3)])
    capacity, keys = m.capacity, m.cache.keys
    out.append(m.extend([seq(1, 4), seq(1, 5), seq(1, 6)]))
    out.append(m.extend([seq(3, 7), seq(1, 8), seq(5, 9)], num_logits=2))
    m.rollback([n - 1 for n in m.lengths])
    m.select_rows([2, 0, 0])  # the second row dropped, the first forked, reordered
    out.append(m.extend([seq(2, 10), seq(1, 11), seq(4, 12)], num_logits=4))
    m.select_rows([1, 2])
    m.add_rows([seq(6, 13)])  # into a freed slot
    for i in range(30):  # past the cache's first capacity
        out.append(m.extend([seq(1 + i % 6, 20 + i)] * 3, num_logits=1))
    assert m.capacity > capacity and m.cache.keys is not keys, "the cache never grew"
    return out


def test_replayed_passes_give_the_layer_by_layer_bits(module: Any) -> None:
    if not KERNELS:
        pytest.skip("verispec's kernels do not run here (see the next test)")
    fast, slow = _int4(module, True), _int4(module, False)
    outs = [_drive(fast), _drive(slow)]
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b)
    shapes = {(rows, k) for rows, k, _, _ in fast.net.replays}
    assert {(3, 1), (3, 5), (3, 4), (3, 6)} <= shapes, shapes
    assert not slow.net.replays


def test_a_replay_missing_one_call_is_caught(module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: the comparison above sees a replay that skips one layer's last
    call (its down projection)."""
    if not KERNELS:
        pytest.skip("verispec's kernels do not run here")
    init = replay.Replay.__init__

    def without_last_down(self: replay.Replay, *args: Any) -> None:
        init(self, *args)
        self.calls.pop()

    monkeypatch.setattr(replay.Replay, "__init__", without_last_down)
    fast, slow = _int4(module, True), _int4(module, False)
    a, b = _drive(fast), _drive(slow)
    assert not all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_replays_apply_exactly_where_every_call_is_verispecs_kernel(module: Any) -> None:
    int4 = _int4(module, True) if int4_kernel.available() else None
    dense = from_hf_module(module, TinyTokenizer(), "float32", "float32")
    dense.add_rows([seq(5, 1)])
    assert not replay.applies(dense.net, dense.cache.keys[0])  # float layers
    dense.extend([seq(1, 2)])
    assert not dense.net.replays
    if int4 is None:
        assert not KERNELS
        return
    int4.add_rows([seq(5, 1)])
    assert replay.applies(int4.net, int4.cache.keys[0]) == KERNELS
    # recorded pass costs are keyed apart from those timed layer by layer
    assert f"|replay={int(KERNELS)}" in int4.variant
    assert "|replay=0" in _int4(module, False).variant
    int4.extend([seq(1, 2)])
    assert bool(int4.net.replays) == KERNELS
    int4.extend([seq(17, 3)], num_logits=1)  # beyond the tokens per row a replay takes
    assert all(k <= 16 for _, k, _, _ in int4.net.replays)


def test_bound_calls_refuse_tensors_they_do_not_take() -> None:
    x, out = torch.zeros(1, 64), torch.zeros(1, 16)
    cache = torch.zeros(1, 1, 8, 16)
    q, last, slots = (torch.zeros(1, 1, 1, 16), torch.zeros(1, 1, dtype=torch.int64),
                      torch.zeros(1, dtype=torch.int64))
    qkv, table = torch.zeros(1, 1, 3, 16), torch.zeros(8, 16)
    if not int4_kernel.available():
        with pytest.raises(RuntimeError):
            int4_kernel.bind(x, _packed(), out)
    else:
        assert int4_kernel.bind(x, _packed(), out)() == 0
        with pytest.raises(ValueError, match="float32"):
            int4_kernel.bind(x.double(), _packed(), out)
        with pytest.raises(ValueError, match="writes"):
            int4_kernel.bind(x, _packed(), torch.zeros(2, 16))
        with pytest.raises(ValueError, match="float32"):
            int4_kernel.bind(x, _packed(), torch.zeros(1, 32)[:, ::2])  # not contiguous
    if not attention_kernel.available():
        with pytest.raises(RuntimeError):
            attention_kernel.bind(q, cache, cache, slots, last, torch.zeros_like(q))
    else:
        assert attention_kernel.bind(q, cache, cache, slots, last, torch.zeros_like(q))() == 0
        with pytest.raises(ValueError, match="int64"):
            attention_kernel.bind(q, cache, cache, slots.int(), last, torch.zeros_like(q))
        with pytest.raises(ValueError, match="one shape"):
            attention_kernel.bind(q, cache, cache, slots, last, torch.zeros(1, 1, 2, 16))
    if not rope_kernel.available():
        with pytest.raises(RuntimeError):
            rope_kernel.bind(qkv, 1, 1, table, table, last, slots, cache, cache, q)
    else:
        assert rope_kernel.bind(qkv, 1, 1, table, table, last, slots, cache, cache, q)() == 0
        with pytest.raises(ValueError, match="q"):
            rope_kernel.bind(qkv, 1, 1, table, table, last, slots, cache, cache,
                             torch.zeros(1, 1, 2, 16))


def _packed() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    codes = torch.randint(16, (16, 64), generator=torch.Generator().manual_seed(0))
    return int4_kernel.pack(codes, torch.ones(16, 1), torch.zeros(16, 1))
