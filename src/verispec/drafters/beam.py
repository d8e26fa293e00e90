"""Beam-search drafting for MJSD (Algorithm 1 of mjsd-multi-token-joint-speculative-decoding.txt).

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

from verispec.drafters.base import Draft, Drafter
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
            if not torch.equal(parents, torch.arange(model.rows, device=parents.device)):
                model.reorder_rows(parents)
            logits = model.extend(tokens[:, None].to(model.device), num_logits=1)[:, 0]  # [R', V]
            positions += len(tokens)
            parents = torch.arange(len(tokens), device=parents.device)  # row r is beam r now
    best = hist[0]  # [K, 3]: the best beam is ranked first
    fed = steps if with_next else steps - 1
    model.join(int(parents[0]), model.length)
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
    holds q(x_1..x_j) of the best beam under the warped draft distribution. The draft
    cache follows :class:`~verispec.drafters.model.ModelDrafter`'s discipline: after
    ``feedback`` the model holds one row, the longest prefix of the new context it has
    already processed, and the next ``propose`` feeds only the rest.
    """

    deterministic = True

    def __init__(self, model: CausalLM, sampling: Sampling, num_beams: int = 8) -> None:
        if isinstance(num_beams, bool) or not isinstance(num_beams, int) or num_beams < 1:
            raise ValueError(f"num_beams must be an integer >= 1, got {num_beams!r}")
        self.model = model
        self.sampling = sampling
        self.num_beams = num_beams
        self._base = 0
        self._fed = 0

    @property
    def forward_calls(self) -> int:
        return self.model.forward_calls

    def begin(self, prompt: Sequence[int]) -> None:
        self.model.reset()

    def propose(
        self,
        context: Sequence[int],
        gamma: int,
        generator: torch.Generator,
        *,
        num_drafts: int = 1,
        with_next: bool = False,
    ) -> Draft:
        if num_drafts != 1:
            raise ValueError(f"the beam drafter returns one draft (the best beam), not {num_drafts}")
        if gamma < 1:
            raise ValueError(f"gamma must be >= 1, got {gamma}")
        model = self.model
        tail = torch.tensor(list(context[model.length :]), dtype=torch.int64, device=model.device)
        first = model.extend(tail, num_logits=1)[0]  # [V]
        beam = beam_search(model, first, gamma, self.num_beams, self.sampling, with_next=with_next)
        self._base, self._fed = len(context), beam.fed
        tokens = beam.tokens[None].to(model.device)  # [1, γ]
        dtype = torch.float64 if first.dtype == torch.float64 else torch.float32
        probs = torch.zeros((1, gamma, model.vocab_size), dtype=dtype, device=model.device)
        probs.scatter_(-1, tokens[..., None], 1.0)  # [1, γ, V] one-hot
        next_probs = None
        if beam.next_logits is not None:
            next_probs = self.sampling.probs(beam.next_logits[None], model.name)  # [1, V]
        joint = torch.cumprod(beam.probs, dim=0)[None]  # [1, γ] q(x_1..x_j), float64
        return Draft(tokens=tokens, probs=probs, next_probs=next_probs, joint=joint)

    def feedback(self, context: Sequence[int], num_accepted: int, branch: int = 0) -> None:
        valid = min(self._base + min(num_accepted, self._fed), self.model.length)
        self.model.rollback(valid)
