"""Lossy verification (Section 4, Theorems 4–5, Appendix G of *A Theoretical Perspective for
Speculative Decoding Algorithm*, Yin et al., NeurIPS 2024): exact single-step laws, the Pareto line,
the reported bias, a chi-square check of the batched sampler, parameter errors and the
engine end to end. p = target, q = draft."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.optimize import linprog
from scipy.stats import chisquare

import verispec
from verispec.methods import METHODS, build_method
from verispec.methods.lossy import LossyMethod
from verispec.theory.pareto import (
    in_optimal_set,
    lossy_acceptance,
    optimal_bias,
    pareto_line,
    step_law,
    theorem4_a,
    tv,
)
from verispec.verify import plan_law, token_plan
from verispec.verify.lossy import lossy_plan, lossy_verify

EPSILONS = (0.0, 0.01, 0.05, 0.1, 0.3, 1.0)
F64 = torch.float64
Tensor = torch.Tensor


def _dirichlet(shape: tuple[int, ...], gen: torch.Generator, alpha: float = 1.0) -> Tensor:
    """Random distributions on the last axis: Dirichlet(1) for alpha = 1, more peaked below."""
    g = (-torch.log(torch.rand(shape, generator=gen, dtype=F64))) ** (1 / alpha)
    return g / g.sum(-1, keepdim=True)



def _pairs(v: int, seed: int, n: int = 40) -> tuple[Tensor, Tensor]:
    """n random (p, q) pairs of size v: dense, peaked, plus a few one-hot / sparse rows."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.cat([_dirichlet((n // 2, v), gen), _dirichlet((n // 2, v), gen, alpha=0.3)])
    q = torch.cat([_dirichlet((n // 2, v), gen), _dirichlet((n // 2, v), gen, alpha=0.3)])
    p[0] = 0.0
    p[0, 0] = 1.0  # one-hot target
    q[1] = 0.0
    q[1, v - 1] = 1.0  # one-hot (greedy) draft
    q[2] = p[2]  # p = q
    return p, q


def _sample(probs: Tensor, gen: torch.Generator) -> Tensor:
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def _block(b: int, gamma: int, v: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p = _dirichlet((b, gamma + 1, v), gen, alpha=0.5)
    q = _dirichlet((b, gamma, v), gen, alpha=0.5)
    q[0] = p[0, :gamma]  # a row with p = q (no rejection possible with ε = 0)
    x = _sample(q.reshape(-1, v), gen).reshape(b, gamma)
    return p, q, x


# ----------------------------------------------------------------------------- ε = 0


@pytest.mark.parametrize("v", [2, 7, 50])
def test_eps0_opt_plan_is_token_plan_bit_for_bit(v: int) -> None:
    p, q, x = _block(64, 4, v, seed=v)
    ref = token_plan(p, q, x)
    for eps in (0.0, 0):
        plan = lossy_plan(p, q, x, epsilon=eps, residual="opt")
        assert plan.rule == ref.rule == "first_reject"
        assert torch.equal(plan.accept_probs, ref.accept_probs)
        assert torch.equal(plan.residuals, ref.residuals)


def test_eps0_target_residual_is_biased() -> None:
    p, q = _pairs(6, seed=3)
    out, p_rej = step_law(p, q, 0.0, "target")
    # step law = min{p, q} + TV(p, q) · p, which differs from p whenever p ≠ q.
    expected = torch.minimum(p, q) + tv(p, q)[:, None] * p
    assert torch.allclose(out, expected, atol=1e-12, rtol=0)
    assert torch.allclose(p_rej, tv(p, q), atol=1e-12, rtol=0)
    # Biased for every dense row with p ≠ q (rows 3..; row 2 has p = q) ...
    assert (tv(p, q)[3:] > 1e-3).all() and (tv(out, p)[3:] > 1e-6).all()
    assert float(tv(out, p)[2]) < 1e-12
    # ... but a one-hot p (row 0) lies in Theorem 4's optimal set: min{p, q} + TV·p = p.
    assert float(tv(out, p)[0]) < 1e-12 and float(tv(p, q)[0]) > 0.1


# ------------------------------------------------------------- Theorems 4 and 5 on a grid


def _lp_optimum(p: Tensor, q: Tensor, b: Tensor) -> float:
    """min over distributions P of TV(b q + P(reject) P, p), by linear programming."""
    v = p.numel()
    kept, d = (b * q).numpy(), float(((1 - b) * q).sum())
    pn = p.numpy()
    # variables [P (v), t (v)]: minimise ½ Σ t, t ≥ ±(kept + d P − p), Σ P = 1, P ≥ 0.
    c = [0.0] * v + [0.5] * v
    eye = torch.eye(v, dtype=F64).numpy()
    a_ub = torch.cat([torch.cat([torch.tensor(d * eye), -torch.eye(v, dtype=F64)], 1),
                      torch.cat([torch.tensor(-d * eye), -torch.eye(v, dtype=F64)], 1)]).numpy()
    b_ub = list(pn - kept) + list(kept - pn)
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=[[1.0] * v + [0.0] * v], b_eq=[1.0],
                  bounds=[(0, None)] * (2 * v), method="highs")
    assert res.status == 0
    return float(res.fun)


@pytest.mark.parametrize("v", [2, 5, 17, 64])
def test_theorems_4_and_5_grid(v: int) -> None:
    p, q = _pairs(v, seed=100 + v)
    tv_pq = tv(p, q)
    for eps in EPSILONS:
        b = torch.clamp((p + eps) / q, max=1.0).nan_to_num(1.0)  # independent b (q = 0 -> 1)
        assert torch.allclose(lossy_acceptance(p, q, eps), b, atol=1e-15, rtol=0)
        p_rej_ref = ((1 - b) * q).sum(-1)
        theorem4 = 0.5 * (p - b * q).abs().sum(-1) - 0.5 * p_rej_ref
        assert torch.allclose(optimal_bias(p, q, b), theorem4, atol=1e-12, rtol=0)
        out, p_rej = step_law(p, q, eps, "opt")
        assert torch.allclose(out.sum(-1), torch.ones_like(p_rej), atol=1e-12, rtol=0)
        assert torch.allclose(p_rej, p_rej_ref, atol=1e-12, rtol=0)
        bias = tv(out, p)
        assert torch.allclose(bias, theorem4, atol=1e-12, rtol=0)  # Theorem 4's optimum
        assert torch.allclose(p_rej + bias, tv_pq, atol=1e-12, rtol=0)  # Theorem 5
        assert torch.allclose(pareto_line(p, q, p_rej), bias, atol=1e-12, rtol=0)
        # The residual as the verifier uses it: a one-position draft, X = argmax q.
        x = q.argmax(-1, keepdim=True)
        plan = lossy_plan(torch.stack([p, p], 1), q[:, None], x, epsilon=eps, residual="opt")
        resid = plan.residuals[:, 0]
        assert torch.isfinite(plan.residuals).all()
        can_reject = p_rej_ref > 1e-12
        a = theorem4_a(p, q, b)[can_reject]
        # P* lies in Theorem 4's optimal set and equals [A]₊ normalised ...
        assert in_optimal_set(resid[can_reject], a).all()
        a_plus = a.clamp_min(0)
        assert torch.allclose(resid[can_reject], a_plus / a_plus.sum(-1, keepdim=True),
                              atol=1e-12, rtol=0)
        # ... which is token verification's residual [p − q]₊ / TV(p, q), whatever ε is.
        pq = (p - q).clamp_min(0)[can_reject]
        assert torch.allclose(resid[can_reject], pq / pq.sum(-1, keepdim=True), atol=1e-12, rtol=0)
        # An independent LP solves Theorem 4's problem for a few rows: same optimum.
        for r in range(3, 7):
            assert abs(_lp_optimum(p[r], q[r], b[r]) - float(bias[r])) < 1e-9


@pytest.mark.parametrize("v", [3, 10, 40])
def test_target_residual_strictly_above_the_line(v: int) -> None:
    gen = torch.Generator().manual_seed(7 * v)
    p, q = _dirichlet((200, v), gen, alpha=0.5), _dirichlet((200, v), gen, alpha=0.5)
    for eps in EPSILONS:
        out_t, p_rej_t = step_law(p, q, eps, "target")
        out_o, p_rej_o = step_law(p, q, eps, "opt")
        assert torch.equal(p_rej_t, p_rej_o)  # same b, same rejection probability
        gap = tv(out_t, p) - pareto_line(p, q, p_rej_t)
        can_reject = p_rej_t > 0
        assert bool(can_reject.any()) == (eps < 1)
        if eps > 0:
            # p has full support, so p puts mass where A < 0 whenever rejection is possible:
            # the target residual is outside Theorem 4's optimal set, strictly above the line.
            assert (gap[can_reject] > 1e-7).all(), float(gap[can_reject].min())
        # Without rejection (ε ≥ max(q − p), e.g. ε = 1) both emit q: on the line.
        assert torch.allclose(gap[~can_reject], torch.zeros((), dtype=F64), atol=1e-12, rtol=0)
        assert torch.allclose(out_t[~can_reject], out_o[~can_reject], atol=0, rtol=0)
        assert torch.allclose(out_o[~can_reject], q[~can_reject], atol=1e-15, rtol=0)
    assert (tv(p, q) > 1e-3).all()


# ------------------------------------------------------------------------ reported bias


@pytest.mark.parametrize("residual", ["opt", "target"])
@pytest.mark.parametrize("eps", [0.0, 0.05, 0.3])
def test_bias_tv_equals_exact_tv_of_plan_law_one_position(residual: str, eps: float) -> None:
    v = 9
    gen = torch.Generator().manual_seed(11)
    p = _dirichlet((1, 2, v), gen, alpha=0.5).expand(v, 2, v)  # same context on every row
    q = _dirichlet((1, 1, v), gen, alpha=0.5).expand(v, 1, v)
    x = torch.arange(v)[:, None]  # row x drafts token x
    law = plan_law(lossy_plan(p, q, x, epsilon=eps, residual=residual))  # [V, 2, V]
    # Law of the first emitted token: X = x accepted (τ = 1), else the recovered Y.
    first = (q[:, 0, :].diagonal()[:, None] * law[:, 0, :]).sum(0)  # Σ_x q(x) P(τ=0, Y=·|x)
    first = first + q[0, 0] * law[:, 1, :].sum(-1)  # + q(x) P(τ = 1 | x) at token x
    assert abs(float(first.sum()) - 1) < 1e-12
    exact = 0.5 * float((first - p[0, 0]).abs().sum())
    res = lossy_verify(p, q, x, torch.Generator().manual_seed(0), epsilon=eps, residual=residual)
    assert res.bias_tv is not None and res.bias_tv.shape == (v,)
    assert torch.allclose(res.bias_tv, torch.full((v,), exact, dtype=F64), atol=1e-12, rtol=0)
    assert (exact > 1e-3) == (eps > 0 or residual == "target")


def test_bias_tv_sums_over_verified_positions() -> None:
    p, q, x = _block(500, 3, 6, seed=5)
    res = lossy_verify(p, q, x, torch.Generator().manual_seed(1), epsilon=0.2, residual="target")
    per_pos = tv(step_law(p[:, :-1], q, 0.2, "target")[0], p[:, :-1])  # [B, γ]
    tau = res.num_accepted
    for b in range(0, 500, 37):
        upto = min(int(tau[b]) + 1, 3)  # 1..τ+1 if τ < γ, 1..γ if τ = γ (bonus exact)
        assert abs(float(res.bias_tv[b]) - float(per_pos[b, :upto].sum())) < 1e-12
    assert set(tau.tolist()) == {0, 1, 2, 3}
    empty = lossy_verify(p[:, :1], q[:, :0], x[:, :0], torch.Generator(), epsilon=0.2,
                         residual="opt")
    assert torch.equal(empty.bias_tv, torch.zeros(500, dtype=F64))


# ------------------------------------------------------------------ statistical check


@pytest.mark.parametrize("residual", ["opt", "target"])
def test_batched_sampler_matches_step_law_chi_square(residual: str) -> None:
    """2·10⁵ rows, V = 10, one position; H0 accepted at the 10⁻³ level (fixed seed), and the
    negative controls (p itself, the other residual's law) rejected at 10⁻¹⁰."""
    n, v, eps = 200_000, 10, 0.1
    gen = torch.Generator().manual_seed(2024)
    p = _dirichlet((2, v), gen, alpha=0.7)
    q = _dirichlet((v,), gen, alpha=0.7)
    x = _sample(q.expand(n, v), gen)[:, None]  # [n, 1] drafts from q
    res = lossy_verify(p.expand(n, 2, v), q.expand(n, 1, v), x, gen, epsilon=eps,
                       residual=residual)
    first = torch.where(res.num_accepted == 1, x[:, 0], res.next_token)  # first emitted token
    counts = torch.bincount(first, minlength=v).numpy()
    out, _ = step_law(p[0], q, eps, residual)
    other, _ = step_law(p[0], q, eps, "target" if residual == "opt" else "opt")
    assert float(tv(out, p[0])) > 0.02 and float(tv(out, other)) > 0.005
    assert chisquare(counts, (out * n).numpy()).pvalue > 1e-3
    assert chisquare(counts, (p[0] * n).numpy()).pvalue < 1e-10  # negative control: p
    assert chisquare(counts, (other * n).numpy()).pvalue < 1e-10  # and the other residual


# -------------------------------------------------------------------------- parameters


@pytest.mark.parametrize("eps", [-0.1, -1e-300, math.nan, math.inf, "0.1", True, None])
def test_invalid_epsilon(eps: object) -> None:
    p, q, x = _block(2, 2, 4, seed=0)
    with pytest.raises(ValueError, match="epsilon"):
        lossy_plan(p, q, x, epsilon=eps, residual="opt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epsilon"):
        lossy_verify(p, q, x, torch.Generator(), epsilon=eps, residual="opt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epsilon"):
        step_law(p[:, 0], q[:, 0], eps, "opt")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epsilon"):
        LossyMethod(epsilon=eps)  # type: ignore[arg-type]


def test_invalid_residual_and_options() -> None:
    p, q, x = _block(2, 2, 4, seed=0)
    with pytest.raises(ValueError, match="residual"):
        lossy_plan(p, q, x, epsilon=0.1, residual="draft")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="residual"):
        build_method("lossy", residual="P*")
    with pytest.raises(ValueError, match="epsilon"):
        build_method("lossy", epsilon=-0.5)
    with pytest.raises(TypeError):
        build_method("lossy", num_drafts=2)
    with pytest.raises(ValueError, match="epsilon"):
        verispec.generate("toy:random:4:1", "toy:random:4:2", "AB", method="lossy",
                          epsilon=-0.2, gamma=3, max_new_tokens=5)
    with pytest.raises(ValueError, match="epsilon"):
        verispec.generate("toy:random:4:1", "toy:random:4:2", "AB",
                          method="lossy[epsilon=-0.2]", gamma=3, max_new_tokens=5)
    with pytest.raises(ValueError, match="residual"):
        build_method("lossy[residual=draft]")
    with pytest.raises(ValueError, match="verifier"):  # only PEARL takes a window verifier
        verispec.generate("toy:random:4:1", "toy:random:4:2", "AB", method="lossy",
                          verifier="token", gamma=3, max_new_tokens=5)


# ----------------------------------------------------------------------- method, engine


def test_registry_entry_and_docstrings() -> None:
    info = METHODS["lossy"]
    assert info.lossless is False and "NOT lossless" in info.summary
    assert info.options() == {"epsilon": 0.1, "residual": "opt"}
    assert info.batchable and info.law is not None and info.runner is None
    assert "opt" in info.summary and "target" in info.summary and "\n" not in info.summary
    for doc in (LossyMethod.__doc__, lossy_verify.__doc__, lossy_plan.__doc__):
        assert doc is not None and "lossless" in doc
    assert "Appendix G" in (LossyMethod.__doc__ or "")
    m = build_method("lossy")
    assert isinstance(m, LossyMethod) and (m.epsilon, m.residual, m.lossless) == (0.1, "opt", False)
    assert build_method("lossy", epsilon=0).lossless is True
    assert build_method("lossy", epsilon=0, residual="target").lossless is False
    bracketed = build_method("lossy[epsilon=0.05,residual=target]")
    assert (bracketed.epsilon, bracketed.residual, bracketed.lossless) == (0.05, "target", False)  # type: ignore[attr-defined]


def test_engine_end_to_end() -> None:
    kw: dict[str, int] = {"gamma": 3, "max_new_tokens": 20}
    lossy = verispec.generate("toy:random:4:1", "toy:random:4:2", "AB", method="lossy",
                              epsilon=0.2, **kw)
    assert len(lossy.tokens) == 20 and not lossy.stats.lossless
    assert lossy.stats.bias_tv_sum > 0.05
    assert "Σ TV" in lossy.stats.summary()
    uno = verispec.generate("toy:random:4:1", "toy:random:4:2", "AB", method="lossy",
                            epsilon=0.2, residual="target", **kw)
    assert uno.stats.bias_tv_sum > 0.05
    bracketed = verispec.generate("toy:random:4:1", "toy:random:4:2", "AB",
                                  method="lossy[epsilon=0.2,residual=target]", **kw)
    assert bracketed.tokens == uno.tokens and bracketed.stats.bias_tv_sum == uno.stats.bias_tv_sum
    for seed in range(4):
        a = verispec.generate("toy:random:4:1", "toy:random:4:2", "AB", method="lossy",
                              epsilon=0.0, seed=seed, **kw)
        t = verispec.generate("toy:random:4:1", "toy:random:4:2", "AB", method="token",
                              seed=seed, **kw)
        assert a.tokens == t.tokens and a.stats.tau_histogram == t.stats.tau_histogram
        assert a.stats.lossless and abs(a.stats.bias_tv_sum) < 1e-12
