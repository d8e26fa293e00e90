"""Greedy block verification (*Block Verification Accelerates Speculative Decoding*, Sun et
al., ICLR 2025, Appendix C: Algorithms 4, 5, 6).

What is proved here:

* the plan equals a scalar transcription of Algorithm 4, and dominates block verification;
* Lemma 9 (P(X^ℓ = x^ℓ, τ ≥ ℓ) = min{p(x^ℓ), q(x^ℓ)}) and Theorem 3 (E[τ] ≥ block's, equal
  to the coupling bound) exactly, on the paper's A/B example and on random toy models;
* Algorithm 6 is lossless: the exact output law equals the target's to 1e-12 (several
  vocabularies, γ, lengths and warps, including top-k where the draft joint can be zero),
  while Algorithm 4 alone is not (the paper's counterexample: P(BA) = 1/3, not 2/9) and
  dropping older modification layers is not either;
* the real engine (``verispec.generate``) samples the exact law (chi-square, p > 1e-3) and
  the same test rejects ``greedy-block-unmodified`` (p < 1e-6);
* invalid inputs raise clear errors.
"""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

import verispec
import verispec.methods.greedy_block as method_gb
from verispec.engine.protocols import VerifyBatch
from verispec.methods import METHODS, build_method
from verispec.methods.greedy_block import GreedyBlockMethod
from verispec.models.toy import ContextIndependentLM, MarkovLM, RandomContextLM, TableLM
from verispec.sampling import Randomness, Sampling
from verispec.theory.exact import Law, expected_accepted, target_law, warped
from verispec.theory.greedy_block import coupling_bound, greedy_block_law
from verispec.verify import plan_law
from verispec.verify.block import block_plan
from verispec.verify.greedy_block import (
    Modifications,
    advance_modifications,
    greedy_block_plan,
    modified_targets,
    modify_layer,
)

A, B = 0, 1
T1 = Sampling()


def ab_models() -> tuple[TableLM, TableLM]:
    """The paper's Section 2 example: Mb(A) = 1/3 (target), Ms(A) = 2/3 (draft)."""
    return ContextIndependentLM([1 / 3, 2 / 3]), ContextIndependentLM([2 / 3, 1 / 3])


def max_diff(a: Law, b: Law) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def random_rows(seed: int, b: int, gamma: int, v: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand((b, gamma + 1, v), generator=g, dtype=torch.float64) ** 3
    q = torch.rand((b, gamma, v), generator=g, dtype=torch.float64) ** 3
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    tokens = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, gamma)
    return p, q, tokens


# ---------------------------------------------------------------- Algorithm 4 (the plan)


def scalar_algorithm4(
    p: list[list[float]], q: list[list[float]], x: list[int]
) -> tuple[list[float], list[list[float]]]:
    """Algorithm 4 transcribed with Python floats for one row: (h_1..h_γ, residuals)."""
    gamma, v = len(x), len(p[0])
    path, h, res = 1.0, [], []
    for i in range(gamma + 1):
        if i > 0:
            path *= p[i - 1][x[i - 1]] / q[i - 1][x[i - 1]]
        if i == gamma:
            if gamma:
                h.append(min(1.0, path))
            res.append(p[gamma])
            break
        up = [max(path * p[i][y] - q[i][y], 0.0) for y in range(v)]
        down = sum(max(q[i][y] - path * p[i][y], 0.0) for y in range(v))
        if i > 0:
            h.append(1.0 if down == 0 else min(1.0, sum(up) / down))
        res.append([u / sum(up) for u in up] if sum(up) > 0 else p[i])
    return h, res


@pytest.mark.parametrize("gamma", [0, 1, 3, 5])
def test_plan_is_algorithm_4(gamma: int) -> None:
    p, q, x = random_rows(seed=gamma, b=6, gamma=gamma, v=4)
    plan = greedy_block_plan(p, q, x)
    assert plan.rule == "last_accept"
    for row in range(6):
        h, res = scalar_algorithm4(p[row].tolist(), q[row].tolist(), x[row].tolist())
        h_ref = torch.tensor(h, dtype=torch.float64).reshape(gamma)
        assert torch.allclose(plan.accept_probs[row], h_ref, atol=1e-14, rtol=0)
        assert torch.allclose(plan.residuals[row], torch.tensor(res, dtype=torch.float64),
                              atol=1e-14, rtol=0)
    assert torch.allclose(plan_law(plan).sum(dim=(1, 2)), torch.ones(6, dtype=torch.float64))


def test_plan_dominates_block_and_equals_it_without_clamping() -> None:
    p, q, x = random_rows(seed=7, b=64, gamma=4, v=3)
    greedy, block = greedy_block_plan(p, q, x), block_plan(p, q, x)
    assert bool((greedy.accept_probs >= block.accept_probs - 1e-12).all())
    assert bool((greedy.accept_probs > block.accept_probs + 1e-6).any())
    # Where the joint ratio never exceeds 1, block's min{1, ·} is inactive: same plan.
    ratio = p[:, :-1].gather(-1, x[..., None]).squeeze(-1) / q.gather(-1, x[..., None]).squeeze(-1)
    unclamped = (torch.cumprod(ratio, dim=1) <= 1).all(dim=1)
    assert 0 < int(unclamped.sum()) < 64
    assert torch.allclose(greedy.accept_probs[unclamped], block.accept_probs[unclamped], atol=1e-14)
    assert torch.allclose(greedy.residuals[unclamped], block.residuals[unclamped], atol=1e-14)


# ---------------------------------------------------------------- Lemma 9, Theorem 3


@pytest.mark.parametrize("seed,vocab,gamma", [(1, 2, 3), (2, 3, 2), (3, 3, 3)])
def test_lemma_9_acceptance_of_every_prefix(seed: int, vocab: int, gamma: int) -> None:
    target, draft = RandomContextLM(vocab, seed), RandomContextLM(vocab, seed + 100)
    p, q = warped(target, T1), warped(draft, T1)
    reach: dict[tuple[int, ...], float] = {}  # P(X^ℓ = x^ℓ, τ >= ℓ)
    for block in itertools.product(range(vocab), repeat=gamma):
        q_rows = torch.stack([q(block[:i]) for i in range(gamma)])
        p_rows = torch.stack([p(block[:i]) for i in range(gamma + 1)])
        prob = float(torch.prod(q_rows[torch.arange(gamma), list(block)]))
        tau_law = plan_law(greedy_block_plan(p_rows[None], q_rows[None],
                                             torch.tensor([block])))[0].sum(-1)  # [γ+1]
        for ell in range(1, gamma + 1):
            key = block[:ell]
            reach[key] = reach.get(key, 0.0) + prob * float(tau_law[ell:].sum())
    for key, value in reach.items():
        joint_p = float(torch.prod(torch.stack([p(key[:i])[x] for i, x in enumerate(key)])))
        joint_q = float(torch.prod(torch.stack([q(key[:i])[x] for i, x in enumerate(key)])))
        assert value == pytest.approx(min(joint_p, joint_q), abs=1e-12)


def test_theorem_3_on_the_paper_example() -> None:
    target, draft = ab_models()
    kw = {"gamma": 2, "sampling": T1}
    greedy, law = expected_accepted(target, draft, [A], plan_fn=greedy_block_plan, **kw)
    block, _ = expected_accepted(target, draft, [A], plan_fn=block_plan, **kw)
    # Section 2: block verification accepts 11/9 tokens; greedy block verification accepts
    # AB, BA, BB surely and AA with probability 1/4 (Appendix C): 2(5/9) + 2(1/4)(4/9) = 12/9.
    assert block == pytest.approx(11 / 9, abs=1e-12)
    assert greedy == pytest.approx(2 * (5 / 9) + 2 * (1 / 4) * (4 / 9), abs=1e-12)
    assert float(law[1]) == pytest.approx(0.0, abs=1e-15)  # Appendix C: τ ∈ {0, 2} here


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_theorem_3_greedy_accepts_at_least_block(temperature: float) -> None:
    sampling, gaps = Sampling(temperature), []
    for seed, gamma in itertools.product(range(4), (1, 2, 3)):
        target, draft = RandomContextLM(3, 10 + seed), RandomContextLM(3, 20 + seed)
        kw = {"gamma": gamma, "sampling": sampling}
        greedy, _ = expected_accepted(target, draft, [0], plan_fn=greedy_block_plan, **kw)
        block, _ = expected_accepted(target, draft, [0], plan_fn=block_plan, **kw)
        bound = coupling_bound(target, draft, [0], **kw)
        assert greedy == pytest.approx(bound, abs=1e-12)  # Lemma 9
        assert greedy >= block - 1e-12
        gaps.append(greedy - block)
    assert max(gaps) > 1e-3  # strictly better somewhere (γ >= 2)
    assert min(gaps[::3]) == pytest.approx(0.0, abs=1e-12)  # γ = 1: both are token verification


# ---------------------------------------------------------------- Algorithm 6 is lossless


CASES = [  # (vocab, gamma, length, sampling)
    (2, 1, 5, Sampling(1.0)),
    (2, 2, 5, Sampling(1.0)),
    (2, 3, 5, Sampling(0.7)),
    (3, 2, 4, Sampling(1.0)),
    (3, 3, 4, Sampling(0.7)),
    (3, 3, 4, Sampling(1.0, top_k=2)),  # zeros in q: joint draft ratio r = inf occurs
    (3, 2, 4, Sampling(1.3, top_p=0.8)),
    (3, 3, 4, Sampling(0.0)),
]


@pytest.mark.parametrize("vocab,gamma,length,sampling", CASES)
@pytest.mark.parametrize("kind", ["random", "markov"])
def test_output_law_equals_target(vocab: int, gamma: int, length: int, sampling: Sampling,
                                  kind: str) -> None:
    if kind == "random":
        target, draft = RandomContextLM(vocab, 1), RandomContextLM(vocab, 2, sharpness=2.0)
    else:
        target, draft = MarkovLM.random(vocab, 3), MarkovLM.random(vocab, 4)
    exact = target_law(target, [0], sampling, length)
    law = greedy_block_law(target, draft, [0], gamma=gamma, sampling=sampling, length=length)
    assert max_diff(law, exact) < 1e-12
    biased = greedy_block_law(target, draft, [0], gamma=gamma, sampling=sampling, length=length,
                              modify=False)
    if gamma >= 2 and not sampling.greedy:  # the modification is what makes it exact
        assert max_diff(biased, exact) > 1e-4


def test_eos_and_infinite_ratios_are_exercised(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {"inf": 0, "layers": 0}
    original = method_gb.advance_modifications

    def spy(*args: object) -> Modifications:
        mods = original(*args)  # type: ignore[arg-type]
        seen["inf"] += int(torch.isinf(mods.ratios).sum())
        seen["layers"] = max(seen["layers"], mods.num_layers)
        return mods

    monkeypatch.setattr(method_gb, "advance_modifications", spy)
    sampling = Sampling(1.0, top_k=2)
    target = RandomContextLM(3, 5, eos_token_id=2)
    draft = RandomContextLM(3, 6, eos_token_id=2)
    law = greedy_block_law(target, draft, [0], gamma=3, sampling=sampling, length=5)
    assert max_diff(law, target_law(target, [0], sampling, 5)) < 1e-12
    assert any(len(k) < 5 for k in law)  # EOS stopped some sequences
    assert seen["inf"] > 0 and seen["layers"] >= 2


def test_modify_layer_with_infinite_ratio_is_the_identity() -> None:
    p, q, x = random_rows(seed=3, b=2, gamma=2, v=3)
    q_ext = torch.cat([q, q[:, -1:]], dim=1)
    ratio = torch.tensor([float("inf"), 0.5], dtype=torch.float64)
    out = modify_layer(p, q_ext, x, ratio, torch.tensor([3, 3]))
    assert torch.equal(out[0], p[0])
    assert not torch.allclose(out[1], p[1])
    assert torch.allclose(out.sum(-1), torch.ones(2, 3, dtype=torch.float64))


def test_counterexample_needs_the_modification() -> None:
    target, draft = ab_models()
    mb, ms = target.table, draft.table
    # γ = 2 in the first iteration needs a budget of 3 tokens (the engine drafts room - 1).
    laws = {m: greedy_block_law(target, draft, [A], gamma=2, sampling=T1, length=3, modify=m)
            for m in (True, False)}
    p_ba = {m: sum(v for k, v in law.items() if k[:2] == (B, A)) for m, law in laws.items()}
    # Appendix C: Ms(BA) + Ms(AA) P(reject AA, Y = B) Mb(A), with P(reject AA) = 1 - 1/4.
    paper = float(ms[B] * ms[A] + ms[A] * ms[A] * (1 - (mb[A] / ms[A]) ** 2) * mb[A])
    assert paper == pytest.approx(1 / 3, abs=1e-15)
    assert p_ba[False] == pytest.approx(1 / 3, abs=1e-12)
    assert p_ba[True] == pytest.approx(float(mb[B] * mb[A]), abs=1e-12)
    assert p_ba[True] == pytest.approx(2 / 9, abs=1e-12)
    assert max_diff(laws[True], target_law(target, [A], T1, 3)) < 1e-12


def test_modified_target_after_rejecting_aa_is_a_point_mass_on_b() -> None:
    target, draft = ab_models()
    p = target.table.expand(1, 3, 2)  # [1, γ+1, V]
    q_ext = draft.table.expand(1, 3, 2)
    layers = modified_targets(p, q_ext, torch.tensor([[A, A]]), Modifications.none(1))
    mods = advance_modifications(Modifications.none(1), layers, q_ext, torch.tensor([[A, A]]),
                                 torch.tensor([0]), torch.tensor([B]))
    assert mods.remaining.tolist() == [[1]]  # γ - τ - 1 positions
    assert mods.ratios.tolist() == [[pytest.approx(float(target.table[B] / draft.table[B]))]]
    nxt = modified_targets(p, q_ext, torch.tensor([[A, B]]), mods)[-1, 0]  # [γ+1, V]
    assert torch.allclose(nxt[0], torch.tensor([0.0, 1.0], dtype=torch.float64), atol=1e-15)
    assert torch.equal(nxt[1:], p[0, 1:])  # later positions keep the target


def test_older_layers_matter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Algorithm 6 modifies the *current* target: keeping only the newest layer is biased."""
    original = method_gb.advance_modifications

    def newest_only(*args: object) -> Modifications:
        mods = original(*args)  # type: ignore[arg-type]
        return Modifications(mods.ratios[:, -1:], mods.remaining[:, -1:])

    target, draft = RandomContextLM(2, 30), RandomContextLM(2, 40)
    exact = target_law(target, [0], T1, 5)
    right = greedy_block_law(target, draft, [0], gamma=3, sampling=T1, length=5)
    assert max_diff(right, exact) < 1e-12
    monkeypatch.setattr(method_gb, "advance_modifications", newest_only)
    wrong = greedy_block_law(target, draft, [0], gamma=3, sampling=T1, length=5)
    assert max_diff(wrong, exact) > 1e-6


# ---------------------------------------------------------------- the real engine




RUNS = 2000


def engine_p_value(method: str, target: TableLM, draft: TableLM, gamma: int, length: int,
                   law: Law) -> float:
    """Chi-square p-value of RUNS engine generations (seeds 0..RUNS-1) against ``law``."""
    counts = Counter(
        tuple(verispec.generate(target, draft, [0], method=method, gamma=gamma,
                                max_new_tokens=length, seed=seed).tokens)
        for seed in range(RUNS)
    )
    support = sorted(k for k, v in law.items() if v > 0)
    assert set(counts) <= set(support), "the engine produced a sequence of probability zero"
    observed = [counts[k] for k in support]
    expected = [RUNS * law[k] / sum(law.values()) for k in support]
    return float(chisquare(observed, expected).pvalue)


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("pair,gamma,length", [("ab", 2, 3), ("random", 3, 4)])
def test_engine_samples_the_target_law(pair: str, gamma: int, length: int) -> None:
    if pair == "ab":
        target, draft = ab_models()
    else:
        target, draft = RandomContextLM(2, 30), RandomContextLM(2, 40)
    exact = target_law(target, [0], T1, length)
    # Confidence bound: a correct sampler fails this with probability 1e-3.
    assert engine_p_value("greedy-block", target, draft, gamma, length, exact) > 1e-3


@pytest.mark.usefixtures("one_thread")
def test_engine_negative_control_unmodified_is_rejected() -> None:
    target, draft = ab_models()
    exact = target_law(target, [0], T1, 3)
    assert engine_p_value("greedy-block-unmodified", target, draft, 2, 3, exact) < 1e-6
    # ... while it does sample its own (biased) exact law.
    biased = greedy_block_law(target, draft, [0], gamma=2, sampling=T1, length=3, modify=False)
    assert engine_p_value("greedy-block-unmodified", target, draft, 2, 3, biased) > 1e-3


def _one_row_batch(p: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor,
                   next_probs: torch.Tensor | None, state: Modifications,
                   gen: torch.Generator) -> VerifyBatch:
    """One request's iteration as the engine hands it to a method: p [1, γ+1, V],
    tokens [1, γ], q [1, γ, V], next_probs [1, V] or None."""
    return VerifyBatch(p[None], probs[None], tokens[None], torch.tensor([tokens.shape[1]]),
                       None if next_probs is None else next_probs[None], None,
                       [Randomness(gen)], [state])


def test_method_state_per_request() -> None:
    target, draft = ab_models()
    method = GreedyBlockMethod()
    assert method.lossless and method.needs_next_probs and method.name == "greedy-block"
    p = target.table.expand(1, 3, 2).clone()
    tokens, probs = torch.tensor([[A, A]]), draft.table.expand(1, 2, 2).clone()
    after = draft.table[None].clone()
    gen = torch.Generator().manual_seed(0)
    fresh = method.new_state()
    assert isinstance(fresh, Modifications) and fresh.num_layers == 0
    for _ in range(100):  # τ = 0 (reject AA, Y = B) has probability 3/4
        batch = _one_row_batch(p, tokens, probs, after, method.new_state(), gen)
        result = method.verify(batch)
        if int(result.num_accepted[0]) == 0:
            break
    assert int(result.next_token[0]) == B
    state = batch.states[0]  # the method replaced the request's state in place
    assert state.num_layers == 1
    assert state.remaining.tolist() == [[1]]
    assert method.new_state().num_layers == 0 and fresh.num_layers == 0  # nothing shared
    # A layer that reaches the end of the block needs q after it: no next_probs, an error.
    reaching = Modifications(torch.tensor([[0.5]], dtype=torch.float64), torch.tensor([[3]]))
    with pytest.raises(ValueError, match="next_probs"):
        method.verify(_one_row_batch(p, tokens, probs, None, reaching, gen))


# ---------------------------------------------------------------- registry and errors


def test_registry_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert METHODS["greedy-block"].lossless is True
    assert METHODS["greedy-block-unmodified"].lossless is False
    assert "BIASED" in METHODS["greedy-block-unmodified"].summary
    assert build_method("greedy-block").lossless
    assert not build_method("greedy-block-unmodified").lossless
    for name in ("greedy-block", "greedy-block-unmodified"):
        info = METHODS[name]
        assert info.options() == {} and info.batchable and info.law is not None
        assert not build_method(name).matches_at_greedy  # p is modified: not plain matching
    from verispec.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    text = capsys.readouterr().out
    assert "greedy-block " in text and "greedy-block-unmodified" in text and "BIASED" in text


def test_invalid_parameters() -> None:
    target, draft = ab_models()
    p, q, x = random_rows(seed=0, b=1, gamma=2, v=2)
    with pytest.raises(ValueError, match="shape mismatch"):
        greedy_block_plan(p, q[:, :1], x)
    with pytest.raises(ValueError, match="q_ext"):
        modified_targets(p, q, x, Modifications.none(1))
    with pytest.raises(ValueError, match="rows"):
        modified_targets(p, torch.cat([q, q[:, :1]], 1), x, Modifications.none(2))
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        Modifications(torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="gamma"):
        greedy_block_law(target, draft, [A], gamma=-1, sampling=T1, length=2)
    with pytest.raises(ValueError, match="length"):
        greedy_block_law(target, draft, [A], gamma=1, sampling=T1, length=0)
    with pytest.raises(ValueError, match="gamma"):
        verispec.generate(target, draft, [A], method="greedy-block", gamma=0)
    with pytest.raises(ValueError, match="n-gram"):  # q must be a fixed function of the context
        verispec.generate(target, draft, [A, B, A, B], method="greedy-block", drafter="ngram",
                          max_new_tokens=4)
    with pytest.raises(TypeError):  # the registry's convention for unknown options
        build_method("greedy-block", epsilon=0.1)
