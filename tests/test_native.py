"""The native runtime (verispec.models.native) against transformers, and its cache verbs.

The tests use the tiny random Qwen2 modules of ``conftest.make_tiny_model`` (no downloads;
the embedded real pair's tests are in ``test_native_loading.py``).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TinyTokenizer, wrap_tiny
from native_support import (  # noqa: F401 (fixtures)
    PRECS,
    PROVEN,
    close,
    module,
    module_cache,
    native,
    native_int8,
    needs_int8,
    own_cache,
    seq,
)

from verispec.models.native import (
    CACHE_FILES,
    NativeCausalLM,
    cache_file,
    kernels,
    load_native,
)
from verispec.models.native.linear import int4_available

# -- float32 equals transformers ---------------------------------------------------------------


def test_float32_logits_match_transformers(module: Any) -> None:
    hf, nat = wrap_tiny(module), native(module)
    prefixes = [seq(9, 1), seq(4, 2), seq(13, 3)]
    hf.add_rows(prefixes)
    nat.add_rows(prefixes)
    new = [seq(3, 4), seq(5, 5), seq(1, 6)]
    close(nat.extend(new, 3), hf.extend(new, 3), 1e-5)
    more = [seq(2, 7), [], seq(4, 8)]
    close(nat.extend(more), hf.extend(more), 1e-5)
    assert nat.lengths == hf.lengths == [14, 9, 18]


def test_float32_greedy_equals_transformers_generate(module: Any) -> None:
    prompt = seq(6, 9)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        ref = module.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40,
                              do_sample=False, pad_token_id=0, eos_token_id=None)
    ref_new = ref[0, len(prompt):].tolist()
    nat = native(module)
    nat.add_rows([prompt[:-1]])
    out, last = [], prompt[-1]
    for _ in range(40):
        last = int(nat.extend([[last]])[0, -1].argmax())
        out.append(last)
    assert out == ref_new


@pytest.mark.parametrize("kind", ["llama", "qwen2-tied"])
def test_other_family_members_match_transformers(kind: str) -> None:
    """Llama (no biases, explicit head_dim) and a Qwen2 with a tied lm_head."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  initializer_range=0.3)
    with torch.random.fork_rng():
        torch.manual_seed(3)
        if kind == "llama":
            module = LlamaForCausalLM(LlamaConfig(**common, head_dim=16, rope_theta=500.0,
                                                  tie_word_embeddings=False))
        else:
            module = Qwen2ForCausalLM(Qwen2Config(**common, tie_word_embeddings=True))
    module = module.float().eval()
    hf, nat = wrap_tiny(module), native(module)
    prefixes = [seq(6, 120), seq(11, 121)]
    hf.add_rows(prefixes)
    nat.add_rows(prefixes)
    new = [seq(4, 122), seq(2, 123)]
    close(nat.extend(new), hf.extend(new))


# -- cache verbs, float32 and int8 ---------------------------------------------------------------


@pytest.mark.parametrize("precision", PRECS)
def test_one_pass_equals_one_at_a_time(module: Any, precision: str) -> None:
    m = native(module, precision)
    m.add_rows([seq(10, 10)])
    block = seq(7, 11)
    together = m.extend([block])  # [1, 7, V]
    m.rollback(10)
    single = torch.cat([m.extend([[t]]) for t in block], dim=1)
    close(together, single)


@pytest.mark.parametrize("precision", PRECS)
def test_ragged_rows_equal_single_rows(module: Any, precision: str) -> None:
    prefixes = [seq(5, 20), seq(12, 21), [], seq(8, 22)]
    blocks = [seq(3, 23), seq(6, 24), seq(2, 25), []]
    m = native(module, precision)
    m.add_rows(prefixes)
    batch = m.extend(blocks, num_logits=4)  # [4, 4, V], left aligned
    for b, (prefix, block) in enumerate(zip(prefixes, blocks, strict=True)):
        if not block:
            continue
        one = m.spawn()
        one.add_rows([prefix])
        ref = one.extend([block])  # [1, k_b, V]
        n_b = min(4, len(block))
        close(batch[b, :n_b], ref[0, len(block) - n_b:])
        assert torch.isfinite(batch[b]).all()  # filler entries are finite


@pytest.mark.parametrize("precision", PRECS)
def test_rollback_after_rejected_block_equals_fresh_prefill(module: Any, precision: str) -> None:
    prefix, block = seq(9, 30), seq(6, 31)
    m = native(module, precision)
    m.add_rows([prefix, prefix])
    m.extend([block, block[:4]])
    m.rollback([len(prefix) + 2, len(prefix) + 1])  # accepted 2 and 1 of the drafts
    nxt = m.extend([[5, 6], [7]], num_logits=1)  # [2, 1, V]
    for b, (kept, extra) in enumerate([(block[:2], [5, 6]), (block[:1], [7])]):
        fresh = m.spawn()
        fresh.add_rows([prefix + kept + extra[:-1]])
        close(nxt[b, 0], fresh.extend([extra[-1:]])[0, 0])


@pytest.mark.parametrize("precision", PRECS)
def test_select_rows_fork_and_join(module: Any, precision: str) -> None:
    prefix = seq(7, 40)
    m = native(module, precision)
    m.add_rows([prefix])
    m.select_rows([0, 0, 0])  # fork into three drafts
    drafts = [seq(3, 41), seq(2, 42), seq(4, 43)]
    fork = m.extend(drafts)
    for b, d in enumerate(drafts):
        one = m.spawn()
        one.add_rows([prefix + d[:-1]])
        close(fork[b, len(d) - 1], one.extend([d[-1:]])[0, 0])
    m.select_rows([1])  # join: keep the second draft
    assert m.lengths == [len(prefix) + 2]
    after = m.extend([[9]])
    ref = m.spawn()
    ref.add_rows([prefix + drafts[1]])
    close(after, ref.extend([[9]]))
    m.select_rows([])
    assert m.lengths == []
    m.add_rows([prefix])
    assert m.lengths == [len(prefix)]


@pytest.mark.parametrize("precision", PRECS)
def test_spawn_shares_weights_not_cache(module: Any, precision: str) -> None:
    m = native(module, precision)
    m.add_rows([seq(4, 50)])
    twin = m.spawn()
    assert twin.net is m.net and twin.lengths == [] and m.lengths == [4]
    twin.add_rows([seq(6, 51)])
    assert m.lengths == [4]
    assert twin.precision == m.precision and twin.eos_token_ids == m.eos_token_ids


@pytest.mark.parametrize("precision", PRECS)
def test_uninitialized_cache_memory_is_never_read(module: Any, precision: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Cache memory starts as NaN here (uninitialized memory may hold NaNs); the results must
    not change, since attention reads masked slots too."""
    from verispec.models.native.model import Transformer

    def run(m: NativeCausalLM) -> list[torch.Tensor]:
        m.add_rows([seq(5, 100), seq(9, 101)])
        outs = [m.extend([seq(3, 102), seq(1, 103)], 1)]
        m.select_rows([1, 0, 1])
        m.add_rows([seq(2, 104)])
        outs.append(m.extend([seq(2, 105), [], seq(4, 106), seq(70, 107)], 2))
        m.rollback([m.lengths[0] - 1, m.lengths[1], 3, 60])
        outs.append(m.extend([[1], [2, 3], [4], seq(5, 108)], 1))
        return outs

    ref = run(native(module, precision))
    real_new_cache = Transformer.new_cache

    def nan_cache(self: Transformer, rows: int, capacity: int) -> Any:
        keys, values = real_new_cache(self, rows, capacity)
        for t in keys + values:
            t.fill_(float("nan"))
        return keys, values

    monkeypatch.setattr(Transformer, "new_cache", nan_cache)
    got = run(native(module, precision))
    for a, b in zip(got, ref, strict=True):
        assert torch.isfinite(a).all()
        close(a, b)


def test_cache_grows_and_reset(module: Any) -> None:
    m = native(module)
    m.add_rows([seq(3, 60)])
    start = m.capacity
    ref = wrap_tiny(module)
    ref.add_rows([seq(3, 60)])
    for i in range(start // 8 + 2):  # past the first capacity
        block = seq(8, 61 + i)
        close(m.extend([block], 1), ref.extend([block], 1), 1e-5)
    assert m.capacity > start
    m.reset()
    assert m.lengths == [] and m.rows == 0


# -- int8 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("kernel", PROVEN)
def test_int8_rows_do_not_see_each_other(module: Any, kernel: kernels.Int8Kernel) -> None:
    """A row's logits are the same alone and next to a row with an activation outlier, and
    k tokens scored in one pass equal the same tokens scored one at a time."""
    loud = copy.deepcopy(module)
    with torch.no_grad():
        loud.model.embed_tokens.weight[63] *= 300.0  # token 63: a huge activation
    m = native_int8(loud, kernel)
    prefix = seq(6, 70)
    m.add_rows([prefix, prefix])
    block = seq(5, 71)
    together = m.extend([block, [63] * 5])
    alone = m.spawn()
    alone.add_rows([prefix])
    assert torch.equal(together[0], alone.extend([block])[0])
    alone.rollback([len(prefix)])
    singles = torch.cat([alone.extend([[t]]) for t in block], dim=1)  # [1, 5, V]
    assert torch.equal(together[0], singles[0])


@pytest.mark.parametrize("kernel", PROVEN)
def test_int8_close_to_float(module: Any, kernel: kernels.Int8Kernel) -> None:
    f, q = native(module), native_int8(module, kernel)
    prefix = seq(20, 80)
    f.add_rows([prefix])
    q.add_rows([prefix])
    block = seq(6, 81)
    pf = f.extend([block]).softmax(-1)
    pq = q.extend([block]).softmax(-1)
    assert float((pf - pq).abs().sum(-1).max()) < 0.5  # a coarse sanity bound (tiny model)
    assert q.precision == "int8"


@needs_int8
def test_int8_kernels_of_one_code_width_agree(module: Any) -> None:
    """Every library fed the same codes computes the same model bit for bit (one epilogue:
    each returns the exact integer product, the scales are applied after), which is what
    lets a mixed kernel run each pass size on another library."""
    widths = {k.bits for k in kernels.proven()}
    groups = [[k for k in kernels.proven() if k.bits == b] for b in widths]
    groups = [g for g in groups if len(g) > 1]
    if not groups:
        pytest.skip("one int8 library only in this torch")
    for group in groups:
        outs = []
        for kernel in group:
            m = native_int8(module, kernel)
            m.add_rows([seq(8, 110), seq(3, 111)])
            outs.append(m.extend([seq(4, 112), seq(2, 113)]))
        assert all(torch.equal(out, outs[0]) for out in outs[1:]), group


@needs_int8
@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_quantized_disk_cache_round_trip(module: Any, tmp_path: Path, precision: str,
                                         own_cache: Path | None) -> None:
    """Quantized weights are cached in verispec's cache directory, not the model's (other
    tools load every ``*.safetensors`` there), and read back bit for bit."""
    if precision == "int4" and not int4_available():
        pytest.skip("no CPU int4 kernel")
    module.save_pretrained(tmp_path)
    tok = TinyTokenizer()
    first = load_native(tmp_path, precision, tokenizer=tok)
    kernel = kernels.choose()[0] if precision == "int8" else None
    file = cache_file(tmp_path, precision, kernel)
    assert file.exists() and own_cache in file.parents  # type: ignore[operator]
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == ["model.safetensors"]
    assert CACHE_FILES[precision] not in {p.name for p in tmp_path.iterdir()}
    stamp = file.stat().st_mtime_ns
    second = load_native(tmp_path, precision, tokenizer=tok)  # read from the cache
    assert file.stat().st_mtime_ns == stamp
    ref = native(module, precision)
    prefix = seq(9, 90)
    outs = []
    for m in (first, second, ref):
        m.add_rows([prefix])
        outs.append(m.extend([seq(3, 91)]))
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    # new float weights invalidate the cache: it is rebuilt
    weights = next(p for p in tmp_path.glob("model*.safetensors"))
    os.utime(weights, ns=(stamp + 10**9, stamp + 10**9))
    load_native(tmp_path, precision, tokenizer=tok)
    assert file.stat().st_mtime_ns != stamp
    assert not list(file.parent.glob(f".{precision}-*"))  # no temporary left behind
