"""The model drafter's early stop (``draft_stop`` / ``--draft-stop``).

The draft ends early where the draft model's own top next-token probability (unwarped) is
below a threshold, so its length is a stopping time of the draft prefix. Exact enumeration
shows token and block verification stay lossless with it (the engine itself, replayed, in
``test_engine_exact.py``); the engine shows it really shortens drafts and keeps greedy output
identical to autoregressive decoding.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest
import torch

import verispec
from verispec.drafters.model import ModelDrafter
from verispec.models.hf import HFCausalLM
from verispec.models.toy import MarkovLM, RandomContextLM, TableLM
from verispec.sampling import Randomness, Sampling
from verispec.theory import speculative_law, target_law, tv_distance
from verispec.verify import VerifyPlan, block_plan, token_plan

TOL = 1e-12
PLANS = {"token": token_plan, "block": block_plan}


def _stop_fraction(draft: TableLM, ctx: tuple[int, ...], depth: int, threshold: float) -> float:
    """Fraction of draft prefixes of length 1..depth-1 where the drafter would stop."""
    hits = total = 0
    for n in range(1, depth):
        for xs in itertools.product(range(draft.vocab_size), repeat=n):
            total += 1
            hits += float(draft.next_probs(ctx + xs).max()) < threshold
    return hits / total


def _median_confidence(draft: TableLM, ctx: tuple[int, ...]) -> float:
    maxes = sorted(float(draft.next_probs(ctx + xs).max())
                   for n in (1, 2) for xs in itertools.product(range(draft.vocab_size), repeat=n))
    return maxes[len(maxes) // 2]


@pytest.mark.parametrize("sampling", [Sampling(), Sampling(temperature=0.6, top_k=2),
                                      Sampling(temperature=0)], ids=["T1", "T0.6-topk2", "T0"])
@pytest.mark.parametrize("kind, vocab, gamma, length", [
    ("random", 2, 4, 5), ("random", 3, 3, 4), ("random", 3, 4, 4), ("markov", 3, 4, 5),
    ("markov", 4, 3, 3),
])
def test_stopped_drafts_stay_lossless(kind: str, vocab: int, gamma: int, length: int,
                                      sampling: Sampling) -> None:
    if kind == "markov":
        target, draft = MarkovLM.random(vocab, 3), MarkovLM.random(vocab, 4)
    else:
        target, draft = RandomContextLM(vocab, 3), RandomContextLM(vocab, 4)
    prompt = (1, 0)
    threshold = _median_confidence(draft, prompt)  # stops at about half of the prefixes
    assert 0.2 < _stop_fraction(draft, prompt, gamma, threshold) < 0.8
    want = target_law(target, prompt, sampling, length)
    for name, plan_fn in PLANS.items():
        got = speculative_law(target, draft, prompt, plan_fn=plan_fn, gamma=gamma,
                              sampling=sampling, length=length, draft_stop=threshold)
        assert abs(sum(got.values()) - 1) < TOL
        assert tv_distance(got, want) < TOL, name


def _always_accept(p: torch.Tensor, q: torch.Tensor, x: torch.Tensor) -> VerifyPlan:
    plan = token_plan(p, q, x)
    return VerifyPlan(torch.ones_like(plan.accept_probs), plan.residuals, "first_reject")


def test_enumeration_with_stops_still_catches_a_wrong_verifier() -> None:
    target, draft = RandomContextLM(3, 3), RandomContextLM(3, 4)
    prompt = (1, 0)
    threshold = _median_confidence(draft, prompt)
    got = speculative_law(target, draft, prompt, plan_fn=_always_accept, gamma=3,
                          sampling=Sampling(), length=4, draft_stop=threshold)
    assert tv_distance(got, target_law(target, prompt, Sampling(), 4)) > 1e-3


class _Row:
    """The drafter's view of a request."""

    def __init__(self, ctx: list[int], random: Randomness) -> None:
        self.id, self.context, self.random, self.sampling = 0, ctx, random, Sampling()
        self.num_drafts, self.with_next, self.matching = 1, False, False


def test_drafter_stops_where_the_draft_doubts() -> None:
    draft = RandomContextLM(4, 7)
    ctx = [2, 1]
    threshold = _median_confidence(draft, tuple(ctx))
    drafter = ModelDrafter(draft, stop_below=threshold)
    random = Randomness(torch.Generator().manual_seed(0))
    lengths = []
    for _ in range(200):
        row = _Row(ctx, random)
        drafter.admit([row])
        d = drafter.propose([row], [5])[0]
        drafter.release([row])
        toks = d.tokens[0].tolist()
        lengths.append(len(toks))
        # Independent check of the rule: every prefix before the end was confident,
        # and the end (if short) is a doubtful prefix.
        for i in range(1, len(toks)):
            assert float(draft.next_probs(tuple(ctx + toks[:i])).max()) >= threshold
        if len(toks) < 5:
            assert float(draft.next_probs(tuple(ctx + toks)).max()) < threshold
        # q rows are exactly the draft's distributions along the path.
        for i in range(len(toks)):
            assert d.probs is not None
            assert torch.allclose(d.probs[0, i], draft.next_probs(tuple(ctx + toks[:i])),
                                  atol=1e-15)
    assert min(lengths) >= 1 and 1 < len(set(lengths))


def test_greedy_identity_and_shorter_drafts_on_tiny_hf(tiny: Callable[[str], HFCausalLM]
                                                        ) -> None:
    prompt = [5, 17, 3, 42, 8, 8, 30]
    ar = verispec.generate(tiny("target"), None, prompt, method="ar", temperature=0,
                           max_new_tokens=30)
    for method in ("token", "block"):
        full = verispec.generate(tiny("target"), tiny("close"), prompt, method=method,
                                 gamma=6, temperature=0, max_new_tokens=30)
        short = verispec.generate(tiny("target"), tiny("close"), prompt, method=method,
                                  gamma=6, temperature=0, max_new_tokens=30, draft_stop=0.5)
        assert short.tokens == ar.tokens == full.tokens
        assert short.stats.drafted_total < full.stats.drafted_total
        assert short.stats.draft_calls < full.stats.draft_calls


def test_draft_stop_errors() -> None:
    target, draft = RandomContextLM(4, 1), RandomContextLM(4, 2)
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="draft stop threshold"):
            verispec.generate(target, draft, [0], method="block", gamma=3, draft_stop=bad)
    with pytest.raises(ValueError, match="draft_stop works with"):
        verispec.generate(target, draft, [0], method="multidraft", gamma=3, draft_stop=0.5)
    with pytest.raises(ValueError, match="draft_stop works with"):
        verispec.generate(target, draft, [0, 1, 0], method="block", gamma=3,
                          drafter="ngram", draft_stop=0.5)
    with pytest.raises(ValueError, match="draft_stop works with"):
        verispec.generate(target, draft, [0], method="mjgd", gamma=3, draft_stop=0.5)
