"""Token and block verification: the paper's worked example, a scalar reference
implementation of Algorithms 1 and 2, and the temperature-0 reduction to exact matching.

Independent expectations used here:

* Section 2 of *Block Verification Accelerates Speculative Decoding* (Sun et al., ICLR 2025)
  (Mb(A) = 1/3, Ms(A) = 2/3, γ = 2): E[τ] is 10/9 for
  token verification and 11/9 for block verification, with the per-draft behaviour the
  paper spells out (AA accepted with probability 1/4, else corrected to B; BA always keeps
  B and accepts A with probability 1/2; AB and BB always accepted); the full-information
  ideal is 12/9.
* A line-by-line scalar transcription of Algorithms 1 and 2 with equations (3)-(5), whose
  exact law is computed by enumerating the 2^γ accept/reject outcomes of the uniforms η_i.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from verispec.models.toy import ContextIndependentLM
from verispec.sampling import Sampling
from verispec.theory import expected_accepted
from verispec.verify import block_plan, block_verify, plan_law, token_plan, token_verify

A, B = 0, 1
MB = [1 / 3, 2 / 3]  # target p
MS = [2 / 3, 1 / 3]  # draft q
TOL = 1e-12


# --------------------------------------------------------------------------------------
# Scalar reference: Algorithms 1 and 2 of Block Verification Accelerates Speculative Decoding
# (Sun et al.), one row, python floats.
# --------------------------------------------------------------------------------------

def _residual(weights: list[float]) -> list[float]:
    total = sum(weights)
    assert total > 0, "reference residual with zero mass on a reachable path"
    return [w / total for w in weights]


def reference_law(p: list[list[float]], q: list[list[float]], x: list[int], rule: str
                  ) -> dict[tuple[int, int], float]:
    """Exact law {(τ, Y): prob} of Algorithm 1 (``token``) or 2 (``block``) for one draft.

    p: γ+1 rows of V probabilities (Mb(·|c, X^i)); q: γ rows (Ms(·|c, X^i)); x: the draft.
    """
    gamma, vocab = len(x), len(p[0])
    h: list[float] = []
    residuals: list[list[float]] = []
    p_i = 1.0  # Algorithm 2's p_0
    for i in range(gamma):
        ratio = p[i][x[i]] / q[i][x[i]]
        if rule == "token":
            h.append(min(1.0, ratio))  # line 4 of Algorithm 1
            weights = [max(p[i][v] - q[i][v], 0.0) for v in range(vocab)]  # equation (3)
        else:
            weights = [max(p_i * p[i][v] - q[i][v], 0.0) for v in range(vocab)]  # eq. (4)
            if i > 0:  # h^block_i for 0 < i < γ, equation (5) (h_0 is never used)
                s = sum(weights)
                assert s + 1 - p_i > 0
                h.append(s / (s + 1 - p_i))
            p_i = min(p_i * ratio, 1.0)  # line 4 of Algorithm 2
        residuals.append(weights)
    if rule == "block":
        h.append(p_i)  # h^block_γ = p_γ
    law: dict[tuple[int, int], float] = {}
    for coins in itertools.product([True, False], repeat=gamma):  # η_i <= h_i ?
        prob = math.prod(h[i] if c else 1 - h[i] for i, c in enumerate(coins))
        if prob == 0:
            continue
        tau = 0
        for i, accepted in enumerate(coins, start=1):
            if accepted:
                tau = i
            elif rule == "token":
                break  # Algorithm 1 stops at the first rejection; Algorithm 2 continues
        y_dist = p[gamma] if tau == gamma else _residual(residuals[tau])
        for y, py in enumerate(y_dist):
            if py > 0:
                law[(tau, y)] = law.get((tau, y), 0.0) + prob * py
    return law


def _random_rows(seed: int, batch: int, gamma: int, vocab: int, zeros: bool
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random p [B, γ+1, V], q [B, γ, V] (optionally with zero entries) and X ~ q."""
    g = torch.Generator().manual_seed(seed)
    p = torch.rand((batch, gamma + 1, vocab), generator=g, dtype=torch.float64) ** 3
    q = torch.rand((batch, gamma, vocab), generator=g, dtype=torch.float64) ** 3
    if zeros:  # top-k style supports: knock out some entries, never a whole row
        p = p * (torch.rand(p.shape, generator=g) > 0.3)
        q = q * (torch.rand(q.shape, generator=g) > 0.3)
        p[..., 0] += 0.05
        q[..., 1] += 0.05
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    x = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, gamma)
    return p, q, x


def _law_dict(law: torch.Tensor) -> dict[tuple[int, int], float]:
    return {(t, y): float(law[t, y]) for t, y in (law > 0).nonzero().tolist()}


def _assert_same_law(got: dict[tuple[int, int], float], want: dict[tuple[int, int], float]
                     ) -> None:
    for key in set(got) | set(want):
        assert abs(got.get(key, 0.0) - want.get(key, 0.0)) < TOL, (key, got, want)


# --------------------------------------------------------------------------------------
# The paper's example.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, plan_fn, expected, tau_law", [
    # τ law from the paper's description: token P(τ=0) = 1/3, P(τ=1) = 2/3·1/3, P(τ=2) = 4/9.
    ("token", token_plan, Fraction(10, 9), [Fraction(1, 3), Fraction(2, 9), Fraction(4, 9)]),
    # block: P(τ=2) = Ms(AB)+Ms(BB)+Ms(BA)/2+Ms(AA)/4 = 5/9, P(τ=1) = Ms(BA)/2 = 1/9.
    ("block", block_plan, Fraction(11, 9), [Fraction(1, 3), Fraction(1, 9), Fraction(5, 9)]),
])
def test_paper_example_exact(name: str, plan_fn, expected: Fraction, tau_law: list) -> None:
    mean, law = expected_accepted(ContextIndependentLM(MB), ContextIndependentLM(MS), [A],
                                  plan_fn=plan_fn, gamma=2, sampling=Sampling())
    assert abs(mean - float(expected)) < TOL, (name, mean)
    assert torch.allclose(law, torch.tensor([float(f) for f in tau_law], dtype=torch.float64),
                          atol=TOL, rtol=0)
    # Token verification's closed form: Σ_{i=1}^{γ} (1 - d_TV)^i with d_TV = 1/3.
    if name == "token":
        assert abs(mean - sum((1 - 1 / 3) ** i for i in (1, 2))) < TOL
    # Below the full-information ideal of 12/9 (Σ_ℓ Σ_{x^ℓ} min(Ms(x^ℓ), Mb(x^ℓ))).
    ideal = sum(min(math.prod(MS[t] for t in xs), math.prod(MB[t] for t in xs))
                for n in (1, 2) for xs in itertools.product([A, B], repeat=n))
    assert abs(ideal - 12 / 9) < TOL and mean < ideal - 0.1


def _paper_plan_law(fn, x1: int, x2: int) -> dict[tuple[int, int], float]:
    p = torch.tensor([[MB] * 3], dtype=torch.float64)
    q = torch.tensor([[MS] * 2], dtype=torch.float64)
    return _law_dict(plan_law(fn(p, q, torch.tensor([[x1, x2]])))[0])


def test_paper_example_block_per_draft_behaviour() -> None:
    bonus = {(2, A): 1 / 3, (2, B): 2 / 3}  # τ = γ: Y ~ Mb
    # AB and BB: always accepted.
    _assert_same_law(_paper_plan_law(block_plan, A, B), bonus)
    _assert_same_law(_paper_plan_law(block_plan, B, B), bonus)
    # AA: accepted with probability 1/4, else both rejected and the first token corrected to B.
    _assert_same_law(_paper_plan_law(block_plan, A, A),
                     {(2, A): 1 / 12, (2, B): 2 / 12, (0, B): 3 / 4})
    # BA: always keeps B; accepts A with probability 1/2, else corrects the second token to B.
    _assert_same_law(_paper_plan_law(block_plan, B, A),
                     {(2, A): 1 / 6, (2, B): 2 / 6, (1, B): 1 / 2})
    # Token verification on AA: A accepted w.p. 1/2 at each step, the residual is always B.
    _assert_same_law(_paper_plan_law(token_plan, A, A),
                     {(0, B): 1 / 2, (1, B): 1 / 4, (2, A): 1 / 12, (2, B): 2 / 12})


@pytest.mark.parametrize("name, verify, expected", [
    ("token", token_verify, 10 / 9), ("block", block_verify, 11 / 9)])
def test_paper_example_sampled_through_batched_verifier(name: str, verify, expected: float
                                                        ) -> None:
    """N = 200,000 rows drawn from the draft; the mean τ lies within 5 standard errors."""
    n = 200_000
    g = torch.Generator().manual_seed(1234)
    q_row = torch.tensor(MS, dtype=torch.float64)
    x = torch.multinomial(q_row, 2 * n, replacement=True, generator=g).reshape(n, 2)  # X ~ Ms
    p = torch.tensor(MB, dtype=torch.float64).expand(n, 3, 2)
    q = q_row.expand(n, 2, 2)
    result = verify(p, q, x, g)
    tau = result.num_accepted.to(torch.float64)
    assert result.num_accepted.shape == (n,) and result.next_token.shape == (n,)
    se = float(tau.std()) / math.sqrt(n)
    assert abs(float(tau.mean()) - expected) < 5 * se, (name, float(tau.mean()), expected, se)
    # The two means are 1/9 apart, ~35 standard errors: the test separates the verifiers.
    other = 11 / 9 if name == "token" else 10 / 9
    assert abs(float(tau.mean()) - other) > 5 * se


# --------------------------------------------------------------------------------------
# The plans against the scalar reference of Algorithms 1 and 2.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("gamma", [1, 2, 3, 4])
@pytest.mark.parametrize("zeros", [False, True])
def test_plans_match_reference_algorithms(gamma: int, zeros: bool) -> None:
    p, q, x = _random_rows(seed=100 + gamma + 10 * zeros, batch=12, gamma=gamma, vocab=4,
                           zeros=zeros)
    for rule, fn in (("token", token_plan), ("block", block_plan)):
        laws = plan_law(fn(p, q, x))  # [B, γ+1, V], the whole batch at once
        assert laws.shape == (12, gamma + 1, 4)
        for b in range(12):
            want = reference_law(p[b].tolist(), q[b].tolist(), x[b].tolist(), rule)
            _assert_same_law(_law_dict(laws[b]), want)
            assert abs(float(laws[b].sum()) - 1) < TOL


def test_block_equals_token_for_gamma_one() -> None:
    p, q, x = _random_rows(seed=7, batch=50, gamma=1, vocab=5, zeros=True)
    a, b = plan_law(token_plan(p, q, x)), plan_law(block_plan(p, q, x))
    assert torch.allclose(a, b, atol=TOL, rtol=0)


def test_token_residual_never_repeats_the_rejected_token() -> None:
    """After a rejection at position τ+1, Y ~ [p - q]_+ has no mass on X_{τ+1} (q > p there)."""
    p, q, x = _random_rows(seed=8, batch=20_000, gamma=3, vocab=6, zeros=False)
    res = token_verify(p, q, x, torch.Generator().manual_seed(0))
    rejected = res.num_accepted < 3
    assert bool(rejected.any()) and bool((~rejected).any())
    at = x.gather(1, res.num_accepted.clamp(max=2)[:, None]).squeeze(1)  # X_{τ+1}
    assert not bool((res.next_token[rejected] == at[rejected]).any())


# --------------------------------------------------------------------------------------
# Temperature 0: exact matching.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("verify", [token_verify, block_verify], ids=["token", "block"])
def test_temperature_zero_is_exact_matching(verify) -> None:
    """τ = longest prefix of the draft matching the target's argmax chain, Y = the argmax."""
    batch, gamma, vocab = 4000, 4, 5
    g = torch.Generator().manual_seed(5)
    greedy = Sampling(temperature=0)
    p = greedy.probs(torch.randn((batch, gamma + 1, vocab), generator=g, dtype=torch.float64))
    argmax = p.argmax(-1)  # [B, γ+1], the target's argmax along the draft path
    match = torch.randint(0, gamma + 1, (batch,), generator=g)  # intended prefix length L
    shift = torch.randint(1, vocab, (batch, gamma), generator=g)
    wrong = (argmax[:, :gamma] + shift) % vocab  # a token different from the argmax
    later = torch.randint(0, vocab, (batch, gamma), generator=g)  # anything after a mismatch
    pos = torch.arange(gamma).expand(batch, gamma)
    x = torch.where(pos < match[:, None], argmax[:, :gamma],
                    torch.where(pos == match[:, None], wrong, later))
    q = torch.zeros((batch, gamma, vocab), dtype=torch.float64).scatter_(-1, x[..., None], 1.0)
    # Independent expectation: walk each row.
    expected_tau = []
    for row_x, row_a in zip(x.tolist(), argmax.tolist(), strict=True):
        t = 0
        while t < gamma and row_x[t] == row_a[t]:
            t += 1
        expected_tau.append(t)
    expected_tau_t = torch.tensor(expected_tau)
    assert torch.equal(expected_tau_t, match)  # the construction does what it says
    for seed in (0, 1):
        res = verify(p, q, x, torch.Generator().manual_seed(seed))
        assert torch.equal(res.num_accepted, expected_tau_t)
        assert torch.equal(res.next_token, argmax.gather(1, expected_tau_t[:, None]).squeeze(1))


@pytest.mark.parametrize("plan_fn", [token_plan, block_plan])
@pytest.mark.parametrize("ragged", [False, True])
def test_a_draw_builds_only_the_residual_it_samples_from(plan_fn, ragged: bool) -> None:
    """Drawing (τ, Y) builds each row's residual at its τ only, never all γ + 1 of them;
    the draws equal those from the same plan with every residual built first (the exact
    law's input)."""
    from verispec.sampling import Randomness
    from verispec.verify import VerifyPlan, draw_rows

    p, q, x = _random_rows(5, 4, 3, 7, zeros=True)
    lengths = torch.tensor([3, 0, 2, 1]) if ragged else None
    lazy = plan_fn(p, q, x, lengths=lengths)
    built = plan_fn(p, q, x, lengths=lengths)
    full = VerifyPlan(built.accept_probs, built.residuals, built.rule, built.lengths)
    for seed in range(20):
        got = [draw_rows(plan, [Randomness(torch.Generator().manual_seed(seed * 10 + b))
                                for b in range(4)]) for plan in (lazy, full)]
        assert torch.equal(got[0].num_accepted, got[1].num_accepted)
        assert torch.equal(got[0].next_token, got[1].next_token)
    assert lazy._residuals is None  # never built by the draws
    rows = torch.arange(4)
    for i in range(4):  # each residual read lazily equals the built one
        tau = torch.full((4,), i).clamp(max=3 if lengths is None else lengths)
        assert torch.equal(lazy.residual(tau), built.residuals[rows, tau])
