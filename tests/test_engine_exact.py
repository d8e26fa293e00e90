"""The one engine is exact: its output law, computed by replaying every random decision of
the real engine (:mod:`verispec.theory.replay`), equals the target's law — for every
lossless method, for a single prompt and for batches (ragged rows, rows joining as others
leave), with the model and n-gram drafters and with early-stopped drafts. Negative
controls: a biased verifier, a model that mixes up rows and the unmodified greedy block
verification are caught.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import Tensor
from test_gamma_batch import counts
from verifier_doubles import TargetResidual

from verispec.api import make_drafter
from verispec.checks import TOLERANCE
from verispec.engine.gamma import (HISTORY_MIN, Acceptance, AutoGamma, PairHistory, PassCosts,
                                   best_gamma)
from verispec.engine.loop import Engine
from verispec.engine.request import Request
from verispec.methods import build_method
from verispec.models.base import CausalLM
from verispec.models.toy import RandomContextLM, TableLM
from verispec.sampling import Randomness, Sampling
from verispec.theory.exact import target_law, tv_distance
from verispec.theory.replay import engine_law, marginal

pytestmark = pytest.mark.usefixtures("one_thread")

LOSSLESS = ["ar", "token", "block", "greedy-block", "multidraft", "lossy[epsilon=0]"]
#: γ per method: multi-draft paths multiply (M drafts of γ tokens each), so it drafts less.
GAMMA = {"multidraft": 1}


def _runner(target: CausalLM, draft: CausalLM | None, prompts: Sequence[Sequence[int]],
            method: str, *, gamma: int, budgets: Sequence[int], batch_size: int,
            sampling: Sampling = Sampling(), drafter: str = "model",
            draft_stop: float | None = None, method_obj: object | None = None):  # noqa: ANN202
    m = method_obj if method_obj is not None else build_method(method)

    def run(randoms: Sequence[Randomness]) -> list[list[int]]:
        maker = None
        if m.name != "ar":  # type: ignore[attr-defined]
            maker = make_drafter(target, draft.spawn() if draft is not None else None, m,  # type: ignore[arg-type]
                                 kind=drafter, draft_stop=draft_stop)
        engine = Engine(target.spawn(), batch_size=batch_size)
        reqs = [Request(list(p), m, m.adjust_sampling(sampling), n, r,  # type: ignore[attr-defined]
                        gamma if maker is not None else 0, maker)
                for p, n, r in zip(prompts, budgets, randoms, strict=True)]
        return [o.tokens for o in engine.run(reqs)]

    return run


def _assert_equal(got: dict, want: dict) -> None:
    assert abs(sum(got.values()) - 1) < TOLERANCE * 10
    assert max(abs(got.get(k, 0.0) - want.get(k, 0.0)) for k in set(got) | set(want)) < TOLERANCE


@pytest.mark.parametrize("method", LOSSLESS)
@pytest.mark.parametrize("eos", [None, 2])
def test_single_prompt_law_is_the_target_law(method: str, eos: int | None) -> None:
    target = RandomContextLM(3, seed=21, eos_token_id=eos)
    draft = RandomContextLM(3, seed=22)
    law = engine_law(_runner(target, draft, [[0, 1]], method, gamma=GAMMA.get(method, 2),
                             budgets=[3], batch_size=1), rows=1)
    _assert_equal(marginal(law, 0), target_law(target, [0, 1], Sampling(), 3))


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("drafter, stop", [("ngram", None), ("model", 0.6)])
def test_ngram_and_early_stopped_drafts_stay_exact(method: str, drafter: str,
                                                   stop: float | None) -> None:
    target = RandomContextLM(3, seed=5)
    draft = RandomContextLM(3, seed=6)
    prompt = [0, 1, 0, 2, 0, 1]  # repeats, so the n-gram drafter proposes something
    law = engine_law(_runner(target, draft, [prompt], method, gamma=3, budgets=[3],
                             batch_size=1, drafter=drafter, draft_stop=stop), rows=1)
    _assert_equal(marginal(law, 0), target_law(target, prompt, Sampling(), 3))


@pytest.mark.parametrize("method", LOSSLESS)
def test_batched_rows_follow_the_target_independently(method: str) -> None:
    """Two ragged rows (different prompts, budgets and so draft lengths) in one batch: the
    joint law of their outputs is the product of the two target laws."""
    target = RandomContextLM(2, seed=41)
    draft = RandomContextLM(2, seed=42)
    prompts, budgets = [[0, 1, 1], [1]], [2, 3]
    law = engine_law(_runner(target, draft, prompts, method, gamma=GAMMA.get(method, 2),
                             budgets=budgets, batch_size=2), rows=2)
    a = target_law(target, prompts[0], Sampling(), budgets[0])
    b = target_law(target, prompts[1], Sampling(), budgets[1])
    _assert_equal(law, {(ka, kb): pa * pb for ka, pa in a.items() for kb, pb in b.items()})


@pytest.mark.parametrize("method", ["block", "multidraft", "greedy-block"])
def test_a_row_admitted_into_a_freed_slot_is_exact(method: str) -> None:
    """Three requests through two slots: the third starts when the first one ends, while the
    second is still decoding; its law is the target's."""
    target = RandomContextLM(3, seed=21, eos_token_id=2)
    draft = RandomContextLM(3, seed=22)
    prompts, budgets = [[0, 1, 0], [1], [1, 0]], [1, 3, 2]
    law = engine_law(_runner(target, draft, prompts, method, gamma=2, budgets=budgets,
                             batch_size=2, sampling=Sampling(temperature=0.8)), rows=3,
                     replayed=[2])  # the other rows sample with their own generators
    _assert_equal(marginal(law, 2), target_law(target, prompts[2], Sampling(temperature=0.8), 2))


class _CrossedRows(RandomContextLM):
    """A deliberately broken model: with several rows, row b is scored with row b+1's logits
    for single-token steps (the kind of bug row bookkeeping can introduce)."""

    def _extend(self, tokens: list[list[int]], num_logits: int) -> Tensor:
        logits = super()._extend(tokens, num_logits)
        return logits.roll(1, dims=0) if logits.shape[0] > 1 and num_logits == 1 else logits


def test_negative_controls_are_caught() -> None:
    target, draft = RandomContextLM(3, seed=21), RandomContextLM(3, seed=22)
    want = target_law(target, [0, 1], Sampling(), 3)
    wrong = engine_law(_runner(target, draft, [[0, 1]], "token", gamma=2, budgets=[3],
                               batch_size=1, method_obj=TargetResidual()), rows=1)
    assert tv_distance(marginal(wrong, 0), want) > 1e-3
    biased = engine_law(_runner(target, draft, [[0, 1]], "greedy-block-unmodified", gamma=2,
                                budgets=[3], batch_size=1), rows=1)
    assert tv_distance(marginal(biased, 0), want) > 1e-3
    crossed: TableLM = _CrossedRows(3, seed=21)
    prompts = [[0, 1, 0], [1]]
    law = engine_law(_runner(crossed, draft, prompts, "ar", gamma=0, budgets=[3, 3],
                             batch_size=2), rows=2, replayed=[1])
    assert tv_distance(marginal(law, 1), target_law(target, prompts[1], Sampling(), 3)) > 1e-3


def test_replay_visits_every_path_once() -> None:
    """The enumeration itself: the probabilities of the paths sum to one, and a method with
    no randomness at all (greedy) has one path."""
    target, draft = RandomContextLM(3, seed=1), RandomContextLM(3, seed=2)
    greedy = engine_law(_runner(target, draft, [[0]], "block", gamma=2, budgets=[4],
                                batch_size=1, sampling=Sampling(temperature=0)), rows=1)
    assert len(greedy) == 1 and abs(next(iter(greedy.values())) - 1) < TOLERANCE
    gen = torch.Generator().manual_seed(0)
    assert isinstance(Randomness(gen).choose(torch.tensor([[0.5, 0.5]])), Tensor)


def _auto_costs(draft_prefill: float = 0.0) -> PassCosts:
    return PassCosts(target={1: 1.0, 2: 1.1, 4: 1.25, 8: 1.9, 16: 3.4}, draft=0.35,
                     draft_prefill=draft_prefill)


#: A draft prefill cost at which a 5-token prompt with a budget of 4 decodes its first token
#: without the draft (as every request does: its time to first token never includes the
#: reading), its second too (reading 6 × 0.05 s > 0.094 s saved per token × (1 + 4 / 2)),
#: and drafts from the third (7 × 0.05 ≤ 0.094 × (2 + 2)).
WAIT_TWO_TOKENS = 0.05


def test_gamma_auto_waits_until_the_draft_prefill_pays() -> None:
    """The first token is decoded plainly; a prompt the draft would read for longer than
    drafting saves is decoded plainly until the output is long enough; a free prefill
    drafts from the second token; methods that always need a draft never wait."""
    policy = AutoGamma(_auto_costs(WAIT_TWO_TOKENS), max_gamma=3)
    policy.start(5, 4)
    for _ in range(2):
        assert policy.choose() == 0
        policy.observe(0, 0)
    assert policy.choose() > 0
    eager = AutoGamma(_auto_costs(0.01), max_gamma=3)
    eager.start(2, 4)
    assert eager.choose() == 0  # the first token, before any reading
    eager.observe(0, 0)
    assert eager.choose() > 0
    free = AutoGamma(_auto_costs(), max_gamma=3)  # a draft that reads for free
    free.start(2, 4)
    assert free.choose() > 0
    never = AutoGamma(_auto_costs(100.0), max_gamma=3)
    never.start(500, 64)
    for _ in range(64):
        assert never.choose() == 0
        never.observe(0, 0)
    forced = AutoGamma(_auto_costs(100.0), max_gamma=3, min_gamma=1)
    forced.start(500, 64)
    assert forced.choose() >= 1


def test_gamma_auto_reads_with_the_first_token_only_where_nothing_streams_it() -> None:
    """A request returned whole drafts from its first iteration where the reading pays (its
    first token is seen with its last); a streamed one decodes that token plainly; a
    reading that does not pay is deferred either way."""
    streamed = AutoGamma(_auto_costs(0.01), max_gamma=3)
    streamed.start(2, 4, streamed=True)
    assert streamed.reading_deferred and streamed.choose() == 0
    whole = AutoGamma(_auto_costs(0.01), max_gamma=3)
    whole.start(2, 4, streamed=False)
    assert not whole.reading_deferred and whole.choose() > 0
    dear = AutoGamma(_auto_costs(WAIT_TWO_TOKENS), max_gamma=3)
    dear.start(5, 4, streamed=False)
    assert not dear.reading_deferred and dear.choose() == 0


def _history(rate: float, positions: float) -> PairHistory:
    """A pair's history of ``positions`` tested positions accepted at ``rate``."""
    history = PairHistory()
    counts(rate, positions, into=history)
    return history


def _first_token(policy: AutoGamma) -> None:
    """The request's first token: decoded plainly (the draft has not read the prompt)."""
    assert policy.reading_deferred and policy.choose() == 0
    policy.observe(0, 0)


def test_gamma_auto_starts_from_the_pairs_pooled_acceptance() -> None:
    """A pair whose earlier requests accepted most drafts starts the next request's draft at
    once where the default prior would wait; one that accepted few waits; a request's own
    outcomes are pooled into the history."""
    costs, prompt, budget = _auto_costs(0.06), 5, 4
    default = AutoGamma(costs, max_gamma=3)
    default.start(prompt, budget)
    _first_token(default)
    assert default.choose() == 0  # waits for the output to prove long
    good = AutoGamma(costs, max_gamma=3, history=_history(0.95, HISTORY_MIN))
    good.start(prompt, budget)
    _first_token(good)
    assert good.choose() > 0
    young = _history(0.95, HISTORY_MIN - 1)  # too few positions yet
    assert AutoGamma(costs, history=young).prior == AutoGamma(costs).prior
    never = AutoGamma(_auto_costs(100.0), max_gamma=3, history=PairHistory())
    never.start(500, 64)  # a new pair drafts (and reads the prompt) whatever the costs say
    _first_token(never)
    assert never.choose() >= 1
    never.observe(1, 0)
    assert never.history.tested == 1 and never.choose() >= 1  # type: ignore[union-attr]
    poor = _history(0.1, HISTORY_MIN)
    bad = AutoGamma(costs, max_gamma=3, history=poor)
    bad.start(prompt, budget)
    _first_token(bad)
    assert bad.choose() == 0
    good.observe(3, 2)
    assert good.history is not None and good.history.tested == HISTORY_MIN + 3
    pooled = PairHistory()
    late = AutoGamma(costs, max_gamma=3, history=pooled)  # made before the pair is known,
    late.start(prompt, budget)  # as a batch's requests are
    counts(0.95, HISTORY_MIN, into=pooled)  # earlier requests finish first
    _first_token(late)
    assert late.choose() > 0 and late.prior == pooled.prior()  # read at its first choice
    assert late.prior.rest == pytest.approx(0.95)
    counts(0.0, 10 * HISTORY_MIN, into=pooled)
    assert late.prior.rest == pytest.approx(0.95)  # and fixed from then on


#: A draft prefill cost at which the 5-token prompt below repays its reading at once.
READ_AT_ONCE = 0.01


class _FirstDraft(AutoGamma):
    """γ auto that records how many tokens each iteration drafted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drafted: list[int] = []

    def observe(self, drafted: int, accepted: int) -> None:
        self.drafted.append(drafted)
        super().observe(drafted, accepted)


@pytest.mark.parametrize(("history", "streamed", "draft_prefill"),
                         [(None, True, 0.0), (None, True, WAIT_TWO_TOKENS),
                          ("learned", True, 0.0), ("learned", True, WAIT_TWO_TOKENS),
                          (None, False, READ_AT_ONCE)])
@pytest.mark.parametrize("method", ["token", "block", "greedy-block"])
def test_gamma_chosen_by_measurement_stays_exact(method: str, draft_prefill: float,
                                                 history: str | None, streamed: bool) -> None:
    """``gamma="auto"``: γ follows each request's own acceptance history, so it changes
    from iteration to iteration (and can be 0), and the draft may join a request after
    plain decoding began (its prefill then reads the tokens decoded so far), or, for a
    request returned whole, draft with its first token; the law is still the target's."""
    costs = _auto_costs(draft_prefill)
    lo, hi = best_gamma(Acceptance.iid(0.2), costs, 3), best_gamma(Acceptance.iid(0.9), costs, 3)
    assert lo < hi  # the estimate of α moves γ within the enumerated range
    target, draft = RandomContextLM(3, seed=21), RandomContextLM(3, seed=22)
    m = build_method(method)
    first: set[int] = set()

    def run(randoms: Sequence[Randomness]) -> list[list[int]]:
        pooled = _history(0.9, HISTORY_MIN) if history else None
        policy = _FirstDraft(costs, max_gamma=3, min_gamma=1 if m.needs_next_probs else 0,
                             history=pooled)
        request = Request(prompt, m, Sampling(), 4, randoms[0], policy,
                          make_drafter(target, draft.spawn(), m), streamed=streamed)
        tokens = [Engine(target.spawn()).run([request])[0].tokens]
        first.add(policy.drafted[0])
        return tokens

    prompt = [0, 1, 2, 0, 1]
    law = engine_law(run, rows=1)
    _assert_equal(marginal(law, 0), target_law(target, prompt, Sampling(), 4))
    assert (min(first) > 0) == (not streamed or draft_prefill == 0.0 or m.needs_next_probs)
