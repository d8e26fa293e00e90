"""Every lossless method stays exact on the int8 runtime, and with an int4 target.

p and q are the int8 models' own distributions. The reference law is the int8 target
sampled one token at a time, each position scored by a fresh prefill of its prefix; the
engine's law comes from replaying every random decision of the real engine
(:mod:`verispec.theory.replay`) with tiny native int8 models, so verification passes score
several tokens at once. Both laws are built from float32 probabilities, hence the
tolerance of float32 rounding. Top-k warping keeps the number of paths small.

Negative control: the same model with one activation scale per *tensor* (PyTorch's dynamic
int8) makes a position's distribution depend on the tokens scored with it, and the test
sees the engine's law move away from the target's.

An int4 target reads the prompt on its int8 form and every later token on its int4 layers;
its reference law scores each generated token in a pass of its own after the prompt. Its
negative control is the same model run as a draft runs it (wide passes on the int8 form).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pytest
import torch
from conftest import TinyTokenizer, make_tiny_model

from verispec.api import make_drafter
from verispec.engine.exact import Law, walk
from verispec.engine.loop import Engine
from verispec.engine.request import Request
from verispec.methods import build_method
from verispec.models.native import NativeCausalLM, from_hf_module, int4_kernel, kernels, lm
from verispec.models.native.linear import Int8Linear, int4_available, int8_available
from verispec.sampling import Randomness, Sampling, warp_rows
from verispec.theory.exact import tv_distance
from verispec.theory.replay import engine_law, marginal

pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.skipif(not int8_available(), reason="no int8 kernels")]

LOSSLESS = ["ar", "token", "block", "greedy-block", "multidraft", "lossy[epsilon=0]"]
GAMMA = {"multidraft": 1}
FLOAT32_ROUNDING = 1e-5  # laws built from float32 probabilities
WARP = Sampling(temperature=1.0, top_k=2)
PROMPT = [3, 17, 5]
LENGTH = 3


def _kernels() -> list[Any]:
    """The kernel chosen here and a 7-bit one (valid on every x86 CPU): both run everywhere."""
    chosen = kernels.choose()[0] if int8_available() else None
    seven = next((k for k in kernels.proven() if k.bits == 7), None)
    found = [k for k in dict.fromkeys([chosen, seven]) if k is not None]
    return [pytest.param(k, id=str(k)) for k in found]


@pytest.fixture(scope="module", params=_kernels())
def kernel(request: pytest.FixtureRequest) -> Iterator[kernels.Int8Kernel]:
    """Runs the module's tests on this int8 kernel (``VERISPEC_INT8_KERNEL`` while built)."""
    before = os.environ.get(kernels.KERNEL_ENV)
    os.environ[kernels.KERNEL_ENV] = str(request.param)
    try:
        yield request.param
    finally:
        if before is None:
            os.environ.pop(kernels.KERNEL_ENV, None)
        else:
            os.environ[kernels.KERNEL_ENV] = before


@pytest.fixture(scope="module")
def pair(kernel: kernels.Int8Kernel) -> tuple[NativeCausalLM, NativeCausalLM]:
    tok = TinyTokenizer()
    models = (from_hf_module(make_tiny_model(seed=40), tok, "target-int8", "int8"),
              from_hf_module(make_tiny_model(seed=41), tok, "draft-int8", "int8"))
    assert all(m.net.head.kernel == kernel for m in models)  # type: ignore[union-attr]
    return models


def one_at_a_time_law(model: NativeCausalLM, prompt: Sequence[int], sampling: Sampling,
                      length: int) -> Law:
    """The law of ``length`` tokens drawn from ``model`` with every position scored alone."""

    def step(ctx: tuple[int, ...], room: int, state: Any) -> Iterable[tuple[Any, ...]]:
        fresh = model.spawn()
        fresh.add_rows([list(ctx[:-1])])
        dist = warp_rows(fresh.extend([[ctx[-1]]])[:, -1], [sampling])[0]  # [V]
        for y in (dist > 0).nonzero().flatten().tolist():
            yield (y,), False, float(dist[y]), None

    return walk(prompt, length, step)


def engine_run_law(target: NativeCausalLM, draft: NativeCausalLM, method: str,
                   gamma: int) -> Law:
    m = build_method(method)

    def run(randoms: Sequence[Randomness]) -> list[list[int]]:
        maker = None if m.name == "ar" else make_drafter(target, draft.spawn(), m)
        request = Request(PROMPT, m, m.adjust_sampling(WARP), LENGTH, randoms[0],
                          gamma if maker is not None else 0, maker)
        return [Engine(target.spawn()).run([request])[0].tokens]

    return marginal(engine_law(run, rows=1), 0)


@pytest.fixture(scope="module")
def reference(pair: tuple[NativeCausalLM, NativeCausalLM]) -> Law:
    return one_at_a_time_law(pair[0], PROMPT, WARP, LENGTH)


@pytest.mark.parametrize("method", LOSSLESS)
def test_int8_engine_law_is_the_int8_target_law(pair: tuple[NativeCausalLM, NativeCausalLM],
                                                reference: Law, method: str) -> None:
    law = engine_run_law(*pair, method, GAMMA.get(method, 2))
    assert abs(sum(law.values()) - 1) < FLOAT32_ROUNDING
    assert tv_distance(law, reference) < FLOAT32_ROUNDING


@pytest.mark.skipif(not int4_available(), reason="no CPU int4 kernel")
@pytest.mark.parametrize("method", ["token", "block"])
def test_int4_draft_keeps_the_int8_target_law(pair: tuple[NativeCausalLM, NativeCausalLM],
                                              reference: Law, method: str) -> None:
    """A weight-only int4 draft (bfloat16 activations, pass-dependent rounding, prompt read
    by its int8 form) leaves the law the int8 target's: q is recorded in the pass that drew
    each draft token."""
    draft = from_hf_module(make_tiny_model(seed=41), TinyTokenizer(), "draft-int4", "int4")
    assert draft.prefill_net is not None  # the prompt is read by the int8 form
    assert not draft.exact_passes
    assert draft.spawn().prefill_net is draft.prefill_net
    law = engine_run_law(pair[0], draft, method, 2)
    assert tv_distance(law, reference) < FLOAT32_ROUNDING


@pytest.mark.parametrize("precision", ["int8", pytest.param("int4", marks=pytest.mark.skipif(
    not int4_available(), reason="no CPU int4 kernel"))])
@pytest.mark.parametrize("method", ["token", "block", "greedy-block"])
def test_vocabulary_subset_draft_keeps_the_int8_target_law(
        pair: tuple[NativeCausalLM, NativeCausalLM], reference: Law, method: str,
        precision: str) -> None:
    """A draft that scores only part of the vocabulary (its q is zero elsewhere, and is what
    it samples from) leaves the law the target's, which keeps its whole vocabulary: a
    static set of 16 ids (``vocabulary=4`` rounded up to the int4 kernel's multiple of 16)
    and each row's context ids (the prompt's 17, then every id the row is fed)."""
    draft = from_hf_module(make_tiny_model(seed=41), TinyTokenizer(), "draft-subset",
                           precision, vocabulary=4)
    q = draft.spawn()
    q.add_rows([PROMPT])
    logits = q.extend([[40]])[0, -1]  # [V]
    finite = set(range(16)) | {17, 40} | set(draft.eos_token_ids)
    assert torch.isfinite(logits).nonzero().view(-1).tolist() == sorted(finite)
    law = engine_run_law(pair[0], draft, method, 2)
    assert tv_distance(law, reference) < FLOAT32_ROUNDING


@pytest.fixture(scope="module")
def int4_target(kernel: kernels.Int8Kernel) -> NativeCausalLM:
    """A tiny int4 target (hidden size 64: every layer fits verispec's int4 kernel) that
    reads prompts on its int8 form (this module's kernel) and every later token on its int4
    layers."""
    if not (int4_available() and int4_kernel.available()):
        pytest.skip(f"no int4 target here: {int4_kernel.status()}")
    target = from_hf_module(make_tiny_model(seed=42, hidden_size=64), TinyTokenizer(),
                            "target-int4", "int4", exact_passes=True)
    assert target.prefill_net is not None
    return target


def prompt_then_one_at_a_time_law(model: NativeCausalLM, sampling: Sampling,
                                  length: int) -> Law:
    """The law of ``length`` tokens from ``model`` with the prompt but its last token read
    as a prompt (``add_rows``, as the engine reads it) and each later token scored in a pass
    of its own (an int4 target's law: its int8 form reads the prompt, its int4 layers every
    token after it)."""

    def step(ctx: tuple[int, ...], room: int, state: Any) -> Iterable[tuple[Any, ...]]:
        fresh = model.spawn()
        fresh.add_rows([PROMPT[:-1]])
        for t in ctx[len(PROMPT) - 1:-1]:
            fresh.extend([[t]])
        dist = warp_rows(fresh.extend([[ctx[-1]]])[:, -1], [sampling])[0]  # [V]
        for y in (dist > 0).nonzero().flatten().tolist():
            yield (y,), False, float(dist[y]), None

    return walk(PROMPT, length, step)


@pytest.mark.parametrize("method", LOSSLESS)
def test_int4_target_engine_law_is_its_one_pass_per_token_law(
        pair: tuple[NativeCausalLM, NativeCausalLM], int4_target: NativeCausalLM,
        method: str) -> None:
    reference = prompt_then_one_at_a_time_law(int4_target, WARP, LENGTH)
    law = engine_run_law(int4_target, pair[1], method, GAMMA.get(method, 2))
    assert abs(sum(law.values()) - 1) < FLOAT32_ROUNDING
    assert tv_distance(law, reference) < FLOAT32_ROUNDING


def test_negative_control_int4_verification_on_the_int8_form_is_caught(
        pair: tuple[NativeCausalLM, NativeCausalLM], int4_target: NativeCausalLM,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The same weights run as a draft runs them (passes of 2 token rows or more on the
    int8 form): verification then scores tokens otherwise than one at a time, and the
    engine's law moves away from the one-pass-per-token law."""
    draftlike = NativeCausalLM(int4_target.net, TinyTokenizer(), "int4 as a draft",
                               precision="int4", prefill_net=int4_target.prefill_net)
    monkeypatch.setattr(lm, "prefill_rows", lambda: 2)
    reference = prompt_then_one_at_a_time_law(draftlike, WARP, LENGTH)
    law = engine_run_law(draftlike, pair[1], "block", 2)
    assert tv_distance(law, reference) > 10 * FLOAT32_ROUNDING


class _PerTensorInt8(Int8Linear):
    """Negative control: one activation scale for the whole pass, as PyTorch's dynamic int8
    linear computes it, instead of one per token."""

    @staticmethod
    def _row_scale(u: torch.Tensor) -> torch.Tensor:
        return u.abs().amax().expand(u.shape[0], 1).contiguous()  # [M, 1]: one for all rows


def _per_tensor(model: NativeCausalLM) -> NativeCausalLM:
    net = model.net
    clone = NativeCausalLM(net, model.tokenizer, "per-tensor", precision="int8")
    import copy

    clone.net = copy.copy(net)
    clone.net.blocks = [copy.copy(b) for b in net.blocks]
    for block in clone.net.blocks:
        for name in ("qkv", "o", "gate_up", "down"):
            lin = copy.copy(getattr(block, name))
            lin.__class__ = _PerTensorInt8
            lin._fused = False  # the override is a change of the torch operators' path
            setattr(block, name, lin)
    return clone


def test_negative_control_per_tensor_scales_are_caught(
        pair: tuple[NativeCausalLM, NativeCausalLM]) -> None:
    """Runs on every kernel of the module (oneDNN and fbgemm alike): the override changes
    only the activation scale, the kernel call is the layer's own."""
    target = _per_tensor(pair[0])
    kernel = pair[0].net.head.kernel  # type: ignore[union-attr]
    layers = [getattr(b, n) for b in target.net.blocks for n in ("qkv", "o", "gate_up", "down")]
    assert all(type(lin) is _PerTensorInt8 and lin.kernel == kernel for lin in layers)
    reference = one_at_a_time_law(target, PROMPT, WARP, LENGTH)
    law = engine_run_law(target, pair[1], "block", 2)
    assert tv_distance(law, reference) > 10 * FLOAT32_ROUNDING


def test_int8_greedy_ar_and_block_give_identical_tokens(
        pair: tuple[NativeCausalLM, NativeCausalLM]) -> None:
    target, draft = pair
    greedy = Sampling(temperature=0)
    outputs = {}
    for method in ("ar", "block", "token"):
        m = build_method(method)
        maker = None if method == "ar" else make_drafter(target, draft.spawn(), m)
        request = Request(list(PROMPT), m, greedy, 40, Randomness(torch.Generator()),
                          4 if maker is not None else 0, maker)
        outputs[method] = Engine(target.spawn()).run([request])[0].tokens
    assert len(outputs["ar"]) == 40
    assert outputs["block"] == outputs["ar"] == outputs["token"]
