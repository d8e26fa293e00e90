"""The engine on every torch device it may run on: the CPU always, CUDA where a GPU is present.

Nothing in the engine is CPU-only: the verifiers, the samplers, the native dense runtime
(float32 and bfloat16), the slot pool and the batched engine take the device of the target's
logits. Each test runs on ``cpu`` and on ``cuda`` (the one-step tests on ``cuda`` only: their
CPU case is ``test_statistical``'s); the CUDA cases are skipped, with that reason, where
torch sees no GPU. int8 and int4 are CPU kernels: on CUDA they are refused
(asserted here, on both sides).

1. One verification step of 200,000 drafts through ``token_verify`` / ``block_verify`` with
   the tables, the drafts and the generator on the device: the emitted prefix follows p
   (chi-square, ``P_PASS``); token verification with the residual replaced by p is the
   negative control (``P_FAIL``).
2. The tiny native pair on the device: float32 logits equal the CPU's up to float rounding,
   bfloat16 stays close, a pass of k tokens equals k passes of one up to rounding.
3. Every method through ``generate`` at T = 0 on the device: the lossless ones return
   ``ar``'s tokens, and ``ar`` on the device returns the CPU's.
4. The batched engine at T = 1 on the device, 4,000 seeded requests of 2 tokens, 64 rows at a
   time: the first token follows the target's softmax (64 cells); the verifier that draws Y
   from p after a rejection is caught.
5. γ auto on the device: every iteration's passes are timed (on CUDA with the device
   synchronised) and set the levels of its next choices; at T = 0 its tokens are ``ar``'s.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from conftest import TinyTokenizer, make_tiny_model
from test_statistical import (
    P_FAIL,
    P_PASS,
    _emitted_prefix_law_pvalue,
    chi2_pvalue,
    residual_p_verify,
)
from verifier_doubles import TargetResidual

from verispec import generate, generate_batch
from verispec.engine.costs import measure_costs
from verispec.engine.gamma import AutoGamma
from verispec.engine.overhead import LEVEL_WINDOW, IterationOverhead
from verispec.engine.loop import Engine
from verispec.engine.protocols import Method
from verispec.engine.request import Request
from verispec.methods import METHODS, build_method
from verispec.models.native import NativeCausalLM, from_hf_module
from verispec.plan import make_drafter
from verispec.sampling import Randomness, Sampling
from verispec.verify import block_verify, token_verify

pytestmark = pytest.mark.usefixtures("one_thread")

NO_GPU = "no CUDA device in this torch (the CPU case runs the same assertions)"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason=NO_GPU))]
ON_CUDA = DEVICES[1:]  # tests whose CPU case is test_statistical's own
LAW_RUNS = 4000
LAW_ROWS = 64
PROMPT = [3, 17, 42, 5]


@pytest.fixture(scope="module")
def modules() -> dict[int, Any]:
    return {0: make_tiny_model(0), 1: make_tiny_model(1)}


def _native(module: Any, device: str, precision: str = "float32") -> NativeCausalLM:
    return from_hf_module(module, TinyTokenizer(), f"tiny-{precision}", precision,
                          device=device)


def _pair(modules: dict[int, Any], device: str) -> tuple[NativeCausalLM, NativeCausalLM]:
    return _native(modules[0], device), _native(modules[1], device)


# 1. One verification step ----------------------------------------------------------------

@pytest.mark.parametrize("device", ON_CUDA)
@pytest.mark.parametrize("verify", [token_verify, block_verify], ids=["token", "block"])
def test_verifiers_follow_the_target_on_the_device(verify: Any, device: str) -> None:
    assert _emitted_prefix_law_pvalue(verify, 10, device) > P_PASS


@pytest.mark.parametrize("device", ON_CUDA)
def test_a_wrong_residual_is_caught_on_the_device(device: str) -> None:
    assert _emitted_prefix_law_pvalue(residual_p_verify, 10, device) < P_FAIL


# 2. The native dense runtime ---------------------------------------------------------------

def _logits(model: NativeCausalLM, ids: list[int]) -> torch.Tensor:
    model.reset()
    model.add_rows([[]])
    return model.extend([ids])[0].float().cpu()  # [k, V]


@pytest.mark.parametrize("device", DEVICES)
def test_native_logits_on_the_device_equal_the_cpus(modules: dict[int, Any],
                                                    device: str) -> None:
    ids = PROMPT * 5
    reference = _logits(_native(modules[0], "cpu"), ids)  # [k, V]
    here = _logits(_native(modules[0], device), ids)
    scale = float(reference.abs().max())
    assert float((here - reference).abs().max()) <= 1e-5 * scale
    half = _logits(_native(modules[0], device, "bfloat16"), ids)
    assert float((half - reference).abs().max()) <= 5e-2 * scale


@pytest.mark.parametrize("device", DEVICES)
def test_native_pass_of_k_tokens_equals_one_at_a_time(modules: dict[int, Any],
                                                      device: str) -> None:
    model = _native(modules[0], device)
    ids = PROMPT * 3
    whole = _logits(model, ids)  # [k, V]
    model.reset()
    model.add_rows([ids[:4]])
    steps = torch.cat([model.extend([[t]])[0].float().cpu() for t in ids[4:]])  # [k - 4, V]
    assert float((steps - whole[4:]).abs().max()) <= 1e-5 * float(whole.abs().max())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("precision", ["int8", "int4"])
def test_cpu_kernels_are_refused_on_cuda_and_allowed_on_the_cpu(modules: dict[int, Any],
                                                                device: str,
                                                                precision: str) -> None:
    from verispec.models.native.linear import int4_available, int8_available

    module = modules[0]
    if device == "cuda":
        with pytest.raises(ValueError, match="cuda"):
            from_hf_module(module, TinyTokenizer(), "t", precision, device=device)
        return
    available = int8_available() if precision == "int8" else int4_available()
    if not available:  # the refusal names the missing kernel
        with pytest.raises(ValueError):
            from_hf_module(module, TinyTokenizer(), "t", precision, device=device)
        return
    model = from_hf_module(module, TinyTokenizer(), "t", precision, device=device)
    assert model.device.type == "cpu"


# 3. Every method through generate ------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_every_method_runs_on_the_device_and_lossless_ones_keep_ar_greedy(
        modules: dict[int, Any], device: str) -> None:
    target, draft = _pair(modules, device)
    cpu_ar = generate(*_pair(modules, "cpu"), PROMPT, method="ar", temperature=0,
                      max_new_tokens=12).tokens
    ar = generate(target, draft, PROMPT, method="ar", temperature=0, max_new_tokens=12).tokens
    assert ar == cpu_ar
    for name, info in METHODS.items():
        if name in ("ar", "pearl"):
            continue  # pearl runs worker processes of its own (tests/test_pearl.py)
        gamma = 3 if info.uses_draft else None
        out = generate(target, draft, PROMPT, method=name, gamma=gamma, temperature=0,
                       max_new_tokens=12, seed=1)
        assert len(out.tokens) == 12, name
        if info.lossless:
            assert out.tokens == ar, name


# 4. The batched engine's law on the device -----------------------------------------------------

def _first_token_pvalue(modules: dict[int, Any], device: str, method: Method) -> float:
    target, draft = _pair(modules, device)
    sampling = Sampling()
    drafter = make_drafter(target, draft, method)
    dev = torch.device(device)
    seeds = torch.randint(0, 2**62, (LAW_RUNS,), generator=torch.Generator().manual_seed(5))
    requests = [Request(list(PROMPT), method, sampling, 2,
                        Randomness(torch.Generator(device=dev).manual_seed(int(s))), 3,
                        drafter) for s in seeds]
    outs = Engine(target.spawn(), batch_size=LAW_ROWS).run(requests)
    assert sum(o.stats.accepted_total for o in outs) > LAW_RUNS // 4  # the verifier mattered
    p = torch.softmax(_logits(target, PROMPT)[-1].double(), -1)  # [V]
    counts = Counter(o.tokens[0] for o in outs)
    return chi2_pvalue(counts, {i: float(v) for i, v in enumerate(p)}, LAW_RUNS)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", ["token", "block"])
def test_batched_engine_first_token_follows_the_target_on_the_device(
        modules: dict[int, Any], device: str, method: str) -> None:
    assert _first_token_pvalue(modules, device, build_method(method)) > P_PASS


@pytest.mark.parametrize("device", DEVICES)
def test_batched_engine_catches_a_wrong_residual_on_the_device(modules: dict[int, Any],
                                                               device: str) -> None:
    assert _first_token_pvalue(modules, device, TargetResidual()) < P_FAIL


@pytest.mark.parametrize("device", DEVICES)
def test_generate_batch_on_the_device_equals_one_at_a_time(modules: dict[int, Any],
                                                           device: str) -> None:
    target, draft = _pair(modules, device)
    prompts = [PROMPT, PROMPT[:2], [7, 7, 7, 1, 2]]
    batch = generate_batch(target, draft, prompts, method="block", gamma=3, temperature=1,
                           seeds=[1, 2, 3], max_new_tokens=10, batch_size=2)
    for prompt, seed, result in zip(prompts, [1, 2, 3], batch.results, strict=True):
        alone = generate(target, draft, prompt, method="block", gamma=3, temperature=1,
                         seed=seed, max_new_tokens=10)
        assert result.tokens == alone.tokens


# 5. γ auto's re-timed passes on the device -----------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
def test_gamma_auto_times_its_passes_on_the_device(modules: dict[int, Any], device: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ``auto`` rows that must draft (γ ≥ 1): every iteration records its draft steps
    and target pass against the grid timed on the device, timed on CUDA between
    synchronisations (three per iteration: the time is the passes', not their launches');
    at T = 0 the tokens are ``ar``'s."""
    target, draft = _pair(modules, device)
    costs = measure_costs(target, draft, context=8, reps=1)
    syncs: list[object] = []
    if device == "cuda":
        real = torch.cuda.synchronize
        monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: (syncs.append(d), real(d)))
    method = build_method("block")
    sampling = method.adjust_sampling(Sampling(temperature=0.0))
    drafter = make_drafter(target, draft, method)
    prompts = [PROMPT, [7, 7, 7, 1, 2]]
    overhead = IterationOverhead()
    engine = Engine(target.spawn(), batch_size=2, overhead=overhead)
    outs = engine.run([Request(list(p), method, sampling, 10,
                               Randomness(torch.Generator(device=torch.device(device))),
                               AutoGamma(costs, max_gamma=3, min_gamma=1), drafter)
                       for p in prompts])
    assert overhead.iterations == engine.passes > 0
    assert len(overhead.target_level.ratios) == min(engine.passes, LEVEL_WINDOW)
    assert overhead.draft_level.ratios and all(r > 0 for r in overhead.draft_level.ratios)
    assert len(syncs) >= (3 * engine.passes if device == "cuda" else 0)
    for prompt, out in zip(prompts, outs, strict=True):
        ar = generate(target, draft, prompt, method="ar", temperature=0, max_new_tokens=10)
        assert out.tokens == ar.tokens
