"""MJSD (Algorithm 1 of the MJSD paper) and MJGD: verifier, beam drafter, methods, engine.

MJSD is NOT lossless, so nothing here compares output laws to the target's; the tests check
the algorithm itself against independent computations (Python loops, brute-force
enumeration of all continuations, a fresh model without cache).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import Tensor

import verispec
from verispec.drafters.base import Draft
from verispec.drafters.beam import BeamDrafter, beam_search, top_candidates
from verispec.engine.loop import generate_one
from verispec.engine.protocols import VerifyBatch
from verispec.engine.request import Request
from verispec.methods import METHODS, build_method
from verispec.methods.mjsd import MJGDMethod, MJSDMethod, mjgd_generate, paper_sampling
from verispec.models.toy import RandomContextLM, TableLM
from verispec.sampling import Randomness, Sampling
from verispec.verify.mjsd import mjsd_accepted, mjsd_verify

F64 = torch.float64
PLAIN = Sampling(temperature=1.0)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@dataclass
class DraftRowStub:
    """What a drafter sees of one request, outside the engine."""

    context: list[int]
    sampling: Sampling
    id: int = 0
    num_drafts: int = 1
    with_next: bool = False
    matching: bool = False
    random: Randomness = field(default_factory=lambda: Randomness(gen()))


def beam_propose(model: TableLM, sampling: Sampling, num_beams: int, ctx: Sequence[int],
                 gamma: int, num_drafts: int = 1) -> Draft:
    """One proposal of a fresh beam drafter for one request with context ``ctx``."""
    drafter = BeamDrafter(model, num_beams=num_beams)
    row = DraftRowStub(list(ctx), sampling, num_drafts=num_drafts)
    drafter.admit([row])
    return drafter.propose([row], [gamma])[0]


class DictLM(TableLM):
    """A table model: ``table[context]`` if present, else ``default``."""

    def __init__(self, table: dict[tuple[int, ...], list[float]], default: list[float]) -> None:
        super().__init__(len(default), name="dict")
        self.table = {k: torch.tensor(v, dtype=F64) for k, v in table.items()}
        self.default = torch.tensor(default, dtype=F64)

    def next_probs(self, context: Sequence[int]) -> Tensor:
        return self.table.get(tuple(context), self.default)


def joint_vs_greedy_lm() -> DictLM:
    """After [0]: greedy takes 1 (0.5) but then nothing beats 1/3 (joint 0.167), while
    2 (0.4) is followed by 0 with 0.92 (joint 0.368)."""
    return DictLM({(0,): [0.1, 0.5, 0.4], (0, 1): [1 / 3, 1 / 3, 1 / 3],
                   (0, 2): [0.92, 0.04, 0.04]}, default=[0.2, 0.3, 0.5])


def warped_joint(model: TableLM, sampling: Sampling, ctx: Sequence[int], block: Sequence[int]) -> list[float]:
    """q(x_1..x_j) for j = 1..len(block), by direct evaluation of the table."""
    out, prob = [], 1.0
    for i, x in enumerate(block):
        dist = sampling.probs(model.next_probs(tuple(ctx) + tuple(block[:i])).log())
        prob *= float(dist[x])
        out.append(prob)
    return out


def algorithm1(p_rows: Tensor, q_joint: Tensor, tokens: Tensor, threshold: float) -> tuple[int, float]:
    """Lines 6–13 of Algorithm 1 written as a plain loop; also Σ_{i≤τ} (1 - p(x_i))."""
    p, eta = 1.0, 0
    for i in range(tokens.shape[0]):
        p *= float(p_rows[i, tokens[i]])
        if threshold < min(1.0, p / float(q_joint[i])):
            eta = i + 1
    return eta, sum(1.0 - float(p_rows[i, tokens[i]]) for i in range(eta))


def random_case(b: int, gamma: int, v: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    g = gen(seed)
    target = torch.rand((b, gamma + 1, v), generator=g, dtype=F64) + 0.01
    target /= target.sum(-1, keepdim=True)
    tokens = torch.randint(0, v, (b, gamma), generator=g)
    q_tok = torch.rand((b, gamma), generator=g, dtype=F64) * 0.9 + 0.05
    return target, torch.cumprod(q_tok, dim=1), tokens


# ----------------------------------------------------------------------------- verifier


def test_verify_matches_algorithm1_loop() -> None:
    target, q_joint, tokens = random_case(200, 4, 5, seed=1)
    for threshold in (0.0, 0.1, 0.3, 0.7, 1.0):
        res = mjsd_verify(target, q_joint, tokens, gen(), threshold=threshold)
        for r in range(200):
            tau, bias = algorithm1(target[r], q_joint[r], tokens[r], threshold)
            assert int(res.num_accepted[r]) == tau
            assert abs(float(res.bias_tv[r]) - bias) < 1e-12
    taus = mjsd_accepted(target, q_joint, tokens, 0.3)
    assert len(set(taus.tolist())) >= 3  # the case mix exercises several τ values


def test_longest_passing_prefix_not_first_failure() -> None:
    # Prefix 1 fails (0.1 / 0.5 = 0.2 <= 0.3), prefix 2 passes (0.1 / 0.05 > 1): τ = 2.
    target = torch.full((1, 3, 3), 1 / 3, dtype=F64)
    target[0, 0] = torch.tensor([0.1, 0.45, 0.45], dtype=F64)
    target[0, 1] = torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    tokens = torch.tensor([[0, 0]])
    q_joint = torch.tensor([[0.5, 0.05]], dtype=F64)
    assert int(mjsd_accepted(target, q_joint, tokens, 0.3)[0]) == 2
    assert int(mjsd_accepted(target, q_joint, tokens, 0.0)[0]) == 2
    assert int(mjsd_accepted(target, q_joint, tokens, 1.0)[0]) == 0


def test_threshold_one_never_accepts_even_when_p_exceeds_q() -> None:
    target, q_joint, tokens = random_case(100, 4, 6, seed=2)
    q_joint = q_joint * 1e-6  # p/q >> 1 everywhere, so min(1, p/q) = 1, which is not > 1
    res = mjsd_verify(target, q_joint, tokens, gen(), threshold=1.0)
    assert torch.equal(res.num_accepted, torch.zeros(100, dtype=torch.int64))
    assert torch.equal(res.bias_tv, torch.zeros(100, dtype=F64))


def test_threshold_zero_accepts_all_with_positive_joint_p() -> None:
    target, q_joint, tokens = random_case(100, 4, 6, seed=3)
    q_joint = q_joint * 1e6  # p/q tiny but positive
    assert torch.equal(mjsd_accepted(target, q_joint, tokens, 0.0), torch.full((100,), 4))
    # A zero target probability at position k (0-based) leaves τ = k.
    for k in range(4):
        zeroed = target.clone()
        zeroed[torch.arange(100), k, tokens[:, k]] = 0.0
        assert torch.equal(mjsd_accepted(zeroed, q_joint, tokens, 0.0), torch.full((100,), k))


def test_next_token_comes_from_position_tau() -> None:
    # Position i of the target puts all mass on token i + 5, so Y reveals the row used.
    b, gamma, v = 50, 3, 9
    target, q_joint, tokens = random_case(b, gamma, v, seed=4)
    target = torch.zeros_like(target)
    for i in range(gamma + 1):
        target[:, i, i + 5] = 1.0
    tokens = torch.full((b, gamma), 5)
    tokens[:, 1] = 6
    tokens[:, 2] = torch.where(torch.arange(b) % 2 == 0, 7, 0)  # half the rows lose position 3
    q_joint = torch.ones((b, gamma), dtype=F64)
    res = mjsd_verify(target, q_joint, tokens, gen(), threshold=0.5)
    expected_tau = torch.where(torch.arange(b) % 2 == 0, 3, 2)
    assert torch.equal(res.num_accepted, expected_tau)
    assert torch.equal(res.next_token, expected_tau + 5)


@pytest.mark.parametrize("bad", [-0.01, 1.01, math.nan, math.inf, "high", True])
def test_invalid_threshold(bad: object) -> None:
    target, q_joint, tokens = random_case(2, 2, 3, seed=5)
    with pytest.raises(ValueError, match="threshold"):
        mjsd_verify(target, q_joint, tokens, gen(), threshold=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="threshold"):
        MJSDMethod(threshold=bad)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- beam search


def test_top_candidates_ties_and_infinities() -> None:
    scores = torch.tensor([1.0, 3.0, -math.inf, 3.0, 2.0, 3.0], dtype=F64)
    assert top_candidates(scores, 2).tolist() == [1, 3]
    assert top_candidates(scores, 4).tolist() == [1, 3, 5, 4]
    assert top_candidates(scores, 10).tolist() == [1, 3, 5, 4, 0]  # -inf never kept


@pytest.mark.parametrize("sampling", [PLAIN, Sampling(temperature=0.8, top_k=3)])
def test_beam_drafter_equals_brute_force(sampling: Sampling) -> None:
    v, gamma, ctx = 4, 3, [1, 0, 2]
    draft = RandomContextLM(v, seed=13)
    out = beam_propose(draft, sampling, v**gamma, ctx, gamma)  # width V^γ: exact search
    joints = {block: warped_joint(draft, sampling, ctx, block)[-1]
              for block in itertools.product(range(v), repeat=gamma)}
    ranked = sorted(joints.values(), reverse=True)
    assert ranked[0] - ranked[1] > 1e-6  # a unique optimum (setup sanity)
    best = max(joints, key=joints.__getitem__)
    assert tuple(out.tokens[0].tolist()) == best
    expected = torch.tensor(warped_joint(draft, sampling, ctx, best), dtype=F64)
    assert torch.allclose(out.joint[0], expected, rtol=0, atol=1e-12)
    assert torch.equal(out.probs[0], torch.nn.functional.one_hot(out.tokens[0], v).to(F64))
    # Width 1 is greedy decoding on the warped draft: an independent negative control.
    greedy, c = [], list(ctx)
    for _ in range(gamma):
        greedy.append(int(sampling.probs(draft.next_probs(tuple(c)).log()).argmax()))
        c.append(greedy[-1])
    narrow = beam_propose(RandomContextLM(v, seed=13), sampling, 1, ctx, gamma)
    assert narrow.tokens[0].tolist() == greedy
    assert joints[tuple(greedy)] < joints[best]  # the table makes beam search matter


def test_beam_search_greedy_at_temperature_zero() -> None:
    draft = RandomContextLM(5, seed=12)
    out = beam_propose(draft, Sampling(temperature=0.0), 8, [3], 4)
    c, greedy = [3], []
    for _ in range(4):
        greedy.append(int(draft.next_probs(tuple(c)).argmax()))
        c.append(greedy[-1])
    assert out.tokens[0].tolist() == greedy
    assert torch.equal(out.joint[0], torch.ones(4, dtype=F64))


def test_joint_beats_per_token_choice() -> None:
    lm = joint_vs_greedy_lm()
    wide = beam_propose(lm, PLAIN, 2, [0], 2)
    assert wide.tokens[0].tolist() == [2, 0]
    assert torch.allclose(wide.joint[0], torch.tensor([0.4, 0.4 * 0.92], dtype=F64), atol=1e-12)
    narrow = beam_propose(joint_vs_greedy_lm(), PLAIN, 1, [0], 2)
    assert narrow.tokens[0].tolist()[0] == 1  # per-token greedy choice
    assert float(narrow.joint[0, -1]) < float(wide.joint[0, -1])


def test_engine_mjsd_and_mjgd_pick_higher_joint() -> None:
    t, d = joint_vs_greedy_lm(), joint_vs_greedy_lm()
    common: dict[str, Any] = {"prompt": [0], "gamma": 2, "max_new_tokens": 3, "temperature": 1.0,
                              "paper_warp": False}
    mjsd = verispec.generate(t, d, method="mjsd", num_beams=2, **common)
    mjgd = verispec.generate(t, None, method="mjgd", num_beams=2, **common)
    greedy = verispec.generate(t, None, prompt=[0], method="ar", temperature=0.0, max_new_tokens=2)
    assert mjsd.tokens[:2] == [2, 0] and mjgd.tokens[:2] == [2, 0]
    assert mjsd.stats.tau_histogram == [0, 0, 1]  # the whole beam [2, 0] passed (p = q)
    assert greedy.tokens[0] == 1
    joint = {blk: warped_joint(t, PLAIN, [0], blk)[-1] for blk in itertools.product(range(3), repeat=2)}
    assert max(joint, key=joint.__getitem__) == (2, 0)
    assert joint[(2, 0)] > joint[tuple(greedy.tokens)]


# ----------------------------------------------------------------------------- engine


class CheckingDrafter(BeamDrafter):
    """Checks the draft cache after every feedback and every proposal against a fresh model."""

    def __init__(self, seed: int, num_beams: int) -> None:
        super().__init__(RandomContextLM(6, seed=seed), num_beams)
        self.seed, self.checks = seed, 0
        self.released: dict[int, Any] = {}  # request id -> its draft model, once finished

    def propose(self, rows, gammas):  # type: ignore[no-untyped-def]
        out = super().propose(rows, gammas)
        for r, g, d in zip(rows, gammas, out, strict=True):
            fresh = BeamDrafter(RandomContextLM(6, seed=self.seed), self.num_beams)
            fresh.admit([r])
            ref = fresh.propose([r], [g])[0]
            assert torch.equal(d.tokens, ref.tokens) and torch.equal(d.joint, ref.joint)
        return out

    def feedback(self, rows, accepted, branches):  # type: ignore[no-untyped-def]
        before = {r.id: (self._base[r.id], self._fed[r.id]) for r in rows}
        super().feedback(rows, accepted, branches)
        for r, tau in zip(rows, accepted, strict=True):
            m = self._models[r.id]
            base, fed = before[r.id]
            assert m.rows == 1 and m._rows[0] == list(r.context[: m.length])
            assert m.length == base + min(tau, fed)  # nothing valid was dropped
            self.checks += 1

    def release(self, rows):  # type: ignore[no-untyped-def]
        for r in rows:
            self.released[r.id] = self._models[r.id]
        super().release(rows)


def test_draft_cache_stays_consistent() -> None:
    target = RandomContextLM(6, seed=21, sharpness=2.0)
    method = MJSDMethod(num_beams=3, threshold=0.1)
    sampling = method.adjust_sampling(PLAIN)
    drafter = CheckingDrafter(22, 3)
    prompt = [1, 2, 3]
    out = generate_one(target, Request(prompt, method, sampling, 30, Randomness(gen(7)), 4,
                                       drafter))
    ctx = prompt + out.tokens
    assert drafter.checks == out.stats.drafted_by_position[0] >= out.stats.iterations - 1
    (model,) = drafter.released.values()
    assert model._rows[0] == ctx[: model.length]
    assert model.length >= len(ctx) - 4 - 1
    assert out.stats.draft_calls == model.forward_calls == drafter.forward_calls > 0


def test_engine_threshold_one_is_greedy_target_decoding() -> None:
    # The draft is the target itself, so p/q = 1 on every prefix: min(1, 1) > 1 still fails.
    target, draft = RandomContextLM(6, seed=31), RandomContextLM(6, seed=31)
    res = verispec.generate(target, draft, [4, 1], method="mjsd", threshold=1.0,
                            temperature=0.0, max_new_tokens=25)
    ar = verispec.generate(target, None, [4, 1], method="ar", temperature=0.0, max_new_tokens=25)
    s = res.stats
    assert s.tokens_emitted == s.target_calls == 25 and s.accepted_total == 0
    assert res.tokens == ar.tokens
    # Control: any threshold below 1 accepts every draft token of this perfect draft.
    ctrl = verispec.generate(target, draft, [4, 1], method="mjsd", threshold=0.99,
                             temperature=0.0, max_new_tokens=25).stats
    assert ctrl.accepted_total == ctrl.drafted_total > 0 and ctrl.target_calls == 5


def test_engine_threshold_zero_accepts_every_draft_token() -> None:
    target, draft = RandomContextLM(6, seed=41), RandomContextLM(6, seed=42)
    res = verispec.generate(target, draft, [0], method="mjsd", threshold=0.0, gamma=3,
                            paper_warp=False, max_new_tokens=41, seed=3)
    s = res.stats
    assert s.accepted_total == s.drafted_total > 0
    assert s.target_calls == 11 and s.tokens_emitted == 41  # 10 × (3 + 1) + 1


def test_generate_end_to_end_reports_lossy_and_perplexity() -> None:
    target, draft = RandomContextLM(6, seed=51), RandomContextLM(6, seed=52)
    prompt = [2, 5]
    for name in ("mjsd", "mjgd"):
        res = verispec.generate(target, draft, prompt, method=name, max_new_tokens=12, seed=1)
        s = res.stats
        assert s.lossless is False and s.to_dict()["lossless"] is False
        assert "NOT lossless" in s.summary() and "NOT lossless" in METHODS[name].summary
        assert s.tokens_emitted == len(res.tokens) == 12
        nll = -sum(math.log(float(target.next_probs(tuple(prompt + res.tokens[:i]))[x]))
                   for i, x in enumerate(res.tokens))
        assert math.isfinite(s.perplexity)
        assert abs(s.perplexity - math.exp(nll / 12)) < 1e-5 * s.perplexity
        assert "top-k=20, top-p=0.9" in " ".join(s.notes)


def test_mjgd_exact_width_matches_brute_force_and_counts_calls() -> None:
    v, k = 4, 2
    target = RandomContextLM(v, seed=61, sharpness=1.5)
    method = MJGDMethod(num_beams=v**k, paper_warp=False)
    out = mjgd_generate(target, None, [3, 1], sampling=PLAIN, max_new_tokens=5,
                        random=Randomness(gen()), gamma=k, method=method)
    ctx = [3, 1]
    for start in (0, 2):  # two full steps, each the exact argmax of the joint over V^K blocks
        joint = {b: warped_joint(target, PLAIN, ctx, b)[-1] for b in itertools.product(range(v), repeat=k)}
        assert tuple(out.tokens[start : start + k]) == max(joint, key=joint.__getitem__)
        ctx += out.tokens[start : start + k]
    s = out.stats
    assert s.tokens_emitted == 5 and s.iterations == 3 and s.target_calls == 2 + 2 + 1
    assert s.prefill_calls == 1 and s.draft_calls == 0 and s.stop_reason == "max_new_tokens"


def test_mjgd_stops_at_eos() -> None:
    target = DictLM({(0,): [0.1, 0.5, 0.4], (0, 2): [0.9, 0.05, 0.05]}, [0.2, 0.3, 0.5])
    target.eos_token_ids = frozenset({2})
    out = mjgd_generate(target, None, [0], sampling=PLAIN, max_new_tokens=10,
                        random=Randomness(gen()), gamma=3, method=MJGDMethod(num_beams=4))
    assert out.tokens[-1] == 2 and 2 not in out.tokens[:-1] and out.stats.stop_reason == "eos"


# ----------------------------------------------------------------------------- parameters


def test_paper_warp_rule() -> None:
    m = MJSDMethod()
    assert m.adjust_sampling(Sampling(temperature=0.7)) == Sampling(0.7, top_k=20, top_p=0.9)
    assert m.adjust_sampling(Sampling(0.7, top_k=5)) == Sampling(0.7, top_k=5)
    assert m.adjust_sampling(Sampling(0.7, top_p=0.5)) == Sampling(0.7, top_p=0.5)
    assert MJSDMethod(paper_warp=False).adjust_sampling(Sampling(0.7)) == Sampling(0.7)
    assert paper_sampling(Sampling(0.0)) == Sampling(0.0, top_k=20, top_p=0.9)
    assert MJGDMethod().adjust_sampling(Sampling(1.0)).top_k == 20


def test_registry_entries() -> None:
    mjsd, mjgd = METHODS["mjsd"], METHODS["mjgd"]
    assert not mjsd.lossless and mjsd.default_gamma == 4 and mjsd.uses_draft
    assert not mjgd.lossless and mjgd.default_gamma == 4 and not mjgd.uses_draft
    assert mjgd.runner is mjgd_generate and mjsd.runner is None
    assert mjsd.batchable and not mjgd.batchable  # MJGD runs by a schedule of its own
    assert mjsd.options() == {"num_beams": 8, "threshold": 0.1, "paper_warp": True}
    assert mjgd.options() == {"num_beams": 8, "paper_warp": True}
    assert mjsd.law is not None and mjgd.law is not None
    m = build_method("mjsd", num_beams=3, threshold=None)
    assert (m.num_beams, m.threshold, m.paper_warp, m.lossless) == (3, 0.1, True, False)  # type: ignore[attr-defined]
    assert mjsd.drafting == "beam" and mjgd.drafting == "none"


@pytest.mark.parametrize("bad", [0, -2, 1.5, True])
def test_invalid_num_beams(bad: object) -> None:
    with pytest.raises(ValueError, match="num_beams"):
        MJSDMethod(num_beams=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_beams"):
        MJGDMethod(num_beams=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_beams"):
        BeamDrafter(RandomContextLM(3, seed=0), num_beams=bad)  # type: ignore[arg-type]


def test_invalid_options_through_generate() -> None:
    t, d = RandomContextLM(4, seed=1), RandomContextLM(4, seed=2)
    with pytest.raises(ValueError, match="num_beams"):
        verispec.generate(t, d, [0], method="mjsd", num_beams=0)
    with pytest.raises(ValueError, match="threshold"):
        verispec.generate(t, d, [0], method="mjsd", threshold=1.5)
    with pytest.raises(ValueError, match="paper_warp"):
        verispec.generate(t, d, [0], method="mjsd", paper_warp="yes")
    with pytest.raises((TypeError, ValueError), match="threshold"):
        verispec.generate(t, None, [0], method="mjgd", threshold=0.5)  # MJGD has no threshold
    with pytest.raises(ValueError, match="gamma"):
        verispec.generate(t, None, [0], method="mjgd", gamma=0)
    with pytest.raises(ValueError, match="threshold"):
        verispec.generate(t, d, [0], method="mjsd[threshold=1.5]")
    with pytest.raises(ValueError, match="cannot share a batch"):
        verispec.generate_batch(t, None, [[0], [1]], method="mjgd")
    with pytest.raises(ValueError, match="one draft"):
        beam_propose(t, PLAIN, 8, [0], 2, num_drafts=2)
    with pytest.raises(ValueError, match="joint"):
        MJSDMethod().verify(VerifyBatch(
            target_probs=torch.ones((1, 1, 2, 4), dtype=F64) / 4,
            draft_probs=torch.ones((1, 1, 1, 4)),
            draft_tokens=torch.zeros((1, 1, 1), dtype=torch.int64),
            lengths=torch.tensor([1]), next_probs=None, joint=None,
            randoms=[Randomness(gen())], states=[None]))


# ----------------------------------------------------------------------------- select_rows


def test_table_select_rows() -> None:
    lm = RandomContextLM(5, seed=3)
    lm.add_rows([[]])
    lm.extend([1, 2])
    lm.select_rows([0, 0, 0])  # fork one row into three
    lm.extend(torch.tensor([[0], [3], [4]]))
    lm.select_rows(torch.tensor([2, 2, 0, 1]))
    assert lm._rows == [[1, 2, 4], [1, 2, 4], [1, 2, 0], [1, 2, 3]]
    lm._rows[0].append(9)
    assert lm._rows[1] == [1, 2, 4]  # copies, not aliases


def test_hf_select_rows_and_beam_search() -> None:
    transformers = pytest.importorskip("transformers")
    from verispec.models.hf import HFCausalLM

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=2, max_position_embeddings=64)
    net = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        net.lm_head.weight.mul_(30)
    lm = HFCausalLM(net, None, name="tiny")
    prefix = [1, 5, 3]

    @torch.no_grad()
    def full(rows: list[list[int]]) -> Tensor:  # [R, V] next-token logits, no cache
        return net(input_ids=torch.tensor(rows)).logits[:, -1]

    lm.add_rows([prefix])
    lm.select_rows([0, 0, 0])  # fork one row into three
    lm.extend(torch.tensor([[4], [6], [7]]))
    lm.select_rows(torch.tensor([2, 0, 0, 1]))
    assert lm.rows == 4
    got = lm.extend(torch.tensor([[8]] * 4))[:, -1]
    want = full([prefix + [7, 8], prefix + [4, 8], prefix + [4, 8], prefix + [6, 8]])
    assert (got - want).abs().max() < 1e-4

    # Exact-width beam search (V^2 beams) on the real cache vs brute force over V^2 blocks.
    lm.reset()
    lm.add_rows([[]])
    first = lm.extend(prefix, num_logits=1)[0, 0]
    beam = beam_search(lm, first, 2, 32 * 32, PLAIN)
    p1 = torch.softmax(full([prefix])[0].double(), -1)  # [V]
    p2 = torch.softmax(full([prefix + [x] for x in range(32)]).double(), -1)  # [V, V]
    joint = (p1[:, None] * p2).flatten()  # [V*V]
    top2 = joint.topk(2).values
    assert (top2[0] - top2[1]) / top2[0] > 1e-3  # unique optimum beyond float32 noise
    best = int(joint.argmax())
    assert beam.tokens.tolist() == [best // 32, best % 32]
    assert abs(float(beam.probs.prod()) - float(joint[best])) < 1e-5 * float(joint[best])
    assert lm.rows == 1 and lm.length == len(prefix) + 1  # one row: prefix + x_1
