"""Multi-draft speculative decoding (Algorithm 4 / Theorem 3 of
*A Theoretical Perspective for Speculative Decoding Algorithm*, Yin et al., NeurIPS 2024):
losslessness, Theorem 3's rejections,
the sampler against the exact law (with a negative control), the engine's cost accounting."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch
from scipy import stats as sps

import verispec
from verispec.engine.protocols import VerifyBatch
from verispec.methods import METHODS, build_method
from verispec.methods import multidraft as method_md
from verispec.methods.multidraft import MultiDraftMethod
from verispec.models.toy import ContextIndependentLM, MarkovLM, RandomContextLM
from verispec.sampling import Randomness, Sampling
from verispec.theory.exact import speculative_law, target_law, tv_distance
from verispec.theory.multidraft import (
    batch_improvement,
    bernoulli_batch_improvement,
    bernoulli_rejection,
    multidraft_speculative_law,
    single_token_rejection,
    theorem3_rejection,
    uniform_batch_improvement,
    uniform_rejection,
)
from verispec.verify import plan_law, token_plan
from verispec.verify._core import normalise_or
from verispec.verify.multidraft import (
    MultiDraftPlan,
    multidraft_draw,
    multidraft_law,
    multidraft_plan,
    multidraft_verify,
)

F64 = torch.float64


def _max_diff(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def _rand_probs(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    w = torch.rand(shape, generator=g, dtype=F64) ** 2 + 1e-3
    return w / w.sum(-1, keepdim=True)


# --- exact losslessness -------------------------------------------------------------------

PAIRS = {
    "markov": lambda: (MarkovLM.random(3, seed=0), MarkovLM.random(3, seed=1)),
    "random-ctx": lambda: (RandomContextLM(3, seed=4), RandomContextLM(3, seed=5, sharpness=2.5)),
    "random-ctx-eos": lambda: (RandomContextLM(3, seed=7, eos_token_id=2),
                               RandomContextLM(3, seed=8, sharpness=0.5, eos_token_id=2)),
    "binary": lambda: (MarkovLM.random(2, seed=2), MarkovLM.random(2, seed=9)),
}


@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("temperature", [1.0, 0.6, 0.0])
@pytest.mark.parametrize(("num_drafts", "gamma"), [(2, 1), (2, 2), (3, 2)])
def test_whole_sequence_law_equals_target(pair: str, temperature: float, num_drafts: int,
                                          gamma: int) -> None:
    target, draft = PAIRS[pair]()
    sampling = Sampling(temperature=temperature)
    law = multidraft_speculative_law(target, draft, [1], num_drafts=num_drafts, gamma=gamma,
                                     sampling=sampling, length=3)
    expected = target_law(target, [1], sampling, 3)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    assert _max_diff(law, expected) < 1e-12


def test_exact_enumeration_detects_a_wrong_residual(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control for the test above: without the residual update the law is visibly off."""
    target, draft = PAIRS["markov"]()
    sampling = Sampling()
    monkeypatch.setattr(method_md, "multidraft_plan", lambda *a: _no_update_plan(*a))
    law = multidraft_speculative_law(target, draft, [1], num_drafts=3, gamma=2,
                                     sampling=sampling, length=3)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    assert tv_distance(law, target_law(target, [1], sampling, 3)) > 1e-2


def test_one_draft_is_token_verification() -> None:
    g = torch.Generator().manual_seed(0)
    b, gamma, v = 64, 3, 5
    p, q = _rand_probs((b, gamma + 1, v), g), _rand_probs((b, gamma, v), g)
    x = torch.multinomial(q.reshape(-1, v), 1, generator=g).reshape(b, gamma)
    law = multidraft_law(multidraft_plan(p[:, None], q[:, None], x[:, None]))  # [B, 1, γ+1, V]
    assert (law[:, 0] - plan_law(token_plan(p, q, x))).abs().max() < 1e-12
    target, draft = PAIRS["random-ctx"]()
    for sampling in (Sampling(), Sampling(temperature=0.5)):
        md = multidraft_speculative_law(target, draft, [0], num_drafts=1, gamma=2,
                                        sampling=sampling, length=3)
        tok = speculative_law(target, draft, [0], plan_fn=token_plan, gamma=2,
                              sampling=sampling, length=3)
        assert _max_diff(md, tok) < 1e-12


def test_gamma_zero_emits_a_target_token() -> None:
    p = _rand_probs((4, 3, 1, 6), torch.Generator().manual_seed(1))
    law = multidraft_law(multidraft_plan(p, p[:, :, :0], torch.zeros((4, 3, 0), dtype=torch.int64)))
    assert law.shape == (4, 3, 1, 6)
    assert (law[:, 0, 0] - p[:, 0, 0]).abs().max() < 1e-12
    assert law[:, 1:].abs().max() == 0


# --- Theorem 3: rejections ----------------------------------------------------------------

BERNOULLI = [(0.8, 0.3), (0.6, 0.1), (0.95, 0.5)]  # (u, v): draft Ber(u), target Ber(v)
UNIFORM = [(4, 2), (6, 2), (4, 3), (5, 1)]  # (V, V'): draft uniform on V, target on V'


def _bernoulli(u: float, v: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([1 - v, v], dtype=F64), torch.tensor([1 - u, u], dtype=F64)  # p, q


def _uniform(v_all: int, v_sub: int) -> tuple[torch.Tensor, torch.Tensor]:
    support = torch.randperm(v_all, generator=torch.Generator().manual_seed(v_all))[:v_sub]
    p = torch.zeros(v_all, dtype=F64)
    p[support] = 1.0 / v_sub
    return p, torch.full((v_all,), 1.0 / v_all, dtype=F64)


@pytest.mark.parametrize(("u", "v"), BERNOULLI)
def test_bernoulli_rejection_matches_theorem3(u: float, v: float) -> None:
    p, q = _bernoulli(u, v)
    exact = [single_token_rejection(p, q, m) for m in range(1, 6)]
    for m, rej in enumerate(exact, start=1):
        assert abs(rej - (u - v) * u ** (m - 1)) < 1e-12  # written out independently
        assert abs(rej - bernoulli_rejection(u, v, m)) < 1e-12
        assert abs(rej - theorem3_rejection(p, q, m)) < 1e-12
        assert abs(batch_improvement(p, q, m) - bernoulli_batch_improvement(u, v, m)) < 1e-12
    assert all(a > b for a, b in itertools.pairwise(exact))  # strictly fewer rejections with M


@pytest.mark.parametrize(("v_all", "v_sub"), UNIFORM)
def test_uniform_rejection_matches_theorem3(v_all: int, v_sub: int) -> None:
    p, q = _uniform(v_all, v_sub)
    r = v_all / v_sub
    exact = [single_token_rejection(p, q, m) for m in range(1, 6)]
    for m, rej in enumerate(exact, start=1):
        assert abs(rej - (1 - 1 / r) ** m) < 1e-12
        assert abs(rej - uniform_rejection(r, m)) < 1e-12
        assert abs(batch_improvement(p, q, m) - uniform_batch_improvement(r, m)) < 1e-12
    assert all(a > b for a, b in itertools.pairwise(exact))


def test_theorem3_product_formula_on_random_distributions() -> None:
    g = torch.Generator().manual_seed(3)
    for _ in range(5):
        p, q = _rand_probs((4,), g), _rand_probs((4,), g)
        exact = [single_token_rejection(p, q, m) for m in range(1, 5)]
        assert abs(exact[0] - 0.5 * float((p - q).abs().sum())) < 1e-12  # M = 1: TV(p, q)
        for m, rej in enumerate(exact, start=1):
            assert abs(rej - theorem3_rejection(p, q, m)) < 1e-12
        assert all(a >= b for a, b in itertools.pairwise(exact))


def _first_token_batch(p: torch.Tensor, q: torch.Tensor, m: int, n: int, g: torch.Generator):
    """n rows of M i.i.d. one-token drafts from q: ([n, M, 2, V], [n, M, 1, V], [n, M, 1])."""
    v = p.shape[0]
    x = torch.multinomial(q.expand(n * m, v), 1, replacement=True, generator=g).reshape(n, m, 1)
    return p.expand(n, m, 2, v), q.expand(n, m, 1, v), x


@pytest.mark.parametrize("example", ["bernoulli", "uniform"])
def test_sampled_rejection_rate_matches_closed_form(example: str) -> None:
    """≥1e5 rows through the batched verifier; 5-sigma binomial bound per M."""
    n, g = 100_000, torch.Generator().manual_seed(11)
    if example == "bernoulli":
        p, q = _bernoulli(0.8, 0.3)
        closed = [bernoulli_rejection(0.8, 0.3, m) for m in (1, 2, 3, 5)]
    else:
        p, q = _uniform(6, 2)
        closed = [uniform_rejection(3.0, m) for m in (1, 2, 3, 5)]
    rates = []
    for m, expected in zip((1, 2, 3, 5), closed):
        result = multidraft_verify(*_first_token_batch(p, q, m, n, g), g)
        rate = float((result.num_accepted == 0).double().mean())
        assert abs(rate - expected) <= 5 * math.sqrt(expected * (1 - expected) / n)
        rates.append(rate)
    assert all(a > b for a, b in itertools.pairwise(rates))


def test_first_emitted_token_follows_target() -> None:
    """X^branch_1 if τ > 0, else Y, is distributed as p (5-sigma per token, 1e5 rows)."""
    n, g = 100_000, torch.Generator().manual_seed(12)
    p, q = torch.tensor([0.5, 0.2, 0.3], dtype=F64), torch.tensor([0.1, 0.6, 0.3], dtype=F64)
    tp, dp, x = _first_token_batch(p, q, 3, n, g)
    result = multidraft_verify(tp, dp, x, g)
    kept = x[torch.arange(n), result.extras["branch"], 0]
    first = torch.where(result.num_accepted > 0, kept, result.next_token)
    freq = torch.bincount(first, minlength=3).double() / n
    assert ((freq - p).abs() <= 5 * (p * (1 - p) / n).sqrt()).all()
    assert (result.extras["branch"] > 0).any()  # later drafts do get kept


# --- the sampler against the exact law ----------------------------------------------------


def _no_update_plan(target_probs: torch.Tensor, draft_probs: torch.Tensor,
                    draft_tokens: torch.Tensor) -> MultiDraftPlan:
    """A deliberately wrong Algorithm 4: every first token is tested against p itself and the
    residual is never updated after a rejected first token (Y ~ [p - q]_+ if all fail)."""
    plan = multidraft_plan(target_probs, draft_probs, draft_tokens)
    if plan.tail is None:
        return plan
    p0, q0 = target_probs[:, 0, 0], draft_probs[:, 0, 0]  # [B, V]
    x1 = draft_tokens[:, :, 0]  # [B, M]
    accept = torch.clamp(p0.gather(1, x1) / q0.gather(1, x1), max=1.0)
    r2 = normalise_or((p0 - q0).clamp_min(0), p0)
    residuals = torch.stack([p0] + [r2] * plan.num_drafts, dim=1)
    return dataclasses.replace(plan, first_accept=accept, residuals=residuals)


def _fixed_instance() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """M = 3 drafts of γ = 2 tokens over V = 4 with first tokens (0, 1, 1): a_1 = 1/4,
    a_2 = r^2(1)/q(1) = 5/9 after the residual update, a_3 = 0 (token 1 already rejected)."""
    g = torch.Generator().manual_seed(21)
    m, gamma, v = 3, 2, 4
    p0 = torch.tensor([0.1, 0.35, 0.25, 0.3], dtype=F64)
    q0 = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=F64)
    tp = _rand_probs((m, gamma + 1, v), g)
    dp = _rand_probs((m, gamma, v), g)
    tp[:, 0], dp[:, 0] = p0, q0
    tokens = torch.tensor([[0, 2], [1, 1], [1, 3]], dtype=torch.int64)  # [M, γ]
    return tp, dp, tokens


def _chi_square(sample_plan: MultiDraftPlan, exact: torch.Tensor, n: int, seed: int) -> float:
    """p-value of the sampler's (branch, τ, Y) counts against ``exact`` [M, γ+1, V]."""
    result = multidraft_draw(sample_plan, torch.Generator().manual_seed(seed))
    _, g1, v = exact.shape
    cell = (result.extras["branch"] * g1 + result.num_accepted) * v + result.next_token
    counts = torch.bincount(cell, minlength=exact.numel()).double()
    expected = exact.reshape(-1) * n
    if (counts[expected == 0] > 0).any():  # an impossible outcome was sampled
        return 0.0
    support = expected > 0
    return float(sps.chisquare(counts[support].numpy(), expected[support].numpy()).pvalue)


def test_sampler_matches_exact_law_chi_square() -> None:
    """Chi-square of 2e5 draws against the exact law; accept at p > 1e-6, and the same test
    must reject (p < 1e-6) the variant that never updates the residual."""
    n = 200_000
    tp, dp, tokens = _fixed_instance()
    batch = (tp.expand(n, *tp.shape), dp.expand(n, *dp.shape), tokens.expand(n, *tokens.shape))
    exact = multidraft_law(multidraft_plan(*(t[:1] for t in batch)))[0]  # [M, γ+1, V]
    assert abs(float(exact.sum()) - 1.0) < 1e-12
    assert abs(float(exact[1].sum()) - 0.75 * 5 / 9) < 1e-12  # branch 1 kept
    assert abs(float(exact[0, 0].sum()) - 0.75 * 4 / 9) < 1e-12  # τ = 0: all rejected
    assert _chi_square(multidraft_plan(*batch), exact, n, seed=5) > 1e-6
    assert _chi_square(_no_update_plan(*batch), exact, n, seed=5) < 1e-6


# --- through the engine -------------------------------------------------------------------


def test_generate_charges_all_drafts(monkeypatch: pytest.MonkeyPatch) -> None:
    """verispec.generate(method='multidraft', num_drafts=3): the target scores the M rows in
    one pass; target_tokens_scored = Σ M·(γ+1); the method sees p and q along each draft."""
    target, draft = MarkovLM.random(4, seed=0), MarkovLM.random(4, seed=1)
    prompt = [0, 1]
    ctx: list[int] = []  # the context the engine should be at, rebuilt from the results
    seen: list[tuple[int, int, int]] = []  # (rows scored, γ, branch) per iteration
    original = MultiDraftMethod.verify

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return bool((a - b).abs().max() < 1e-12)

    def recording(self, batch):  # type: ignore[no-untyped-def]
        assert batch.draft_tokens.shape[:2] == (1, 3)  # one request, M = 3 drafts
        target_probs, probs = batch.target_probs[0], batch.draft_probs[0]  # [M, γ+1, V], [M, γ, V]
        tokens = batch.draft_tokens[0]  # [M, γ]
        g = int(batch.lengths[0])
        assert tokens.shape[1] == g
        for j in range(3):  # row j holds p and q along draft j's own tokens
            along = ctx + tokens[j].tolist()
            assert all(close(target_probs[j, i], target.next_probs(along[: len(ctx) + i]))
                       for i in range(g + 1))
            assert all(close(probs[j, i], draft.next_probs(along[: len(ctx) + i]))
                       for i in range(g))
        result = original(self, batch)
        branch, tau = int(result.extras["branch"][0]), int(result.num_accepted[0])
        ctx.extend(tokens[branch, :tau].tolist() + [int(result.next_token[0])])
        seen.append((3 if g > 0 else 1, g, branch))  # γ = 0: nothing drafted, one row scored
        return result

    monkeypatch.setattr(MultiDraftMethod, "verify", recording)
    branches = set()
    for seed in range(4):
        ctx[:], seen[:] = prompt, []
        out = verispec.generate(target, draft, prompt, method="multidraft", gamma=3,
                                num_drafts=3, max_new_tokens=24, seed=seed)
        s = out.stats
        assert len(seen) == s.iterations == s.target_calls and out.tokens == ctx[2:]
        assert all(rows == 3 for rows, g, _ in seen if g > 0)
        assert s.target_tokens_scored == sum(rows * (g + 1) for rows, g, _ in seen)
        drafting = sum(g > 0 for _, g, _ in seen)  # iterations that drafted (M rows)
        single = s.iterations - drafting  # γ cut to 0 at the budget: one row, one token
        assert s.target_tokens_scored == 3 * (s.drafted_total + drafting) + single
        assert s.lossless and s.method == "multidraft"
        branches |= {b for _, _, b in seen}
    assert branches - {0}  # the engine kept a later draft at least once




@pytest.mark.usefixtures("one_thread")
def test_generate_output_law_two_tokens() -> None:
    """End-to-end: 1500 runs of 2 tokens over V = 2; chi-square against target_law, p > 1e-6."""
    target = RandomContextLM(2, seed=3)
    draft = ContextIndependentLM([0.8, 0.2])
    law = target_law(target, [0], Sampling(), 2)
    counts = {k: 0 for k in law}
    n = 1500
    for seed in range(n):
        out = verispec.generate(target, draft, [0], method="multidraft", gamma=1,
                                num_drafts=2, max_new_tokens=2, seed=seed)
        counts[tuple(out.tokens)] += 1
    keys = sorted(law)
    pvalue = sps.chisquare([counts[k] for k in keys], [law[k] * n for k in keys]).pvalue
    assert pvalue > 1e-6


# --- parameters ---------------------------------------------------------------------------


def test_registry_entry() -> None:
    info = METHODS["multidraft"]
    assert info.lossless and info.uses_draft
    assert info.options() == {"num_drafts": 2} and info.batchable and info.law is not None
    assert build_method("multidraft[num_drafts=4]").num_drafts == 4
    assert MultiDraftMethod(3).matches_at_greedy  # at T = 0 the M drafts coincide
    method = build_method("multidraft")
    assert isinstance(method, MultiDraftMethod) and method.num_drafts == 2 and method.lossless
    assert build_method("multidraft", num_drafts=5).num_drafts == 5
    assert "Algorithm 4" in (MultiDraftMethod.__doc__ or "")
    assert "ossless" in (MultiDraftMethod.__doc__ or "")


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, None])
def test_invalid_num_drafts(bad: object) -> None:
    with pytest.raises(ValueError, match="num_drafts"):
        MultiDraftMethod(bad)  # type: ignore[arg-type]


def test_invalid_parameters_elsewhere() -> None:
    target, draft = MarkovLM.random(3, seed=0), MarkovLM.random(3, seed=1)
    with pytest.raises(ValueError, match="num_drafts"):
        verispec.generate(target, draft, [0], method="multidraft", num_drafts=0)
    with pytest.raises(ValueError, match="num_drafts"):
        verispec.generate(target, draft, [0], method="multidraft[num_drafts=0]")
    with pytest.raises(TypeError):
        build_method("multidraft", num_beams=2)
    with pytest.raises(ValueError, match="M must be >= 1"):
        multidraft_plan(torch.zeros((2, 0, 3, 4), dtype=F64), torch.zeros((2, 0, 2, 4), dtype=F64),
                        torch.zeros((2, 0, 2), dtype=torch.int64))
    with pytest.raises(ValueError, match="expected target_probs"):
        multidraft_plan(torch.zeros((3, 3, 4), dtype=F64), torch.zeros((3, 2, 4), dtype=F64),
                        torch.zeros((3, 2), dtype=torch.int64))
    with pytest.raises(ValueError):
        multidraft_plan(torch.zeros((2, 3, 3, 4), dtype=F64), torch.zeros((2, 2, 2, 4), dtype=F64),
                        torch.zeros((2, 3, 2), dtype=torch.int64))
    tp, dp, tokens = _fixed_instance()  # 3 drafts
    with pytest.raises(ValueError, match="expected 2 drafts, got 3"):
        MultiDraftMethod(2).verify(VerifyBatch(
            tp[None], dp[None], tokens[None], torch.tensor([2]), None, None,
            [Randomness(torch.Generator())], [None]))
    p, q = _bernoulli(0.8, 0.3)
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="M must be"):
            single_token_rejection(p, q, bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="num_drafts must be"):
            multidraft_speculative_law(target, draft, [0], num_drafts=bad,  # type: ignore[arg-type]
                                       gamma=1, sampling=Sampling(), length=2)
    with pytest.raises(ValueError, match="v <= u"):
        bernoulli_batch_improvement(0.3, 0.8, 2)
    with pytest.raises(ValueError, match="r = V / V'"):
        uniform_batch_improvement(0.5, 2)
