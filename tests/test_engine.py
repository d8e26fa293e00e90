"""The speculative decoding loop (Algorithm 3): greedy equivalence, reproducibility,
clamping at EOS / budget / context window, draft-cache consistency and the statistics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest
import torch

import verispec
from verispec.drafters.base import Draft
from verispec.drafters.model import ModelDrafter
from verispec.engine.loop import GenerationOutput, speculative_generate
from verispec.engine.methods import SingleDraftMethod
from verispec.models.base import CausalLM
from verispec.models.hf import HFCausalLM
from verispec.models.toy import MarkovLM, RandomContextLM, TableLM
from verispec.sampling import Sampling
from verispec.verify import VerifyResult, block_verify, token_verify

VERIFIERS = {"token": token_verify, "block": block_verify}


class Recorder(SingleDraftMethod):
    """A lossless method that also records (γ of the draft, τ, draft tokens, Y) per iteration."""

    def __init__(self, name: str) -> None:
        super().__init__(name, VERIFIERS[name])
        self.trace: list[tuple[int, int, list[int], int]] = []

    def verify(self, target_probs: torch.Tensor, draft: Draft,
               generator: torch.Generator) -> VerifyResult:
        result = super().verify(target_probs, draft, generator)
        self.trace.append((draft.gamma, int(result.num_accepted[0]), draft.tokens[0].tolist(),
                           int(result.next_token[0])))
        return result


def _run(target: CausalLM, draft: CausalLM, prompt: Sequence[int], *, method: Recorder,
         gamma: int, max_new_tokens: int, seed: int, sampling: Sampling | None = None,
         on_tokens: Callable[[list[int]], None] | None = None) -> GenerationOutput:
    sampling = sampling or Sampling()
    return speculative_generate(target, ModelDrafter(draft, sampling), prompt, method=method,
                                gamma=gamma, sampling=sampling, max_new_tokens=max_new_tokens,
                                generator=torch.Generator().manual_seed(seed),
                                on_tokens=on_tokens)


# --------------------------------------------------------------------------------------
# Greedy: speculative output is token-for-token the autoregressive greedy output.
# --------------------------------------------------------------------------------------

PROMPT = [5, 17, 3, 42, 8, 8, 30]


@pytest.mark.parametrize("drafter, draft_kind", [
    ("model", "close"), ("model", "other"), ("ngram", None)])
@pytest.mark.parametrize("verifier", ["token", "block"])
def test_greedy_hf_matches_autoregressive(verifier: str, drafter: str, draft_kind: str | None,
                                          tiny: Callable[[str], HFCausalLM]) -> None:
    ar = verispec.generate(tiny("target"), None, PROMPT, verifier="ar", temperature=0,
                           max_new_tokens=40)
    assert len(ar.tokens) == 40 and ar.stats.iterations == 40
    draft = tiny(draft_kind) if draft_kind else None
    spec = verispec.generate(tiny("target"), draft, PROMPT, verifier=verifier, gamma=4,
                             temperature=0, max_new_tokens=40, drafter=drafter, seed=3)
    assert spec.tokens == ar.tokens
    s = spec.stats
    assert s.drafted_total > 0
    if draft_kind != "other":  # a close draft / repetitive text: drafts really get accepted
        assert s.accepted_total > 0 and s.target_calls < 40


@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize("model_cls", [RandomContextLM, MarkovLM])
def test_greedy_toy_matches_argmax_chain(verifier: str, model_cls: type) -> None:
    if model_cls is MarkovLM:
        target, draft = MarkovLM.random(5, 1), MarkovLM.random(5, 2)
    else:
        target, draft = RandomContextLM(5, 1), RandomContextLM(5, 2)
    prompt, n = [0, 1], 12
    chain: list[int] = []
    for _ in range(n):  # independent expectation: argmax of the exact table
        chain.append(int(target.next_probs(tuple(prompt + chain)).argmax()))
    for drafter in ("model", "ngram"):
        out = verispec.generate(target, draft, prompt, verifier=verifier, gamma=3,
                                temperature=0, max_new_tokens=n, drafter=drafter)
        assert out.tokens == chain, drafter


# --------------------------------------------------------------------------------------
# Reproducibility.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("verifier", ["token", "block"])
def test_seeded_runs_are_reproducible_toy(verifier: str) -> None:
    def run(seed: int) -> list[int]:
        return verispec.generate(RandomContextLM(6, 3), RandomContextLM(6, 4), [1, 2],
                                 verifier=verifier, gamma=3, seed=seed,
                                 max_new_tokens=20).tokens

    assert run(7) == run(7)
    assert len({tuple(run(s)) for s in range(5)}) > 1


@pytest.mark.parametrize("verifier", ["token", "block", "ar"])
def test_seeded_runs_are_reproducible_hf(verifier: str,
                                         tiny: Callable[[str], HFCausalLM]) -> None:
    def run(seed: int) -> list[int]:
        return verispec.generate(tiny("target"), tiny("close"), PROMPT, verifier=verifier,
                                 gamma=3, seed=seed, max_new_tokens=16).tokens

    first = run(11)
    assert run(11) == first
    assert run(12) != first and run(13) != first


# --------------------------------------------------------------------------------------
# Clamping: EOS, budget, context window.
# --------------------------------------------------------------------------------------

def _eos_pair(identical: bool) -> tuple[TableLM, TableLM]:
    target = RandomContextLM(4, seed=8, eos_token_id=3)
    draft = RandomContextLM(4, seed=8 if identical else 9)
    return target, draft


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_eos_and_budget_clamp_inside_the_block(verifier: str) -> None:
    eos, clamped_inside = 3, 0
    for seed in range(150):
        target, draft = _eos_pair(identical=seed % 2 == 0)
        budget = [1, 2, 5, 9, 14][seed % 5]
        method = Recorder(verifier)
        chunks: list[list[int]] = []
        out = _run(target, draft, [0, 1], method=method, gamma=4, max_new_tokens=budget,
                   seed=seed, on_tokens=chunks.append)
        toks = out.tokens
        assert 1 <= len(toks) <= budget
        assert eos not in toks[:-1], "emitted past EOS"
        if toks[-1] == eos:
            assert out.stats.stop_reason == "eos"
        else:
            assert len(toks) == budget and out.stats.stop_reason == "max_new_tokens"
        assert [t for c in chunks for t in c] == toks and len(chunks) == len(method.trace)
        emitted = 0
        for (g, tau, xs, y), new in zip(method.trace, chunks, strict=True):
            assert g + 1 <= budget - emitted  # γ is cut so the block fits the budget
            block = xs[:tau] + [y]
            cut = block.index(eos) + 1 if eos in block else len(block)
            assert new == block[:cut]  # the emitted chunk is the block cut after its EOS
            clamped_inside += cut < len(block)
            emitted += len(new)
    assert clamped_inside >= 5  # EOS really was met inside accepted blocks


def test_context_window_is_never_exceeded() -> None:
    target = RandomContextLM(4, seed=2, max_length=12)
    draft = RandomContextLM(4, seed=3, max_length=12)
    prompt = [0, 1, 2, 3, 0]
    out = _run(target, draft, prompt, method=Recorder("block"), gamma=4, max_new_tokens=50,
               seed=0)
    assert len(prompt) + len(out.tokens) == 12
    assert out.stats.stop_reason == "context_window"


# --------------------------------------------------------------------------------------
# Draft cache consistency.
# --------------------------------------------------------------------------------------

def _draft_cache_checker(draft: CausalLM, prompt: list[int], emitted: list[int]
                         ) -> Callable[[list[int]], None]:
    def check(new: list[int]) -> None:
        emitted.extend(new)
        ctx = prompt + emitted
        n = draft.length
        assert len(ctx) - 2 <= n <= len(ctx) - 1, (n, len(ctx))
        if isinstance(draft, TableLM):
            assert draft._rows[0] == ctx[:n]  # the cached tokens are a prefix of the context
        else:  # HF: the cache must give the same logits as a fresh prefill of ctx[:n + 1]
            probe = torch.tensor(ctx[n : n + 1])
            got = draft.extend(probe, num_logits=1)
            fresh = HFCausalLM(draft.model, draft.tokenizer)
            want = fresh.extend(torch.tensor(ctx[: n + 1]), num_logits=1)
            draft.rollback(n)
            assert torch.allclose(got, want, atol=1e-5, rtol=0)

    return check


@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize("backend", ["toy", "hf"])
def test_identical_draft_accepts_everything_and_cache_stays_consistent(
    verifier: str, backend: str, tiny: Callable[[str], HFCausalLM]
) -> None:
    if backend == "toy":
        target, draft = RandomContextLM(5, seed=4), RandomContextLM(5, seed=4)
        prompt = [1, 2, 3]
    else:
        target, draft = tiny("target"), tiny("target")  # same weights, separate caches
        prompt = list(PROMPT)
    method, emitted = Recorder(verifier), []
    gamma, budget = 3, 22
    out = _run(target, draft, prompt, method=method, gamma=gamma, max_new_tokens=budget,
               seed=1, on_tokens=_draft_cache_checker(draft, prompt, emitted))
    assert emitted == out.tokens and len(out.tokens) == budget
    assert all(tau == g for g, tau, _, _ in method.trace)  # p = q: τ = γ every iteration
    full = budget // (gamma + 1)
    assert out.stats.tau_histogram[gamma] == full and out.stats.iterations == full + 1
    # The last iteration's γ shrinks to fit the budget (22 = 5·4 + 2).
    assert method.trace[-1][0] == budget - full * (gamma + 1) - 1


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_draft_cache_consistent_under_rejections(verifier: str) -> None:
    target, draft = RandomContextLM(5, seed=4), RandomContextLM(5, seed=5)
    method, emitted = Recorder(verifier), []
    _run(target, draft, [4], method=method, gamma=4, max_new_tokens=40, seed=2,
         on_tokens=_draft_cache_checker(draft, [4], emitted))
    taus = Counter(tau for _, tau, _, _ in method.trace)
    assert taus[0] > 0 and len(taus) > 2  # rejections at several positions happened


# --------------------------------------------------------------------------------------
# Statistics.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("verifier", ["token", "block"])
@pytest.mark.parametrize("prompt", [[2], [2, 0, 1]])
def test_stats_are_consistent_with_the_trace(verifier: str, prompt: list[int]) -> None:
    target, draft = MarkovLM.random(4, 10), MarkovLM.random(4, 11)
    method = Recorder(verifier)
    out = _run(target, draft, prompt, method=method, gamma=3, max_new_tokens=30, seed=4)
    s, trace = out.stats, method.trace
    gs, taus = [g for g, _, _, _ in trace], [t for _, t, _, _ in trace]
    assert s.iterations == len(trace) == s.target_calls
    assert s.tokens_emitted == len(out.tokens) == 30
    assert s.block_efficiency == pytest.approx(30 / s.target_calls, abs=1e-12)
    assert sum(s.tau_histogram) == s.iterations
    assert s.tau_histogram == [taus.count(t) for t in range(max(taus) + 1)]
    assert s.accepted_total == sum(taus) and s.drafted_total == sum(gs)
    assert s.mean_accepted == pytest.approx(sum(taus) / len(taus), abs=1e-12)
    for i, rate in enumerate(s.acceptance_by_position):
        drafted = sum(g > i for g in gs)
        assert rate == pytest.approx(sum(t > i for t in taus) / drafted, abs=1e-12)
    assert len(s.acceptance_by_position) == max(gs)
    assert s.prefill_calls == (1 if len(prompt) > 1 else 0)
    assert s.target_tokens_scored == sum(g + 1 for g in gs)  # one pending token + the block
    assert s.draft_calls == sum(gs)  # one draft forward per drafted token
    assert s.method == verifier and s.lossless and s.gamma == 3
    d = s.to_dict()
    assert d["block_efficiency"] == s.block_efficiency and d["iterations"] == s.iterations
    assert "block efficiency" in s.summary()


def test_ar_stats() -> None:
    out = verispec.generate(RandomContextLM(5, 1), None, [0, 1], verifier="ar",
                            max_new_tokens=9, seed=0)
    s = out.stats
    assert len(out.tokens) == 9 and s.iterations == s.target_calls == 9
    assert s.block_efficiency == 1.0 and s.accepted_total == 0 and s.tau_histogram == [9]
    assert s.draft_calls == 0 and s.drafted_total == 0
