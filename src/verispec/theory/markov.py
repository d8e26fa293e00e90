"""Expected rejections for non-stationary Markov chains (Theorems 1 and 3 of
*A Theoretical Perspective for Speculative Decoding Algorithm*, Yin et al., NeurIPS 2024),
exactly and by running the real engine.

The paper writes p for the draft and q for the target; here p = target, q = draft. Its
setting (Figure 2): target and draft are non-stationary Markov chains over V = 7 states with
horizon T = 50, the prompt x_0 is uniform over the states, and the draft looks ahead over the
whole remaining horizon (K = T). The number of rejections N_rej counts positions n ≤ T whose
token was drawn from a residual.

* :func:`expected_rejections` computes E[N_rej] exactly by a forward recursion over
  (state, whether position n starts a new iteration). With one draft it is Theorem 1,
  Σ_n E_{x_{<n} ~ p}[TV(p_n, q_n)]; with M i.i.d. drafts (Algorithm 4, depth first) a
  position that starts an iteration is rejected with probability Π_m TV(r^m, q)
  (:func:`verispec.theory.multidraft.theorem3_rejection`), a position on an accepted branch
  with TV(p, q) (Theorem 3).
* :func:`simulate_rejections` runs the engine itself (:func:`verispec.engine.loop.generate_one`)
  (token or multidraft method, model drafter) with γ = T and a budget of T + 1 tokens, so
  that positions 1..T are always drafted, as in the paper, and counts iterations that end
  in a rejection (τ < drafted length).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from verispec.checks import check_positive
from verispec.drafters.model import ModelDrafter
from verispec.engine.loop import generate_one
from verispec.engine.protocols import Method, VerifyBatch
from verispec.engine.request import Request
from verispec.methods import build_method
from verispec.models.toy import TableLM
from verispec.sampling import Randomness, Sampling
from verispec.verify import VerifyResult
from verispec.verify._core import normalise_or

__all__ = [
    "NonStationaryMarkovLM",
    "expected_rejections",
    "random_chain_pair",
    "rejection_limit",
    "simulate_rejections",
]


class NonStationaryMarkovLM(TableLM):
    """x_n ~ P_n(· | x_{n-1}): one transition matrix per position.

    ``transitions`` [T, V, V] float64; the context is the one-token prompt x_0 followed by
    x_1..x_{n-1}, and position n ≥ T reuses P_T.
    """

    def __init__(self, transitions: Tensor, **kw: object) -> None:
        super().__init__(int(transitions.shape[-1]), name="nonstationary-markov", **kw)  # type: ignore[arg-type]
        t = transitions.to(torch.float64)
        self.transitions = t / t.sum(dim=-1, keepdim=True)  # [T, V, V]

    @property
    def horizon(self) -> int:
        return int(self.transitions.shape[0])

    def next_probs(self, context: Sequence[int]) -> Tensor:
        if not context:
            raise ValueError("a Markov chain needs the prompt state x_0 in the context")
        n = min(len(context) - 1, self.horizon - 1)  # 0-based index of P_{n+1}
        return self.transitions[n, int(context[-1])]


def random_chain_pair(states: int = 7, horizon: int = 50, seed: int = 10,
                      sharpness: float = 1.0) -> tuple[NonStationaryMarkovLM, NonStationaryMarkovLM]:
    """(target p, draft q): independent random non-stationary chains (Dirichlet(1) rows raised
    to ``sharpness``). The paper's own chains (its seed 10) are not published; these differ."""
    if states < 2 or horizon < 1:
        raise ValueError(f"need states >= 2 and horizon >= 1, got {states}, {horizon}")
    g = torch.Generator().manual_seed(seed)

    def chain() -> NonStationaryMarkovLM:
        u = torch.rand((horizon, states, states), generator=g, dtype=torch.float64)
        w = (-torch.log1p(-u)) ** sharpness
        return NonStationaryMarkovLM(w)

    return chain(), chain()


def _rejection_and_residual(p: Tensor, q: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """Per row of p, q [S, V]: Π_{j≤M} TV(r^j, q) [S] and r^{M+1} [S, V] (r^1 = p)."""
    r, rej = p, torch.ones(p.shape[0], dtype=torch.float64)
    for _ in range(m):
        rej = rej * 0.5 * (r - q).abs().sum(-1)
        r = normalise_or((r - q).clamp_min(0), r)
    return rej, r


def expected_rejections(target: NonStationaryMarkovLM, draft: NonStationaryMarkovLM,
                        num_drafts: int = 1, *, horizon: int | None = None,
                        initial: Tensor | None = None) -> tuple[float, list[float]]:
    """Exact E[N_rej] over positions 1..T and its per-position terms.

    ``initial`` [V] is the law of the prompt x_0 (uniform by default, as in the paper).
    """
    v = target.vocab_size
    if draft.vocab_size != v:
        raise ValueError("target and draft chains need the same number of states")
    if check_positive("num_drafts", num_drafts) < 1:
        raise ValueError(f"num_drafts must be an integer >= 1, got {num_drafts!r}")
    t = target.horizon if horizon is None else horizon
    mu = torch.full((v,), 1.0 / v, dtype=torch.float64) if initial is None else initial.to(torch.float64)
    fresh, cont = mu.clone(), torch.zeros(v, dtype=torch.float64)  # P(x_{n-1} = s, n starts / continues)
    per_position = []
    for n in range(t):
        p = target.transitions[min(n, target.horizon - 1)]  # [V, V]: row s = p_{n+1}(· | s)
        q = draft.transitions[min(n, draft.horizon - 1)]
        tv = 0.5 * (p - q).abs().sum(-1)  # [V]
        rej_f, resid_f = _rejection_and_residual(p, q, num_drafts)  # [V], [V, V]
        per_position.append(float((fresh * rej_f).sum() + (cont * tv).sum()))
        rejected_f = rej_f[:, None] * resid_f  # [V, V] joint (token, rejected) at a fresh position
        rejected_c = (p - q).clamp_min(0)  # [V, V] at a continuing position
        new_fresh = fresh @ rejected_f + cont @ rejected_c
        new_cont = fresh @ (p - rejected_f) + cont @ torch.minimum(p, q)
        fresh, cont = new_fresh, new_cont
    return sum(per_position), per_position


def rejection_limit(p: Tensor, q: Tensor, *, max_steps: int = 100000) -> float:
    """lim_{M→∞} Π_{m≤M} TV(r^m, q) for one token (p = target [V], q = draft [V]).

    The residual chain r^{m+1} = [r^m − q]₊ normalised either reaches a fixed point r* (then
    the factors stay TV(r*, q): the limit is the product so far if that is 1, else 0) or the
    product decays geometrically; iteration stops when it is below 1e-300."""
    r, q = p.to(torch.float64), q.to(torch.float64)
    prod = 1.0
    for _ in range(max_steps):
        tv = 0.5 * float((r - q).abs().sum())
        nxt = normalise_or((r - q).clamp_min(0), r)
        if torch.equal(nxt, r):
            return prod if tv >= 1.0 else 0.0
        prod *= tv
        if prod < 1e-300:
            return 0.0
        r = nxt
    return prod


class _CountingMethod(Method):
    """Delegates to a method and counts iterations that end in a rejection (τ < γ drafted)."""

    def __init__(self, inner: Method) -> None:
        self.inner = inner
        self.name, self.lossless = inner.name, inner.lossless
        self.num_drafts, self.needs_next_probs = inner.num_drafts, inner.needs_next_probs
        self.rejections = 0

    def verify(self, batch: VerifyBatch) -> VerifyResult:
        result = self.inner.verify(batch)
        self.rejections += int((result.num_accepted < batch.lengths).sum())
        return result


def simulate_rejections(target: NonStationaryMarkovLM, draft: NonStationaryMarkovLM, *,
                        runs: int, num_drafts: int = 1, seed: int = 0,
                        horizon: int | None = None) -> list[int]:
    """N_rej of ``runs`` real engine runs (token verification, or multidraft with M drafts),
    each with a uniform random prompt state x_0 and its own generator."""
    t = target.horizon if horizon is None else horizon
    if runs < 1:
        raise ValueError(f"runs must be >= 1, got {runs}")
    inner = build_method("token") if num_drafts == 1 else build_method("multidraft", num_drafts=num_drafts)
    method = _CountingMethod(inner)
    sampling = Sampling()
    counts = []
    prompts = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add contention (10x slower)
    try:
        for i in range(runs):
            x0 = int(torch.randint(target.vocab_size, (1,), generator=prompts))
            random = Randomness(torch.Generator().manual_seed(seed * 1_000_003 + i))
            method.rejections = 0
            generate_one(target, Request([x0], method, sampling, t + 1, random, t,
                                         ModelDrafter(draft)))
            counts.append(method.rejections)
    finally:
        torch.set_num_threads(threads)
    return counts
