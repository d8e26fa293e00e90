"""Beam-search drafting for MJSD (Algorithm 1 of *Multi-Token Joint Speculative Decoding for
Accelerating Large Language Model Inference*, Qin et al.).

:func:`beam_search` keeps the ``num_beams`` continuations of highest joint probability under
the *warped* distribution of a model (sum of log-probabilities, no length normalisation; all
beams have the same length). It is shared by the MJSD drafter (:class:`BeamDrafter`, run on
the draft model q) and by MJGD (run on the target p, :mod:`verispec.methods.mjsd`).

Ties are broken deterministically: among equal scores the candidate with the smaller
(beam rank, token id) wins, where beam rank is the beam's position in the previous step's
ranking. Tokens of probability zero are never extended, so fewer than ``num_beams`` beams
are kept when fewer continuations have positive probability (one beam at temperature 0,
where beam search reduces to greedy decoding).

Beam search is deterministic, so the draft "distribution" q as sampled is one-hot; the
joint draft probabilities q(x_1..x_j) of the chosen beam travel in :attr:`Draft.joint`.
MJSD built on this drafter is NOT lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from verispec.checks import check_positive
from verispec.drafters.base import Draft, Drafter, DraftRow
from verispec.models.base import CausalLM
from verispec.sampling import Sampling

__all__ = ["BeamDrafter", "BeamResult", "beam_search", "top_candidates"]


@dataclass
class BeamResult:
    """The best beam of one search.

    Attributes:
        tokens: [K] int64, the best beam x_1..x_K.
        probs: [K] float64, warped probability of each token given the prefix before it.
        raw_logprobs: [K] float64, log-softmax of the *unwarped* logits at each token.
        next_logits: [V] logits after the whole beam (only if ``with_next``), else None.
        fed: number of beam tokens now in the model's cache (K - 1, or K with ``with_next``).
        positions: token positions the search fed to the model (Σ beams over its passes).
    """

    tokens: Tensor
    probs: Tensor
    raw_logprobs: Tensor
    next_logits: Tensor | None
    fed: int
    positions: int


def top_candidates(scores: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest finite entries of ``scores`` [N], best first.

    Ties go to the smaller index (exact, unlike a bare ``topk``). Fewer than ``k`` indices
    are returned when fewer entries are finite. Returns [k'] int64.
    """
    k = min(k, int(torch.isfinite(scores).sum()))
    kth = torch.topk(scores, k).values[-1]
    cand = (scores >= kth).nonzero().squeeze(1)  # [n >= k], in index order
    order = torch.sort(scores[cand], descending=True, stable=True).indices[:k]
    return cand[order]


def beam_search(
    model: CausalLM,
    first_logits: Tensor,
    steps: int,
    num_beams: int,
    sampling: Sampling,
    *,
    with_next: bool = False,
) -> BeamResult:
    """Beam search of width ``num_beams`` over ``steps`` tokens on the warped model.

    The model must hold one cache row (the context) whose next-token logits are
    ``first_logits`` [V]. It makes ``steps - 1`` forward passes (``steps`` with
    ``with_next``) and leaves the model with one row: the context followed by the first
    ``fed`` tokens of the best beam.
    """
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    if steps < 1:
        raise ValueError(f"beam search needs at least one step, got {steps}")
    if model.rows != 1:
        raise ValueError(f"beam search starts from one cache row; {model.name} has {model.rows}")
    vocab = int(first_logits.shape[-1])
    logits = first_logits.reshape(1, vocab)  # [R, V], R = live beams
    score = torch.zeros(1, dtype=torch.float64, device=logits.device)  # [R] log q(beam)
    hist = torch.empty((1, 0, 3), dtype=torch.float64, device=logits.device)  # [R, i, 3]
    parents = torch.zeros(1, dtype=torch.int64, device=logits.device)
    positions = 0
    for i in range(steps):
        q = sampling.probs(logits, model.name).to(torch.float64)  # [R, V]
        raw = torch.log_softmax(logits.to(torch.float64), dim=-1)  # [R, V]
        chosen = top_candidates((score[:, None] + q.log()).flatten(), num_beams)  # [R']
        parents, tokens = chosen // vocab, chosen % vocab  # [R'], [R']
        step = torch.stack([tokens.to(torch.float64), q[parents, tokens], raw[parents, tokens]], 1)
        hist = torch.cat([hist[parents], step[:, None]], dim=1)  # [R', i+1, 3]
        score = score[parents] + q[parents, tokens].log()  # [R']
        if i < steps - 1 or with_next:
            model.select_rows(parents.tolist())  # a no-op when the beams keep their rows
            logits = model.extend([[t] for t in tokens.tolist()], num_logits=1,
                                  check=False)[:, 0]  # [R', V]
            positions += len(tokens)
            parents = torch.arange(len(tokens), device=parents.device)  # row r is beam r now
    best = hist[0]  # [K, 3]: the best beam is ranked first
    fed = steps if with_next else steps - 1
    model.select_rows([int(parents[0])])
    return BeamResult(
        tokens=best[:, 0].to(torch.int64),
        probs=best[:, 1],
        raw_logprobs=best[:, 2],
        next_logits=logits[0] if with_next else None,
        fed=fed,
        positions=positions,
    )


class BeamDrafter(Drafter):
    """Drafts the best beam of a beam search on the warped draft model (MJSD's drafter).

    Deterministic: ``Draft.probs`` is one-hot on the drafted tokens and ``Draft.joint`` [1, γ]
    holds q(x_1..x_j) of the best beam under the warped draft distribution. Every request
    searches in a model of its own (:meth:`~verispec.models.base.CausalLM.spawn`: the same
    weights, its own cache), which after ``feedback`` holds the longest prefix of the new
    context it has already processed; the next ``propose`` feeds only the rest.
    """

    def __init__(self, model: CausalLM, num_beams: int = 8) -> None:
        self.model = model
        self.num_beams = check_positive("num_beams", num_beams)
        self._models: dict[int, CausalLM] = {}
        self._base: dict[int, int] = {}
        self._fed: dict[int, int] = {}
        self._calls = 0

    @property
    def forward_calls(self) -> int:
        return self._calls + sum(m.forward_calls for m in self._models.values())

    @property
    def max_length(self) -> int | None:
        return self.model.max_length

    def admit(self, rows: Sequence[DraftRow]) -> None:
        for r in rows:
            model = self.model.spawn()
            model.add_rows([r.context[:-1]])
            self._models[r.id], self._base[r.id], self._fed[r.id] = model, 0, 0

    def release(self, rows: Sequence[DraftRow]) -> None:
        for r in rows:
            model = self._models.pop(r.id)
            self._calls += model.forward_calls

    def row_calls(self, row_id: int) -> int:
        return self._models[row_id].forward_calls

    def propose(self, rows: Sequence[DraftRow], gammas: Sequence[int]) -> list[Draft]:
        return [self._propose_one(r, g) for r, g in zip(rows, gammas, strict=True)]

    def _propose_one(self, row: DraftRow, gamma: int) -> Draft:
        if row.num_drafts != 1:
            raise ValueError(f"the beam drafter returns one draft (the best beam), not {row.num_drafts}")
        model = self._models[row.id]
        if gamma < 1:
            return Draft(tokens=torch.empty((1, 0), dtype=torch.int64),
                         probs=torch.empty((1, 0, model.vocab_size)),
                         joint=torch.empty((1, 0), dtype=torch.float64))
        first = model.extend([row.context[model.length :]], num_logits=1, check=False)[0, 0]  # [V]
        beam = beam_search(model, first, gamma, self.num_beams, row.sampling,
                           with_next=row.with_next)
        self._base[row.id], self._fed[row.id] = len(row.context), beam.fed
        tokens = beam.tokens[None].to(model.device)  # [1, γ]
        dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
        probs = torch.zeros((1, gamma, model.vocab_size), dtype=dtype, device=model.device)
        probs.scatter_(-1, tokens[..., None], 1.0)  # [1, γ, V] one-hot
        next_probs = None
        if beam.next_logits is not None:
            next_probs = row.sampling.probs(beam.next_logits[None], model.name)  # [1, V]
        joint = torch.cumprod(beam.probs, dim=0)[None]  # [1, γ] q(x_1..x_j), float64
        return Draft(tokens=tokens, probs=probs, next_probs=next_probs, joint=joint)

    def feedback(self, rows: Sequence[DraftRow], accepted: Sequence[int],
                 branches: Sequence[int]) -> None:
        for r, tau in zip(rows, accepted, strict=True):
            model = self._models[r.id]
            model.rollback(min(self._base[r.id] + min(int(tau), self._fed[r.id]), model.length))
