"""The native runtime (verispec.models.native) against transformers, and its cache verbs.

Fast tests use the tiny random Qwen2 modules of ``conftest.make_tiny_model`` (no downloads);
``integration`` tests use the embedded real pair and skip when it is not in the cache.
"""

from __future__ import annotations

import copy
import os
import platform
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TinyTokenizer, make_tiny_model, wrap_tiny

from verispec.models.loading import PRECISIONS, load_model, resolve_precision
from verispec.models.native import (
    CACHE_FILES,
    NativeCausalLM,
    cache_file,
    from_hf_module,
    kernels,
    load_native,
)
from verispec.models.native.linear import Int4Linear, int4_available, int8_available
from verispec.models.timing import pass_costs

CACHE = Path(os.environ.get("VERISPEC_CACHE", "~/.cache/verispec")).expanduser()
REAL_TARGET = CACHE / "qwen2.5-coder-1.5b-instruct"
REAL_DRAFT = CACHE / "qwen2.5-coder-0.5b-instruct"

needs_int8 = pytest.mark.skipif(not int8_available(), reason="no exact int8 kernel here")
PRECS = ["float32", pytest.param("int8", marks=needs_int8)]


@pytest.fixture(scope="module")
def module() -> Any:
    return make_tiny_model(seed=0)


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("verispec-cache")


@pytest.fixture(autouse=True)
def own_cache(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
              module_cache: Path) -> Path | None:
    """verispec's cache directory (quantized weights, the kernel choice) in a temporary
    directory for the tiny models; integration tests keep the real one (their models and
    quantized weights live there)."""
    if "integration" in request.keywords:
        return None
    monkeypatch.setenv("VERISPEC_CACHE", str(module_cache))
    return module_cache


def native(module: Any, precision: str = "float32") -> NativeCausalLM:
    return from_hf_module(module, TinyTokenizer(), f"native-{precision}", precision)


def native_int8(module: Any, kernel: kernels.Int8Kernel) -> NativeCausalLM:
    """The tiny module in int8 on one given kernel."""
    from verispec.models.native.config import NativeConfig
    from verispec.models.native.weights import build_int8, int8_state, module_tensors

    config = NativeConfig.from_hf(module.config)
    net = build_int8(config, int8_state(config, module_tensors(module)), kernel)
    return NativeCausalLM(net, TinyTokenizer(), str(kernel), precision="int8")


#: every int8 kernel proven exact on this CPU (7-bit codes on every x86-64 CPU with AVX2)
PROVEN = [pytest.param(k, id=str(k)) for k in kernels.proven()]


def seq(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(64, (n,), generator=g).tolist()


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-5) -> None:
    """|a - b| ≤ rel · max|b| (relative to the logits' scale)."""
    a, b = a.float(), b.float()
    assert a.shape == b.shape
    err = float((a - b).abs().max())
    assert err <= rel * float(b.abs().max()), f"max abs error {err}"


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
    """Two libraries fed the same codes compute the same model (up to activations that round
    the other way: fbgemm quantizes u / a itself, rounding half to even)."""
    widths = {k.bits for k in kernels.proven()}
    pairs = [[k for k in kernels.proven() if k.bits == b] for b in widths]
    pairs = [p for p in pairs if len(p) == 2]
    if not pairs:
        pytest.skip("one int8 library only in this torch")
    for pair in pairs:
        outs = []
        for kernel in pair:
            m = native_int8(module, kernel)
            m.add_rows([seq(8, 110), seq(3, 111)])
            outs.append(m.extend([seq(4, 112), seq(2, 113)]).softmax(-1))
        assert float((outs[1] - outs[0]).abs().sum(-1).max()) < 0.05


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


# -- loading and precisions ---------------------------------------------------------------------


def test_bad_precisions_are_refused(module: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="precision must be one of"):
        load_model(str(tmp_path), precision="float16")
    with pytest.raises(ValueError, match="float64"):
        load_model("toy:random:5:1", precision="int8")
    with pytest.raises(ValueError, match="float64"):
        load_model("toy:random:5:1", precision="bfloat16")
    assert load_model("toy:random:5:1", precision="auto").precision == "float64"
    with pytest.raises(ValueError, match="precision must be one of"):
        from_hf_module(module, None, "x", "fp8")
    with pytest.raises(ValueError, match="CPU"):
        from_hf_module(module, None, "x", "int8", device="meta")
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("int2", torch.device("cpu"))
    assert PRECISIONS == ("auto", "float32", "bfloat16", "int8", "int4")


@needs_int8
@pytest.mark.skipif(not int4_available(), reason="no CPU int4 kernel")
def test_int4_draft_runs_wide_passes_on_its_int8_form(module: Any) -> None:
    """An int4 draft reads prompts and passes over ≥ PREFILL_ROWS token rows with its int8
    form (same cache), and narrower passes with its int4 layers."""
    from verispec.models.native.lm import PREFILL_ROWS

    draft = native(module, "int4")
    assert draft.prefill_net is not None
    int8_only = NativeCausalLM(draft.prefill_net, TinyTokenizer(), "int8 form",
                               precision="int8")
    prefix = seq(11, 70)
    for m in (draft, int8_only):
        m.add_rows([prefix])
    wide, narrow = seq(PREFILL_ROWS, 71), seq(PREFILL_ROWS - 1, 72)
    assert torch.equal(draft.extend([wide]), int8_only.extend([wide]))
    for m in (draft, int8_only):
        m.rollback([len(prefix)])
    assert not torch.equal(draft.extend([narrow]), int8_only.extend([narrow]))


def test_int4_is_refused_for_a_target(module: Any, tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="draft-only"):
        resolve_precision("int4", cpu)
    with pytest.raises(ValueError, match="role must be one of"):
        resolve_precision("float32", cpu, "verifier")
    module.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="draft-only"):
        load_model(str(tmp_path), precision="int4")
    if int4_available() and platform.machine().lower() in ("x86_64", "amd64"):
        draft = load_model(str(tmp_path), precision="int4", role="draft")
        assert isinstance(draft, NativeCausalLM) and draft.precision == "int4"


@pytest.mark.skipif(not int4_available(), reason="no CPU int4 kernel")
def test_int4_linear_is_its_dequantized_matrix() -> None:
    torch.manual_seed(0)
    w, x = torch.randn(96, 128), torch.randn(5, 128)  # [N, K], [M, K]
    lin = Int4Linear.quantize(w)
    # dequantize the stored codes: Ŵ = (code − 8) · s + z per group of 64 input channels
    lo = w.view(96, 2, 64).amin(-1)  # [N, G]
    scale = ((w.view(96, 2, 64).amax(-1) - lo) / 15).clamp_min(1e-8)
    codes = torch.round((w.view(96, 2, 64) - lo[..., None]) / scale[..., None]).clamp(0, 15)
    s, z = lin.scales[..., 0].T.float(), lin.scales[..., 1].T.float()  # [N, G] as stored
    deq = ((codes - 8) * s[..., None] + z[..., None]).view(96, 128)
    ref = x.bfloat16().float() @ deq.T  # [M, N]
    out = lin(x)
    assert out.shape == (5, 96) and out.dtype == torch.float32
    assert (out - ref).abs().max() <= 1e-2 * ref.abs().max()  # bfloat16 output rounding
    assert (deq - w).abs().max() <= 0.5 * scale.max() + 0.05  # within half a step (+ bf16)


def test_resolve_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    import verispec.models.loading as loading

    cpu = torch.device("cpu")
    assert resolve_precision("float32", cpu)[0] == "float32"
    monkeypatch.setattr(loading.platform, "machine", lambda: "x86_64")
    vnni, avx2 = kernels.Int8Kernel("onednn", 8), kernels.Int8Kernel("fbgemm", 7)
    monkeypatch.setattr(kernels, "choose", lambda: (vnni, "onednn/8; proven"))
    assert resolve_precision("auto", cpu)[0] == "int8"
    assert resolve_precision("auto", cpu, "draft")[0] == ("int4" if int4_available()
                                                          else "int8")
    monkeypatch.setattr(kernels, "choose", lambda: (avx2, "fbgemm/7; proven"))
    name, why = resolve_precision("auto", cpu)
    assert name == "int8" and "fbgemm/7" in why
    assert resolve_precision("auto", cpu, "draft")[0] == "int8"  # int4 is slower on AVX2
    monkeypatch.setattr(kernels, "choose", lambda: (None, "no exact kernel here"))
    monkeypatch.setattr(loading, "_cpu_flags", lambda: frozenset({"avx512f", "avx512_bf16"}))
    assert resolve_precision("auto", cpu)[0] == "bfloat16"
    assert resolve_precision("auto", cpu, "draft")[0] == "bfloat16"  # int4 comes with int8
    with pytest.raises(ValueError, match="no exact kernel here"):
        resolve_precision("int8", cpu)
    monkeypatch.setattr(loading, "_cpu_flags", lambda: frozenset({"avx2"}))
    name, why = resolve_precision("auto", cpu)
    assert name == "float32" and "auto" in why
    with pytest.raises(ValueError, match="x86 CPUs only"):
        resolve_precision("int8", torch.device("meta"))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the int8 table is for x86-64")
def test_auto_is_int8_on_every_x86_cpu_with_avx2() -> None:
    """On this CPU, whichever family it is: int8 for both models where AVX2 is present, int4
    for the draft only where the chosen kernel takes 8-bit codes."""
    from verispec.telemetry.machine import cpu_info

    cpu = torch.device("cpu")
    if "avx2" not in cpu_info().flags:
        pytest.skip("no AVX2")
    kernel, _ = kernels.choose()
    assert kernel is not None and resolve_precision("auto", cpu)[0] == "int8"
    draft = resolve_precision("auto", cpu, "draft")[0]
    assert draft == ("int4" if kernel.bits == 8 and int4_available() else "int8")


def test_load_model_runs_qwen2_dirs_natively(module: Any, tmp_path: Path) -> None:
    module.save_pretrained(tmp_path)
    m = load_model_dir(tmp_path, "float32")
    assert isinstance(m, NativeCausalLM) and m.precision == "float32"
    ref = wrap_tiny(module)
    prefix = seq(7, 95)
    m.add_rows([prefix])
    ref.add_rows([prefix])
    close(m.extend([seq(2, 96)]), ref.extend([seq(2, 96)]))


@needs_int8
def test_int8_refused_for_other_architectures(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2,
                               n_positions=64)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="Qwen2/Llama"):
        load_model(str(tmp_path), precision="int8", device=torch.device("cpu"))


def load_model_dir(path: Path, precision: str, role: str = "target") -> Any:
    """``load_model`` on a directory without a tokenizer (the tiny model has none)."""
    import verispec.models.native as native_pkg

    real = native_pkg.load_native

    def with_tokenizer(*args: Any, **kw: Any) -> NativeCausalLM:
        kw.setdefault("tokenizer", TinyTokenizer())
        return real(*args, **kw)

    native_pkg.load_native = with_tokenizer
    try:
        return load_model(str(path), precision=precision, device=torch.device("cpu"),
                          role=role)
    finally:
        native_pkg.load_native = real


def test_bfloat16_runs(module: Any) -> None:
    m = native(module, "bfloat16")
    m.add_rows([seq(5, 97)])
    out = m.extend([seq(3, 98)])
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    f = native(module)
    f.add_rows([seq(5, 97)])
    pf, pb = f.extend([seq(3, 98)]).softmax(-1), out.float().softmax(-1)
    assert float((pf - pb).abs().sum(-1).max()) < 0.2


def test_pass_costs(module: Any) -> None:
    m = native(module)
    costs = pass_costs(m, context=12, ks=(1, 3), reps=2)
    assert set(costs) == {1, 3} and all(c > 0 for c in costs.values())
    assert m.lengths == []  # measured on a spawned twin


# -- the real pair ------------------------------------------------------------------------------

real = pytest.mark.skipif(not (REAL_TARGET / "config.json").exists(),
                          reason="the embedded model pair is not in the cache")


@pytest.mark.integration
@real
def test_real_draft_float32_greedy_equals_transformers() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(REAL_DRAFT, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(REAL_DRAFT)
    prompt = tok.encode("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
    ids = torch.tensor([prompt])
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48,
                          do_sample=False)[0, len(prompt):].tolist()
    nat = from_hf_module(hf, tok, "draft", "float32")
    del hf
    nat.add_rows([prompt[:-1]])
    out, last = [], prompt[-1]
    for _ in range(len(ref)):
        last = int(nat.extend([[last]])[0, -1].argmax())
        out.append(last)
    assert out == ref


@pytest.mark.integration
@real
@needs_int8
@pytest.mark.parametrize("path", [REAL_DRAFT, REAL_TARGET], ids=["draft", "target"])
def test_real_int8_batch_equals_single(path: Path) -> None:
    """A verification pass (and a ragged batch) gives every position exactly the
    distribution it gets when its tokens are scored one at a time."""
    m = load_native(path, "int8")
    text = m.tokenizer.encode("import numpy as np\n\ndef softmax(x):\n    return")
    m.add_rows([text, text[:5]])
    block = m.tokenizer.encode(" np.exp(x) / np.exp(x).sum()")
    both = m.extend([block, block[:3]])
    m.rollback([len(text), 5])
    singles = torch.cat([m.extend([[t], []])[:1] for t in block], dim=1)
    assert torch.equal(both[0], singles[0])


@needs_int8
def test_int8_transformers_module_matches_the_native_int8_model(module: Any) -> None:
    """The transformers peers run the same int8 model: same codes, scales and rotations."""
    from verispec.models.native.hf_int8 import Int8Module, int8_transformers

    nat = native(module, "int8")
    hf = int8_transformers(copy.deepcopy(module))
    assert isinstance(hf.model.layers[0].self_attn.k_proj, Int8Module)
    ids = seq(12, 50)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]  # [12, V]
    nat.add_rows([[]])
    close(nat.extend([ids]), ref[None], rel=1e-4)


@needs_int8
def test_pearl_workers_reload_int8_models_from_their_directory(module: Any,
                                                                tmp_path: Path) -> None:
    """int8 weights are opaque oneDNN tensors that do not pickle: a PEARL worker gets the
    directory and precision and reloads the model (from the int8 disk cache)."""
    import pickle

    from verispec.methods.pearl.workers import NativePayload, materialise, portable

    module.save_pretrained(tmp_path)
    for role in ("target", "draft"):  # a draft is reloaded as it was built (no rotations)
        m = load_model_dir(tmp_path, "int8", role)
        payload = portable(m)
        assert isinstance(payload, NativePayload) and payload.precision == "int8"
        again = materialise(pickle.loads(pickle.dumps(payload)))
        assert again.online_rotations == (role == "target")
        prefix = seq(6, 97)
        for model in (m, again):
            model.add_rows([prefix])
        assert torch.equal(m.extend([seq(3, 98)]), again.extend([seq(3, 98)]))


@needs_int8
def test_drafts_are_quantized_without_run_time_rotations(module: Any, tmp_path: Path) -> None:
    """A target rotates the inputs of o_proj and down_proj at run time; a draft does not
    (its q only has to be what it samples from) and is cached in a file of its own; both
    stay exact per row (k tokens in one pass equal one at a time)."""
    module.save_pretrained(tmp_path)
    target = load_model_dir(tmp_path, "int8", "target")
    draft = load_model_dir(tmp_path, "int8", "draft")
    rotated = [getattr(b, n).rot is not None for b in target.net.blocks for n in ("o", "down")]
    assert all(rotated)
    assert all(getattr(b, n).rot is None for b in draft.net.blocks for n in ("o", "down"))
    kernel = kernels.choose()[0]
    files = {cache_file(tmp_path, "int8", kernel, online_rotations=r) for r in (True, False)}
    assert len(files) == 2 and all(f.exists() for f in files)
    prefix, more = seq(7, 99), seq(4, 100)
    for m in (target, draft):
        m.add_rows([prefix])
        whole = m.extend([more], 4)[0]  # [4, V]
        m.rollback([len(prefix)])
        ones = torch.cat([m.extend([[t]])[0] for t in more])  # [4, V]
        assert torch.equal(whole, ones)


def test_recorded_pass_costs_are_keyed_by_the_models_variant(module: Any) -> None:
    """Two models of one name and precision that run different quantized forms or score
    different vocabularies get different pass-cost records; the same form, the same one."""
    from verispec.engine.costs import cost_key

    def key(target: NativeCausalLM, draft: NativeCausalLM) -> str:
        return cost_key(target, draft, context=8, shapes=[(1, 1), (1, 2)])

    full = from_hf_module(module, name="m")
    again = from_hf_module(module, name="m")
    subset = from_hf_module(module, name="m", vocabulary=40)
    assert key(full, full) == key(again, again)
    assert key(full, full) != key(full, subset)
    if int8_available():
        rotated = from_hf_module(module, name="m", precision="int8")
        plain = from_hf_module(module, name="m", precision="int8", online_rotations=False)
        assert rotated.variant != plain.variant
        assert key(full, rotated) != key(full, plain)
