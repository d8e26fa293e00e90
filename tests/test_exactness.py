"""Exact enumeration (float64, 1e-12): lossless output law and Theorem 2's dominance.

* :func:`verispec.theory.speculative_law` (every draft block, every (τ, Y), the engine's
  clamping) must equal :func:`verispec.theory.target_law` for token and block verification,
  for random toy models (RandomContextLM and MarkovLM.random, vocab 2-4, γ 1-4, temperature 0,
  1 and warped). A target with an EOS token exercises clamping inside the accepted block.
* Negative controls (always accept; token verification with the residual replaced by p;
  block verification with token verification's early stop) are rejected by the same check.
* Theorem 2: P(τ_block ≥ k) ≥ P(τ_token ≥ k) for every k, strictly somewhere, and the
  laws of τ equal the paper's closed forms (Lemma 3 for block, Π min(1, p/q) for token).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from verispec.engine.request import accept_tokens
from verispec.models.toy import MarkovLM, RandomContextLM, TableLM
from verispec.sampling import Sampling
from verispec.theory import expected_accepted, speculative_law, target_law, tv_distance, warped
from verispec.verify import VerifyPlan, block_plan, plan_law, token_plan

TOL = 1e-12
PLANS = {"token": token_plan, "block": block_plan}
SAMPLINGS = {
    "T1": Sampling(),
    "T0": Sampling(temperature=0),
    "T0.7-topk2": Sampling(temperature=0.7, top_k=2),
    "T1.5-topp0.8": Sampling(temperature=1.5, top_p=0.8),
}


def _pair(kind: str, vocab: int, seed: int, **target_kw: object) -> tuple[TableLM, TableLM]:
    if kind == "markov":
        return (MarkovLM.random(vocab, seed, **target_kw), MarkovLM.random(vocab, seed + 1000))
    return (RandomContextLM(vocab, seed, **target_kw), RandomContextLM(vocab, seed + 1000))


def _max_abs_diff(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


# (model kind, vocab, γ, output length): enumeration sizes stay small (< 0.3 s each).
CASES = [
    ("random", 2, 1, 4), ("random", 2, 3, 5), ("random", 2, 4, 5), ("random", 3, 2, 4),
    ("random", 3, 4, 4), ("random", 4, 1, 3), ("random", 4, 3, 3),
    ("markov", 2, 2, 5), ("markov", 3, 3, 4), ("markov", 4, 2, 3), ("markov", 4, 4, 3),
]


@pytest.mark.parametrize("sampling_name", list(SAMPLINGS))
@pytest.mark.parametrize("kind, vocab, gamma, length", CASES)
def test_speculative_law_equals_target_law(kind: str, vocab: int, gamma: int, length: int,
                                           sampling_name: str) -> None:
    sampling = SAMPLINGS[sampling_name]
    target, draft = _pair(kind, vocab, seed=vocab * 10 + gamma)
    prompt = [1, 0]
    want = target_law(target, prompt, sampling, length)
    assert abs(sum(want.values()) - 1) < TOL
    if sampling.greedy:
        assert len(want) == 1  # greedy decoding is deterministic
    for name, plan_fn in PLANS.items():
        got = speculative_law(target, draft, prompt, plan_fn=plan_fn, gamma=gamma,
                              sampling=sampling, length=length)
        assert abs(sum(got.values()) - 1) < TOL
        assert _max_abs_diff(got, want) < TOL, name


def _clamp_probability(target: TableLM, draft: TableLM, prompt: list[int], gamma: int,
                       plan_fn: Callable[..., VerifyPlan]) -> float:
    """P(the first iteration's accepted block X^τ, Y is cut short at an EOS)."""
    p, q = warped(target, Sampling()), warped(draft, Sampling())
    ctx, total = tuple(prompt), 0.0
    for block in itertools.product(range(target.vocab_size), repeat=gamma):
        q_rows = [q(ctx + block[:i]) for i in range(gamma)]
        block_prob = math.prod(float(q_rows[i][x]) for i, x in enumerate(block))
        p_rows = torch.stack([p(ctx + block[:i]) for i in range(gamma + 1)])[None]
        law = plan_law(plan_fn(p_rows, torch.stack(q_rows)[None], torch.tensor([block])))[0]
        for tau, y in (law > 0).nonzero().tolist():
            new, _ = accept_tokens(list(block[:tau]) + [y], target.eos_token_ids, 99)
            if len(new) < tau + 1:
                total += block_prob * float(law[tau, y])
    return total


@pytest.mark.parametrize("kind, gamma", [("random", 2), ("random", 3), ("random", 4),
                                         ("markov", 2), ("markov", 3)])
def test_lossless_with_eos_clamped_inside_the_block(kind: str, gamma: int) -> None:
    eos = 0
    target, draft = _pair(kind, 3, seed=50 + gamma, eos_token_id=eos)
    prompt, length = [2], 5
    want = target_law(target, prompt, Sampling(), length)
    early = sum(v for k, v in want.items() if len(k) < length)
    assert early > 0.2  # many sequences stop at EOS before the budget
    assert all(eos not in k[:-1] for k in want)
    for name, plan_fn in PLANS.items():
        # The exact check below covers blocks that really are cut at EOS.
        assert _clamp_probability(target, draft, prompt, gamma, plan_fn) > 0.01, name
        got = speculative_law(target, draft, prompt, plan_fn=plan_fn, gamma=gamma,
                              sampling=Sampling(), length=length)
        assert all(eos not in k[:-1] for k in got), "emitted past EOS"
        assert _max_abs_diff(got, want) < TOL, name


# --------------------------------------------------------------------------------------
# Negative controls: the same comparison must reject wrong verifiers.
# --------------------------------------------------------------------------------------

def always_accept_plan(p: Tensor, q: Tensor, x: Tensor) -> VerifyPlan:
    plan = token_plan(p, q, x)
    return VerifyPlan(torch.ones_like(plan.accept_probs), plan.residuals, "first_reject")


def token_residual_p_plan(p: Tensor, q: Tensor, x: Tensor) -> VerifyPlan:
    plan = token_plan(p, q, x)
    return VerifyPlan(plan.accept_probs, p.clone(), "first_reject")


def block_with_break_plan(p: Tensor, q: Tensor, x: Tensor) -> VerifyPlan:
    plan = block_plan(p, q, x)
    return VerifyPlan(plan.accept_probs, plan.residuals, "first_reject")


@pytest.mark.parametrize("wrong", [always_accept_plan, token_residual_p_plan,
                                   block_with_break_plan])
def test_negative_controls_are_detected(wrong: Callable[..., VerifyPlan]) -> None:
    target, draft = _pair("random", 3, seed=5)
    want = target_law(target, [1], Sampling(), 4)
    got = speculative_law(target, draft, [1], plan_fn=wrong, gamma=3, sampling=Sampling(),
                          length=4)
    assert abs(sum(got.values()) - 1) < TOL  # still a distribution, just the wrong one
    assert tv_distance(got, want) > 1e-3


# --------------------------------------------------------------------------------------
# Theorem 2 and the closed forms of the law of τ.
# --------------------------------------------------------------------------------------

def _closed_form_survival(target: TableLM, draft: TableLM, ctx: list[int], gamma: int,
                          sampling: Sampling) -> tuple[Tensor, Tensor]:
    """P(τ ≥ i), i = 0..γ: token Σ_{x^i} Π_j min(p, q); block Σ_{x^i} q(x^i) p_i(x^i)."""
    p, q = warped(target, sampling), warped(draft, sampling)
    token = torch.zeros(gamma + 1, dtype=torch.float64)
    block = torch.zeros(gamma + 1, dtype=torch.float64)
    for i in range(gamma + 1):
        for xs in itertools.product(range(target.vocab_size), repeat=i):
            q_path, tok, p_i = 1.0, 1.0, 1.0
            for j, x in enumerate(xs):
                c = tuple(ctx) + xs[:j]
                pj, qj = float(p(c)[x]), float(q(c)[x])
                q_path *= qj
                tok *= min(pj, qj)
                p_i = min(p_i * pj / qj, 1.0) if qj > 0 else 0.0
            token[i] += tok
            block[i] += q_path * p_i  # Lemma 3: P(τ ≥ i | X^i = x^i) = p_i(x^i)
    return token, block


def _survival(law: Tensor) -> Tensor:
    return torch.flip(torch.cumsum(torch.flip(law, [0]), 0), [0])  # [γ+1], P(τ ≥ k)


@pytest.mark.parametrize("kind, vocab, gamma, seed, sampling_name", [
    ("random", 2, 2, 1, "T1"), ("random", 3, 3, 2, "T1"), ("random", 3, 4, 3, "T1.5-topp0.8"),
    ("random", 4, 3, 4, "T0.7-topk2"), ("markov", 2, 4, 5, "T1"), ("markov", 3, 3, 6, "T1"),
    ("markov", 4, 2, 7, "T1.5-topp0.8"),
])
def test_theorem2_block_dominates_token(kind: str, vocab: int, gamma: int, seed: int,
                                        sampling_name: str) -> None:
    sampling = SAMPLINGS[sampling_name]
    target, draft = _pair(kind, vocab, seed)
    ctx = [0, 1]
    e_tok, law_tok = expected_accepted(target, draft, ctx, plan_fn=token_plan, gamma=gamma,
                                       sampling=sampling)
    e_blk, law_blk = expected_accepted(target, draft, ctx, plan_fn=block_plan, gamma=gamma,
                                       sampling=sampling)
    assert abs(float(law_tok.sum()) - 1) < TOL and abs(float(law_blk.sum()) - 1) < TOL
    s_tok, s_blk = _survival(law_tok), _survival(law_blk)
    # The paper's closed forms, computed independently of the plan functions.
    c_tok, c_blk = _closed_form_survival(target, draft, ctx, gamma, sampling)
    assert torch.allclose(s_tok, c_tok, atol=TOL, rtol=0)
    assert torch.allclose(s_blk, c_blk, atol=TOL, rtol=0)
    # Stochastic dominance, strictly better somewhere, and E[τ] = Σ_k P(τ ≥ k).
    assert bool((s_blk >= s_tok - TOL).all()), (s_blk, s_tok)
    assert float((s_blk - s_tok).max()) > 1e-4
    assert abs(e_tok - float(s_tok[1:].sum())) < TOL and abs(e_blk - float(s_blk[1:].sum())) < TOL
    assert e_blk > e_tok
