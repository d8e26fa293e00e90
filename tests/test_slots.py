"""Cache slots allocated once and reused (verispec.models.slots), for every model kind.

Admitting a row writes only the slot it takes, dropping and reordering rows copies nothing,
and a fork copies the forked row only: every other row's cache keeps its storage (same
tensors, same slot, same bytes), checked on the native runtime (float32 and int8), the
transformers wrapper and the toy tables. Outputs afterwards equal those of a fresh model
holding the same rows. Also the pool's bookkeeping, and the unchecked ``extend`` path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from conftest import TinyTokenizer, make_tiny_model, wrap_tiny
from torch.utils._python_dispatch import TorchDispatchMode

from verispec.models.base import CausalLM
from verispec.models.native import from_hf_module
from verispec.models.native.linear import int8_available
from verispec.models.toy import RandomContextLM


@pytest.fixture(scope="module")
def module() -> Any:
    return make_tiny_model(seed=0)


@pytest.fixture(autouse=True)
def own_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """verispec's cache directory (int8 weights, the kernel choice) in a temporary one."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path_factory.getbasetemp() / "vcache"))


@pytest.fixture(autouse=True)
def threads() -> Iterator[None]:
    """One intra-op thread for these tiny tensors (several only add contention); a test
    may set more."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


KINDS = ["native-float32",
         pytest.param("native-int8", marks=pytest.mark.skipif(not int8_available(),
                                                             reason="no exact int8 kernel")),
         "hf", "toy"]


def make(kind: str, module: Any) -> CausalLM:
    if kind == "toy":
        return RandomContextLM(64, seed=3)
    if kind == "hf":
        return wrap_tiny(module)
    return from_hf_module(module, TinyTokenizer(), kind, kind.removeprefix("native-"))


def seq(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(64, (n,), generator=g).tolist()


# -- what a model's cache storage looks like ---------------------------------------------------


def tensors(model: Any) -> list[torch.Tensor]:
    """The cache tensors of a tensor model, per layer keys then values [P, H, L, D]."""
    return list(model.cache.keys) + list(model.cache.values)


def snapshot(model: Any) -> dict[int, Any]:
    """Every slot's storage: raw bytes of each cache tensor's slot (tensor models) or the
    token list object with its contents (toy)."""
    if isinstance(model, RandomContextLM):
        return {s: (id(row), list(row)) for s, row in enumerate(model.store)}
    return {s: [t[s].clone().view(torch.uint8) for t in tensors(model)]
            for s in range(tensors(model)[0].shape[0])}


def untouched(before: dict[int, Any], after: dict[int, Any], slot: int) -> bool:
    if isinstance(before[slot], tuple):
        return before[slot] == after[slot]
    return all(torch.equal(a, b) for a, b in zip(before[slot], after[slot], strict=True))


class CopyMeter(TorchDispatchMode):
    """Bytes that tensor operations write while active (views cost nothing; an in-place
    copy counts its source, an index_put its values, anything else its output)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in ("copy_", "index_copy_", "index_put_"):
            src = args[-1] if name != "copy_" else args[1]
            self.bytes += src.numel() * src.element_size()
        elif not func.is_view and not name.startswith("empty"):
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    self.bytes += t.numel() * t.element_size()
        return out


def row_bytes(model: Any, length: int) -> int:
    """Bytes of a row's used cache (``length`` positions, every layer's keys and values)."""
    return sum(t[0, :, :length].numel() * t.element_size() for t in tensors(model))


# -- the pool ------------------------------------------------------------------------------------


def test_pool_reuses_the_lowest_free_slots_and_grows_geometrically() -> None:
    from verispec.models.slots import SlotPool

    sizes: list[int] = []
    pool = SlotPool(sizes.append)
    assert pool.admit(3) == [0, 1, 2] and sizes == [3]
    assert pool.select([2, 0]) == [] and pool.slots == [2, 0]  # dropping: bookkeeping
    assert pool.admit(1) == [1] and pool.slots == [2, 0, 1]  # the freed slot, reused
    copies = pool.select([1, 1, 0, 1])  # row 1 (slot 0) forked three ways, row 0 kept
    assert pool.slots[0] == 0 and pool.slots[2] == 2 and sorted(pool.slots) == [0, 1, 2, 3]
    assert copies == [(0, 1), (0, 3)] and sizes == [3, 6]  # slot 1 was free; then grown
    assert pool.slots == [0, 1, 2, 3]
    assert pool.select([3, 1]) == [] and pool.slots == [3, 1]
    assert pool.admit(2) == [0, 2]
    pool.reserve(5)
    assert sizes == [3, 6] and pool.size == 6  # room already
    pool.reserve(7)
    assert sizes == [3, 6, 12]
    assert pool.admit(1) == [4]


# -- storage identity: admission, retirement, fork --------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_admission_writes_only_the_slot_it_takes(kind: str, module: Any) -> None:
    model = make(kind, module)
    model.reserve(8)  # allocated up front: nothing grows below
    model.add_rows([seq(9, 1), seq(4, 2), seq(13, 3)])
    model.extend([seq(3, 4), [], seq(2, 5)])
    model.select_rows([2, 0])  # the slot of old row 1 is free now
    slots, lengths = model.slots, model.lengths
    storage = [t.data_ptr() for t in tensors(model)] if kind != "toy" else None
    before = snapshot(model)
    model.add_rows([seq(40, 6)])  # longer than any row so far (within the capacity)
    assert model.slots[:2] == slots and model.lengths[:2] == lengths
    new = model.slots[2]
    assert new not in slots
    after = snapshot(model)
    assert all(untouched(before, after, s) for s in before if s != new)
    if storage is not None:
        assert [t.data_ptr() for t in tensors(model)] == storage


@pytest.mark.parametrize("kind", KINDS)
def test_retirement_and_reordering_copy_nothing(kind: str, module: Any) -> None:
    model = make(kind, module)
    model.add_rows([seq(9, 1), seq(4, 2), seq(13, 3), seq(6, 4)])
    model.extend([seq(2, 5)] * 4)
    slots = model.slots
    before = snapshot(model)
    with CopyMeter() as meter:
        model.select_rows([3, 0, 2])  # retire row 1, reorder the others
        model.select_rows([2, 1])
    assert meter.bytes == 0
    assert model.slots == [slots[2], slots[0]]
    after = snapshot(model)
    assert all(untouched(before, after, s) for s in before)


@pytest.mark.parametrize("kind", KINDS)
def test_fork_copies_the_forked_row_only(kind: str, module: Any) -> None:
    model = make(kind, module)
    model.reserve(8)
    model.add_rows([seq(9, 1), seq(4, 2), seq(13, 3)])
    model.extend([seq(3, 4), seq(5, 5), seq(1, 6)])
    slots, lengths = model.slots, model.lengths
    before = snapshot(model)
    with CopyMeter() as meter:
        model.select_rows([0, 1, 1, 2, 1])  # row 1 into three drafts
    forks = [s for s in model.slots if s not in slots]
    assert len(forks) == 2 and model.slots[:4:3] == [slots[0], slots[2]]
    after = snapshot(model)
    assert all(untouched(before, after, s) for s in before if s not in forks)
    if kind == "toy":
        assert meter.bytes == 0  # token lists, no tensors
        assert all(after[s][1] == before[slots[1]][1] for s in forks)
    else:
        assert meter.bytes == 2 * row_bytes(model, lengths[1])  # two copies of row 1
        for t in tensors(model):
            for s in forks:
                assert torch.equal(t[s, :, : lengths[1]], t[slots[1], :, : lengths[1]])
    with CopyMeter() as meter:
        model.select_rows([2])  # join: keep one draft
    assert meter.bytes == 0


# -- outputs: the same as a fresh model holding the same rows ------------------------------------


EXACT = ("native-int8", "toy")  # rows independent of their batch: equal bit for bit


@pytest.mark.parametrize("kind", KINDS)
def test_scattered_rows_score_like_a_fresh_model(kind: str, module: Any) -> None:
    """After admissions, retirements and forks the rows sit in scattered slots; every pass
    (ragged, uniform, several tokens) gives what a fresh model holding the same rows gives
    (exactly where rows do not see their batch; float32 within rounding, as a fresh
    model reads the rows in other passes)."""
    model = make(kind, module)
    rows = [seq(9, 1), seq(4, 2), seq(13, 3), seq(6, 4)]
    model.add_rows(rows)
    model.extend([seq(2, 5)] * 4)
    rows = [r + seq(2, 5) for r in rows]
    model.select_rows([3, 1, 1, 0])  # retire row 2, fork row 1, reorder
    rows = [rows[3], rows[1], rows[1], rows[0]]
    model.add_rows([seq(5, 6)])
    rows.append(seq(5, 6))
    assert model.slots != list(range(len(rows)))  # really scattered
    blocks_list = [[seq(3, 7), [], seq(1, 8), seq(4, 9), seq(2, 10)],  # ragged
                   [seq(1, 11 + b) for b in range(5)],  # one token each (decoding)
                   [seq(4, 16 + b) for b in range(5)]]  # several tokens each
    for blocks in blocks_list:
        fresh = make(kind, module)
        fresh.add_rows(rows)
        logits = min(2, max(len(b) for b in blocks))
        want = fresh.extend(blocks, num_logits=logits)
        got = model.extend(blocks, num_logits=logits)
        for b, block in enumerate(blocks):
            n = min(logits, len(block))
            if kind in EXACT:
                assert torch.equal(got[b, :n], want[b, :n]), (kind, b)
            else:
                assert torch.allclose(got[b, :n], want[b, :n], atol=1e-4, rtol=0), (kind, b)
        rows = [r + blk for r, blk in zip(rows, blocks, strict=True)]
        assert model.lengths == [len(r) for r in rows]


@pytest.mark.parametrize("precision", ["float32", "bfloat16", pytest.param(
    "int8", marks=pytest.mark.skipif(not int8_available(), reason="no exact int8 kernel"))])
@pytest.mark.parametrize("ragged", [False, True])
def test_a_pass_over_scattered_slots_equals_the_compact_pass(module: Any, precision: str,
                                                             ragged: bool) -> None:
    """The same cache contents, once in slots 0..R-1 and once scattered over a larger cache
    whose other slots hold NaN: logits and the keys and values written are bit for bit the
    same (float32 / bfloat16 gather the rows, float64 attention reads runs of slots), and
    idle slots are never read. With several threads, where float32 attention rounds a row
    differently with its place in the batch."""
    torch.set_num_threads(max(2, torch.get_num_threads()))
    net = from_hf_module(module, TinyTokenizer(), "n", precision).net
    lengths = [7, 3, 7, 12, 5] if ragged else [9] * 5
    ks = [3, 1, 2, 3, 0] if ragged else [2] * 5
    slots = [6, 2, 3, 0, 9]  # runs [0], [2, 3], [6], [9]; out of row order
    rows, capacity = len(lengths), 64
    g = torch.Generator().manual_seed(0)
    compact_k, compact_v = net.new_cache(rows, capacity)
    spread_k, spread_v = net.new_cache(11, capacity)
    for c, sp in zip(compact_k + compact_v, spread_k + spread_v, strict=True):
        c.copy_(torch.randn(c.shape, generator=g, dtype=torch.float64).to(c.dtype))
        sp.fill_(float("nan"))
        sp[slots] = c
    ids = torch.tensor([seq(max(ks), 20 + b) for b in range(rows)])  # [R, k]
    with torch.inference_mode():
        want = net.forward(ids, net.step(lengths, ks, 2), compact_k, compact_v)
        got = net.forward(ids, net.step(lengths, ks, 2, slots), spread_k, spread_v)
    assert torch.equal(got, want)
    for c, sp in zip(compact_k + compact_v, spread_k + spread_v, strict=True):
        assert torch.equal(sp[slots], c)


@pytest.mark.parametrize("kind", KINDS)
def test_the_pool_grows_only_when_every_slot_is_live(kind: str, module: Any) -> None:
    model = make(kind, module)
    model.add_rows([seq(5, 1), seq(3, 2)])
    size = model_pool(model).size
    for i in range(6):  # fork and join repeatedly: the freed slots are reused
        model.select_rows([0, 0, 1, 1])
        model.extend([seq(1, 10 + i)] * 4)
        model.select_rows([1, 2])
    assert model_pool(model).size == 2 * size


@pytest.mark.parametrize("kind", KINDS)
def test_an_engine_reserves_its_batch_so_admission_never_grows_the_pool(
        kind: str, module: Any) -> None:
    """Rows admitted one by one up to the engine's batch size land in slots allocated once:
    the pool never grows, so no admission moves the other rows' caches."""
    from verispec.engine.loop import Engine
    from verispec.engine.request import Request
    from verispec.methods import build_method
    from verispec.sampling import Randomness, Sampling

    model = make(kind, module)
    engine = Engine(model, batch_size=5)
    pool = model_pool(model)
    assert pool.size == 5
    ar = build_method("ar")
    for i in range(5):
        engine.submit(Request(seq(4 + i, 30 + i), ar, Sampling(), 20,
                              Randomness(torch.Generator().manual_seed(i))))
        engine.step()
        assert pool.size == 5 and model.rows == i + 1


def model_pool(model: Any) -> Any:
    return model._pool if isinstance(model, RandomContextLM) else model.cache.pool


# -- the unchecked decoding path ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["native-float32", "hf", "toy"])
def test_extend_checks_tokens_unless_told_not_to(kind: str, module: Any) -> None:
    model = make(kind, module)
    model.add_rows([seq(4, 1)])
    with pytest.raises(ValueError, match="token id"):
        model.extend([[64]])
    with pytest.raises(ValueError, match="token id"):
        model.extend([[-1]])
    with pytest.raises(ValueError, match="token id"):
        model.add_rows([[1, 99]])
    assert model.lengths == [4]
    checked = model.extend([[5, 6]])
    model.rollback(4)
    assert torch.equal(model.extend([[5, 6]], check=False), checked)
    with pytest.raises(ValueError, match="rows"):  # the per-row checks still run
        model.extend([[1], [2]], check=False)


def test_engine_checks_prompts_once_at_submission() -> None:
    from verispec.engine.loop import Engine
    from verispec.engine.request import Request
    from verispec.methods import build_method
    from verispec.sampling import Randomness, Sampling

    target = RandomContextLM(6, seed=1)
    engine = Engine(target)
    ar = build_method("ar")
    with pytest.raises(ValueError, match="token id"):
        engine.submit(Request([1, 2, 6], ar, Sampling(), 3,
                              Randomness(torch.Generator().manual_seed(0))))
    assert engine.idle


def test_meter_sees_copies(module: Any) -> None:
    """The meter is not blind: a gather of cache rows is counted."""
    m = make("native-float32", module)
    m.add_rows([seq(5, 1), seq(5, 2)])
    with CopyMeter() as meter:
        torch.cat(tensors(m))
    assert meter.bytes == sum(t.numel() * t.element_size() for t in tensors(m))
