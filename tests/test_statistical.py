"""Statistical tests through the real batched verifiers and the real engine.

Confidence bound: every chi-square test uses a fixed seed and the threshold
``P_PASS = 1e-3`` (a correct sampler fails with probability 0.1% for a random seed); the
negative controls must be rejected at ``P_FAIL = 1e-9``. Cells with an expected count below
5 are pooled into one cell.

1. One verification step, V = 10, γ = 3, fixed random context-dependent p and q given as
   tables: N = 200,000 drafts X ~ q go through ``token_verify`` / ``block_verify`` as one
   batch. The emitted prefix (X^τ, Y), completed by target samples Z (Lemma 2), must follow
   p on its first three tokens (1000 cells); (τ, Y) must follow the exact law averaged over
   the drafts. Negative controls: always accept; token verification with the residual
   replaced by p; block verification that stops at the first rejection.
2. The one engine (with ``ModelDrafter`` / ``NgramDrafter``) on exact toy models (target with
   EOS), 6,000 generations of ≤ 4 tokens each, against ``target_law``, for every lossless
   method, one request at a time and 16 requests per batch (rows joining as others end);
   the always-accept and block-with-break verifiers wrapped in a ``SingleDraftMethod`` are
   the negative controls.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from scipy import stats
from torch import Tensor

from verispec.api import make_drafter
from verispec.engine.loop import Engine
from verispec.engine.protocols import Method, SingleDraftMethod
from verispec.engine.request import Request
from verispec.methods import build_method
from verispec.models.toy import RandomContextLM
from verispec.sampling import Randomness, Sampling, sample_from
from verispec.theory import target_law
from verispec.verify import (
    VerifyPlan,
    VerifyResult,
    block_plan,
    block_verify,
    draw,
    plan_law,
    token_plan,
    token_verify,
)

pytestmark = pytest.mark.usefixtures("one_thread")

P_PASS = 1e-3
P_FAIL = 1e-9
V, GAMMA, N = 10, 3, 200_000


def chi2_pvalue(observed: dict, expected_probs: dict, n: int) -> float:
    """Chi-square goodness of fit; cells with expected count < 5 are pooled."""
    if any(expected_probs.get(k, 0.0) == 0.0 for k in observed):
        return 0.0  # an impossible outcome was observed: reject outright
    keys = [k for k, v in expected_probs.items() if v > 0]
    big = [k for k in keys if expected_probs[k] * n >= 5]
    small = [k for k in keys if expected_probs[k] * n < 5]
    f_obs = [observed.get(k, 0) for k in big]
    f_exp = [expected_probs[k] * n for k in big]
    if sum(expected_probs[k] for k in small) * n >= 1:
        f_obs.append(sum(observed.get(k, 0) for k in small))
        f_exp.append(sum(expected_probs[k] for k in small) * n)
    scale = sum(f_obs) / sum(f_exp)  # removes float rounding of Σ p = 1
    return float(stats.chisquare(f_obs, [e * scale for e in f_exp]).pvalue)


# --------------------------------------------------------------------------------------
# 1. One verification step through the batched verifier.
# --------------------------------------------------------------------------------------

def _tables(seed: int, depth: int) -> list[Tensor]:
    """tables[j]: [V]*(j+1) float64, the next-token law after a prefix of j tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for j in range(depth):
        t = torch.rand([V] * (j + 1), generator=g, dtype=torch.float64) ** 2 + 1e-3
        out.append(t / t.sum(-1, keepdim=True))
    return out


P_TAB = _tables(1, GAMMA + 1)  # p after 0..γ draft tokens
Q_TAB = _tables(2, GAMMA)  # q after 0..γ-1 draft tokens


def _rows(tables: list[Tensor], prefix: Tensor, j: int) -> Tensor:
    """tables[j] at the rows' prefixes prefix[:, :j] -> [N, V]."""
    if j == 0:
        return tables[0].expand(prefix.shape[0], V)
    return tables[j][tuple(prefix[:, k] for k in range(j))]


def _one_step_inputs(seed: int) -> tuple[Tensor, Tensor, Tensor, torch.Generator]:
    g = torch.Generator().manual_seed(seed)
    x = torch.empty((N, GAMMA), dtype=torch.int64)
    q_rows = []
    for j in range(GAMMA):
        q_j = _rows(Q_TAB, x, j)  # [N, V]
        q_rows.append(q_j)
        x[:, j] = sample_from(q_j, g)
    p = torch.stack([_rows(P_TAB, x, j) for j in range(GAMMA + 1)], dim=1)  # [N, γ+1, V]
    return p, torch.stack(q_rows, dim=1), x, g


def always_accept_verify(p: Tensor, q: Tensor, x: Tensor, g: torch.Generator) -> VerifyResult:
    plan = token_plan(p, q, x)
    return draw(VerifyPlan(torch.ones_like(plan.accept_probs), plan.residuals, plan.rule), g)


def residual_p_verify(p: Tensor, q: Tensor, x: Tensor, g: torch.Generator) -> VerifyResult:
    plan = token_plan(p, q, x)
    return draw(VerifyPlan(plan.accept_probs, p.clone(), plan.rule), g)


def block_with_break_verify(p: Tensor, q: Tensor, x: Tensor, g: torch.Generator
                            ) -> VerifyResult:
    """Block verification's h and residuals, but stopping at the first rejection."""
    plan = block_plan(p, q, x)
    return draw(VerifyPlan(plan.accept_probs, plan.residuals, "first_reject"), g)


def _emitted_prefix_law_pvalue(verify: Callable[..., VerifyResult], seed: int,
                               device: str = "cpu") -> float:
    """The emitted prefix's law against p; on another ``device`` the verify step runs there
    with a generator of its own (the drafts and the completion samples stay on the CPU)."""
    p, q, x, g = _one_step_inputs(seed)
    if device == "cpu":
        res = verify(p, q, x, g)
    else:
        dev = torch.device(device)
        res = verify(p.to(dev), q.to(dev), x.to(dev),
                     torch.Generator(device=dev).manual_seed(seed + 1))
        assert res.next_token.device.type == dev.type
    tau, y = res.num_accepted.cpu(), res.next_token.cpu()  # [N], [N]
    out = torch.empty((N, 3), dtype=torch.int64)  # O_1..O_3 = (X^τ, Y, Z...)
    for j in range(3):
        z = sample_from(_rows(P_TAB, out, j), g)  # Z_j ~ p(· | O^j) if O_j is not emitted
        out[:, j] = torch.where(j < tau, x[:, min(j, GAMMA - 1)], torch.where(j == tau, y, z))
    observed = Counter(map(tuple, out.tolist()))
    exact = {k: float(P_TAB[0][k[0]] * P_TAB[1][k[0], k[1]] * P_TAB[2][k[0], k[1], k[2]])
             for k in itertools.product(range(V), repeat=3)}
    return chi2_pvalue(observed, exact, N)


@pytest.mark.parametrize("verify", [token_verify, block_verify], ids=["token", "block"])
def test_one_step_emitted_prefix_follows_target(verify: Callable[..., VerifyResult]) -> None:
    assert _emitted_prefix_law_pvalue(verify, seed=10) > P_PASS


@pytest.mark.parametrize("wrong", [always_accept_verify, residual_p_verify,
                                   block_with_break_verify],
                         ids=["always-accept", "residual-p", "block-with-break"])
def test_one_step_negative_controls_rejected(wrong: Callable[..., VerifyResult]) -> None:
    assert _emitted_prefix_law_pvalue(wrong, seed=10) < P_FAIL


@pytest.mark.parametrize("name, verify, plan_fn", [
    ("token", token_verify, token_plan), ("block", block_verify, block_plan)])
def test_one_step_tau_y_follow_exact_plan_law(name: str, verify, plan_fn) -> None:
    """(τ, Y) from the sampler vs the exact law E_X[plan_law], enumerating all V^γ drafts."""
    grid = torch.tensor(list(itertools.product(range(V), repeat=GAMMA)))  # [V^γ, γ]
    q_prob = torch.ones(grid.shape[0], dtype=torch.float64)
    for j in range(GAMMA):
        q_prob *= _rows(Q_TAB, grid, j).gather(1, grid[:, j : j + 1]).squeeze(1)
    p_all = torch.stack([_rows(P_TAB, grid, j) for j in range(GAMMA + 1)], dim=1)
    q_all = torch.stack([_rows(Q_TAB, grid, j) for j in range(GAMMA)], dim=1)
    exact_law = (q_prob[:, None, None] * plan_law(plan_fn(p_all, q_all, grid))).sum(0)
    assert abs(float(exact_law.sum()) - 1) < 1e-12
    exact = {(t, yy): float(exact_law[t, yy]) for t in range(GAMMA + 1) for yy in range(V)}
    p, q, x, g = _one_step_inputs(seed=20)
    res = verify(p, q, x, g)
    observed = Counter(zip(res.num_accepted.tolist(), res.next_token.tolist(), strict=True))
    assert chi2_pvalue(observed, exact, N) > P_PASS, name


# --------------------------------------------------------------------------------------
# 2. The real engine.
# --------------------------------------------------------------------------------------

RUNS = 6_000


def always_accept_plan(p: Tensor, q: Tensor, x: Tensor, lengths: Tensor | None = None) -> VerifyPlan:
    plan = token_plan(p, q, x, lengths=lengths)
    ones = torch.where(plan.accept_probs > 0, 1.0, 0.0) if lengths is not None \
        else torch.ones_like(plan.accept_probs)
    return VerifyPlan(ones, plan.residuals, "first_reject", plan.lengths)


def block_with_break_plan(p: Tensor, q: Tensor, x: Tensor,
                          lengths: Tensor | None = None) -> VerifyPlan:
    """Block verification's h and residuals, but stopping at the first rejection."""
    plan = block_plan(p, q, x, lengths=lengths)
    return VerifyPlan(plan.accept_probs, plan.residuals, "first_reject", plan.lengths)


def _engine_law_pvalue(method: Method, drafter_kind: str, batch_size: int = 1) -> float:
    target = RandomContextLM(3, seed=31, eos_token_id=2)
    draft = RandomContextLM(3, seed=32)
    sampling = Sampling()
    prompt, length = ([0, 1, 0, 1], 4) if drafter_kind == "ngram" else ([0], 4)
    drafter = make_drafter(target, draft, method, kind=drafter_kind)
    seeds = torch.Generator().manual_seed(99)
    requests = [Request(list(prompt), method, sampling, length,
                        Randomness(torch.Generator().manual_seed(int(s))), 3, drafter)
                for s in torch.randint(0, 2**62, (RUNS,), generator=seeds)]
    outs = Engine(target, batch_size=batch_size).run(requests)
    counts = Counter(tuple(o.tokens) for o in outs)
    assert sum(o.stats.accepted_total for o in outs) > RUNS // 2  # the verifier mattered
    return chi2_pvalue(counts, target_law(target, prompt, sampling, length), RUNS)


@pytest.mark.slow
@pytest.mark.parametrize("method, drafter_kind, batch_size", [
    ("token", "model", 1), ("block", "model", 16), ("token", "ngram", 16),
    ("block", "ngram", 1), ("greedy-block", "model", 16), ("multidraft", "model", 16)])
def test_engine_output_law_matches_target(method: str, drafter_kind: str,
                                          batch_size: int) -> None:
    assert _engine_law_pvalue(build_method(method), drafter_kind, batch_size) > P_PASS


@pytest.mark.slow
@pytest.mark.parametrize("wrong", [always_accept_plan, block_with_break_plan],
                         ids=["always-accept", "block-with-break"])
def test_engine_negative_control_rejected(wrong: Callable[..., VerifyPlan]) -> None:
    method = SingleDraftMethod("under-test", wrong, lossless=False)
    assert _engine_law_pvalue(method, "model", batch_size=16) < P_FAIL
