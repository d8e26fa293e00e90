"""Batched speculative decoding (issue 7): model layer, engine, exactness, API and CLI.

* Model layer: after random ragged extends, rollbacks, row selections and admissions, every
  row's logits equal a fresh single-sequence forward of that row's tokens (toy: exactly;
  tiny HF: 1e-4), and the HF cache really gets packed.
* Greedy: every row of a batched run equals ``speculative_generate`` on that prompt alone,
  token for token, with prompts of different lengths, per-row budgets and an EOS that ends
  rows at different steps, for ar, token, block, greedy-block, lossy and multidraft.
* Sampling: a row's output with seed s is the same alone and in a batch (and equals the
  single-request engine); negative control: a generator shared by all rows breaks it.
* Exactness by enumeration (1e-12): the batched engine itself is enumerated by replaying
  every random decision of one row (the others sampling with their own generators, slots
  being freed and refilled), and the row's output law equals the target's; the joint law of
  two enumerated rows is the product of the target laws. Negative control: lossy verification
  through the same harness is detected.
"""

from __future__ import annotations

import io
import json
import random as pyrandom
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

import verispec
from verispec.cli import main
from verispec.drafters.base import Draft
from verispec.drafters.model import ModelDrafter
from verispec.drafters.ngram import NgramDrafter
from verispec.engine.batch import (
    BatchedModelDrafter,
    PerRowDrafter,
    RowRandom,
    batched_generate,
)
from verispec.engine.loop import speculative_generate
from verispec.engine.methods import Method
from verispec.methods import build_method
from verispec.methods.greedy_block import GreedyBlockMethod
from verispec.models.base import ContextTooLongError
from verispec.models.batched import BatchedHFLM, BatchedTableLM, as_batched
from verispec.models.hf import HFCausalLM
from verispec.models.toy import RandomContextLM, TableLM
from verispec.sampling import Sampling
from verispec.theory import target_law, tv_distance
from verispec.verify import VerifyResult, plan_law, token_plan
from verispec.verify.block import block_plan
from verispec.verify.greedy_block import (
    advance_modifications,
    greedy_block_plan,
    modified_targets,
)
from verispec.verify.lossy import lossy_plan
from verispec.verify.multidraft import multidraft_law, multidraft_plan

METHODS6 = [("ar", {}), ("token", {}), ("block", {}), ("greedy-block", {}),
            ("lossy", {"epsilon": 0.2}), ("multidraft", {"num_drafts": 3})]


def _gens(seeds: list[int]) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def _run_batch(target: Any, draft: Any, prompts: list[list[int]], name: str, opts: dict,
               sampling: Sampling, budgets: list[int], seeds: list[int], batch_size: int,
               gamma: int = 3, random: RowRandom | None = None) -> list[list[int]]:
    g = 0 if name == "ar" else gamma
    drafter = BatchedModelDrafter(as_batched(draft), sampling) if g else None
    out = batched_generate(as_batched(target), drafter, prompts,
                           methods=[build_method(name, **opts) for _ in prompts], gamma=g,
                           sampling=sampling, max_new_tokens=budgets, generators=_gens(seeds),
                           random=random, batch_size=batch_size)
    return [r.tokens for r in out.rows]


def _run_single(target: Any, draft: Any, prompt: list[int], name: str, opts: dict,
                sampling: Sampling, budget: int, seed: int, gamma: int = 3) -> Any:
    g = 0 if name == "ar" else gamma
    return speculative_generate(target, ModelDrafter(draft, sampling) if g else None, prompt,
                                method=build_method(name, **opts), gamma=g, sampling=sampling,
                                max_new_tokens=budget, generator=torch.Generator().manual_seed(seed))


# Model layer.

def _random_ops(model: Any, reference: Callable[[list[int]], Tensor], vocab: int, atol: float,
                steps: int = 30) -> None:
    """Drive ``model`` with random ragged operations; compare every row to ``reference``."""
    rng = pyrandom.Random(0)
    rows: list[list[int]] = []
    model.reset()
    for step in range(steps):
        op = rng.choice(["extend", "extend", "rollback", "select", "add"]) if rows else "add"
        if op == "add":
            new = [[rng.randrange(vocab) for _ in range(rng.randrange(0, 7))]
                   for _ in range(rng.randrange(1, 3))]
            model.add_rows(new)
            rows += [list(r) for r in new]
        elif op == "extend":
            toks = [[rng.randrange(vocab) for _ in range(rng.randrange(0, 5))] for _ in rows]
            if not any(toks):
                toks[0] = [1]
            logits = model.extend(toks)  # [R, k, V]
            for b, t in enumerate(toks):
                rows[b] += t
                for j in range(len(t)):
                    want = reference(rows[b][: len(rows[b]) - len(t) + j + 1])
                    assert torch.allclose(logits[b, j].double(), want.double(), atol=atol,
                                          rtol=0), (step, b, j)
        elif op == "rollback":
            keep = [rng.randrange(0, len(r) + 1) for r in rows]
            model.rollback(keep)
            rows = [r[:n] for r, n in zip(rows, keep, strict=True)]
        else:
            idx = [rng.randrange(len(rows)) for _ in range(rng.randrange(1, 5))]
            model.select_rows(idx)
            rows = [list(rows[i]) for i in idx]
        assert model.lengths == [len(r) for r in rows]


def test_batched_table_model_matches_the_table_exactly() -> None:
    table = RandomContextLM(5, seed=3)
    _random_ops(BatchedTableLM(table), lambda ctx: table.next_probs(tuple(ctx)).log(), 5, 0.0)


def test_batched_hf_model_matches_single_forward_passes(tiny: Callable[[str], HFCausalLM]) -> None:
    single = tiny("target")

    def reference(ctx: list[int]) -> Tensor:
        single.reset()
        return single.extend(torch.tensor(ctx))[-1]

    model = BatchedHFLM.from_causal_lm(tiny("target"))
    _random_ops(model, reference, 64, atol=1e-4, steps=40)
    assert model.packs > 0  # the gather path ran and kept every row intact
    assert model.physical_length <= 2 * max(model.lengths) + 8


def test_batched_model_errors() -> None:
    model = BatchedTableLM(RandomContextLM(4, seed=1, max_length=6))
    model.add_rows([[1, 2], [3]])
    with pytest.raises(ValueError, match="rows"):
        model.extend([[1]])
    with pytest.raises(ValueError, match="token id"):
        model.extend([[9], [1]])
    with pytest.raises(ValueError, match="at least one token"):
        model.extend([[], []])
    with pytest.raises(ValueError, match="roll back"):
        model.rollback([3, 0])
    with pytest.raises(ContextTooLongError):
        model.extend([[0, 0, 0, 0, 0], [0]])
    with pytest.raises(TypeError, match="no batched counterpart"):
        as_batched(object())  # type: ignore[arg-type]


# Greedy: rows equal the single-request engine token for token.

def test_greedy_rows_equal_single_requests_on_tiny_hf(tiny: Callable[[str], HFCausalLM]) -> None:
    greedy = Sampling(temperature=0)
    prompts = [[1, 2, 3, 4, 9, 10], [7], [20, 21, 22], list(range(30, 41)), [3, 3]]
    budgets = [10, 6, 12, 8, 9]
    target, draft = tiny("target"), tiny("close")
    # An EOS taken from row 0's greedy path ends some rows early and others at their budget.
    path = _run_single(target, draft, prompts[0], "ar", {}, greedy, 10, 0).tokens
    target.eos_token_ids = frozenset({path[4]})
    for name, opts in METHODS6:
        want = [_run_single(target, draft, p, name, opts, greedy, n, seed=4)
                for p, n in zip(prompts, budgets, strict=True)]
        got = _run_batch(target, draft, prompts, name, opts, greedy, budgets, [4] * 5,
                         batch_size=3)
        assert got == [w.tokens for w in want], name
        if name != "lossy":  # lossy may leave the greedy path (and so miss the EOS)
            reasons = {w.stats.stop_reason for w in want}
            assert reasons == {"eos", "max_new_tokens"}, (name, reasons)
        assert len({w.stats.iterations for w in want}) > 1  # rows end at different steps


# Sampling: a row's output does not depend on its batch.

@pytest.mark.parametrize("name, opts", METHODS6)
def test_sampled_row_is_the_same_alone_and_in_a_batch_toy(name: str, opts: dict) -> None:
    target, draft = RandomContextLM(6, seed=11, eos_token_id=5), RandomContextLM(6, seed=12)
    sampling = Sampling(temperature=0.9)
    prompts = [[1, 2, 3], [0], [2, 2, 2, 2, 1], [3, 1], [4, 4, 0]]
    budgets = [12, 7, 15, 10, 9]
    seeds = [5, 5, 6, 7, 8]
    batched = _run_batch(target, draft, prompts, name, opts, sampling, budgets, seeds,
                         batch_size=2)
    for i, p in enumerate(prompts):
        alone = _run_batch(target, draft, [p], name, opts, sampling, [budgets[i]], [seeds[i]], 1)
        single = _run_single(target, draft, p, name, opts, sampling, budgets[i], seeds[i])
        assert batched[i] == alone[0] == single.tokens, (name, i)


@pytest.mark.parametrize("name, opts", [("block", {}), ("multidraft", {"num_drafts": 2})])
def test_sampled_row_is_the_same_alone_and_in_a_batch_tiny_hf(
        name: str, opts: dict, tiny: Callable[[str], HFCausalLM]) -> None:
    target, draft = tiny("target"), tiny("close")
    sampling = Sampling(temperature=1.0)
    prompts = [[5, 6, 7, 8, 9, 10, 11], [40], [1, 2, 3], [60, 61]]
    budgets = [10, 16, 12, 8]
    batched = _run_batch(target, draft, prompts, name, opts, sampling, budgets, [9] * 4,
                         batch_size=3, gamma=4)
    for i in (1, 2):
        alone = _run_batch(target, draft, [prompts[i]], name, opts, sampling, [budgets[i]], [9],
                           1, gamma=4)
        assert batched[i] == alone[0], i


def test_negative_control_a_shared_generator_couples_the_rows() -> None:
    target, draft = RandomContextLM(6, seed=11), RandomContextLM(6, seed=12)
    sampling = Sampling()
    prompts = [[1, 2, 3], [0, 1], [2, 2]]
    alone = [_run_batch(target, draft, [p], "block", {}, sampling, [10], [3], 1)[0]
             for p in prompts]
    fair = _run_batch(target, draft, prompts, "block", {}, sampling, [10] * 3, [3] * 3, 3)
    shared_gen = torch.Generator().manual_seed(3)
    shared = _run_batch(target, draft, prompts, "block", {}, sampling, [10] * 3, [3] * 3, 3,
                        random=RowRandom([shared_gen] * 3))
    assert fair == alone
    assert shared != alone  # the equality check above can fail


def test_ngram_drafter_rows_equal_single_requests() -> None:
    target = RandomContextLM(4, seed=2, sharpness=4.0)
    prompts = [[0, 1, 2, 0, 1], [3, 3, 3], [1, 2, 1, 2, 1, 2]]
    sampling = Sampling(temperature=0.7)
    out = batched_generate(
        as_batched(target), PerRowDrafter(lambda: NgramDrafter(4)), prompts,
        methods=[build_method("block") for _ in prompts], gamma=4, sampling=sampling,
        max_new_tokens=12, generators=_gens([1, 2, 3]), batch_size=2)
    for i, p in enumerate(prompts):
        want = speculative_generate(target, NgramDrafter(4), p, method=build_method("block"),
                                    gamma=4, sampling=sampling, max_new_tokens=12,
                                    generator=torch.Generator().manual_seed(i + 1))
        assert out.rows[i].tokens == want.tokens
        assert out.rows[i].stats.tau_histogram == want.stats.tau_histogram


def test_per_row_and_aggregate_statistics() -> None:
    target, draft = RandomContextLM(5, seed=1, eos_token_id=4), RandomContextLM(5, seed=2)
    sampling = Sampling()
    prompts = [[1, 2, 3], [0], [2, 2, 2, 2, 1], [3, 1]]
    out = batched_generate(
        BatchedTableLM(target), BatchedModelDrafter(BatchedTableLM(draft), sampling), prompts,
        methods=[build_method("multidraft", num_drafts=2) for _ in prompts], gamma=3,
        sampling=sampling, max_new_tokens=[9, 12, 6, 8], generators=_gens([1, 2, 3, 4]),
        batch_size=2)
    s = out.stats
    for i, (row, p) in enumerate(zip(out.rows, prompts, strict=True)):
        want = _run_single(target, draft, p, "multidraft", {"num_drafts": 2}, sampling,
                           [9, 12, 6, 8][i], i + 1)
        for key in ("iterations", "target_calls", "tokens_emitted", "accepted_total",
                    "tau_histogram", "target_tokens_scored", "extra_tokens_scored",
                    "stop_reason", "prefill_calls"):
            assert getattr(row.stats, key) == getattr(want.stats, key), (i, key)
        assert row.stats.nll_sum == pytest.approx(want.stats.nll_sum, abs=1e-9)
        assert row.stats.tokens_emitted == len(row.tokens)
    assert s.tokens_emitted == sum(len(r.tokens) for r in out.rows)
    assert s.row_iterations == sum(r.stats.iterations for r in out.rows)
    assert s.accepted_total == sum(r.stats.accepted_total for r in out.rows)
    assert s.target_calls == s.iterations < s.row_iterations
    assert 1 < s.mean_batch_rows <= 2
    assert s.block_efficiency == pytest.approx(s.tokens_emitted / s.row_iterations)
    assert s.tokens_per_second == pytest.approx(s.tokens_emitted / s.wall_time_s)
    assert s.target_positions_computed >= s.target_tokens_scored
    d = s.to_dict()
    assert d["tokens_per_second"] == s.tokens_per_second and "batch size 2" in s.summary()


# Exactness by enumeration of the batched engine itself.

class _Branch(Exception):
    def __init__(self, options: int) -> None:
        self.options = options


class ReplayRandom(RowRandom):
    """Rows in ``scripted`` take their random decisions from a replayed script: at the first
    decision beyond the script the run stops and reports how many options there were. The
    other rows sample with their own generators (re-seeded identically on every replay)."""

    def __init__(self, generators: list[torch.Generator], scripted: set[int], script: list[int],
                 lossy: float | None = None) -> None:
        super().__init__(generators)
        self.scripted, self.script, self.pos, self.weight = scripted, script, 0, 1.0
        self.lossy = lossy

    def _choose(self, options: list[tuple[Any, float]]) -> Any:
        options = [(v, w) for v, w in options if w > 0]
        if self.pos == len(self.script):
            raise _Branch(len(options))
        value, weight = options[self.script[self.pos]]
        self.pos += 1
        self.weight *= weight
        return value

    def sample(self, row: int, probs: Tensor) -> Tensor:  # probs [M, V]
        if row not in self.scripted:
            return super().sample(row, probs)
        m, v = probs.shape
        options = []
        for flat in range(v ** m):
            tokens = [(flat // v ** j) % v for j in range(m)]
            options.append((tokens, float(torch.prod(probs[torch.arange(m), tokens]))))
        return torch.tensor(self._choose(options), dtype=torch.int64)

    def verify(self, row: int, method: Method, target_probs: Tensor, draft: Draft) -> VerifyResult:
        if row not in self.scripted:
            return super().verify(row, method, target_probs, draft)
        p, q, x = target_probs, draft.probs.to(target_probs.dtype), draft.tokens
        if isinstance(method, GreedyBlockMethod):  # its verify, with the draw replaced
            q_next = p[:, -1] if draft.next_probs is None else draft.next_probs.to(p.dtype)
            q_ext = torch.cat([q, q_next[:, None]], dim=1)  # [1, γ+1, V]
            layers = modified_targets(p, q_ext, x, method.modifications)
            law = plan_law(greedy_block_plan(layers[-1], q, x))[0]  # [γ+1, V]
            t, y = self._choose([((t, y), float(law[t, y])) for t, y in law.nonzero().tolist()])
            method._mods = advance_modifications(method.modifications, layers, q_ext, x,
                                                 torch.tensor([t]), torch.tensor([y]))
            return VerifyResult(num_accepted=torch.tensor([t]), next_token=torch.tensor([y]))
        if method.name == "multidraft":
            law = multidraft_law(multidraft_plan(p[None], q[None], x[None]))[0]  # [M, γ+1, V]
        else:
            plan_fn = {"ar": token_plan, "token": token_plan, "block": block_plan}.get(method.name)
            if self.lossy is not None:
                plan = lossy_plan(p, q, x, epsilon=self.lossy, residual="opt")
            else:
                assert plan_fn is not None, method.name
                plan = plan_fn(p, q, x)
            law = plan_law(plan)  # [1, γ+1, V]
        options = [((m, t, y), float(law[m, t, y])) for m, t, y in law.nonzero().tolist()]
        m, t, y = self._choose(options)
        return VerifyResult(num_accepted=torch.tensor([t]), next_token=torch.tensor([y]),
                            extras={"branch": torch.tensor([m])})


def _enumerate(run: Callable[[ReplayRandom], list[list[int]]], make: Callable[[list[int]],
               ReplayRandom], rows: list[int]) -> dict[tuple, float]:
    """Law of the scripted rows' outputs (a tuple of token tuples) over every replay path."""
    law: dict[tuple, float] = {}
    stack: list[list[int]] = [[]]
    while stack:
        script = stack.pop()
        rnd = make(script)
        try:
            out = run(rnd)
        except _Branch as branch:
            stack.extend(script + [i] for i in range(branch.options))
            continue
        assert rnd.pos == len(script)
        key = tuple(tuple(out[r]) for r in rows)
        law[key] = law.get(key, 0.0) + rnd.weight
    return law


def _engine(target: TableLM, draft: TableLM, prompts: list[list[int]], name: str, opts: dict,
            gamma: int, budgets: list[int], batch_size: int, sampling: Sampling
            ) -> Callable[[ReplayRandom], list[list[int]]]:
    def run(rnd: ReplayRandom) -> list[list[int]]:
        return _run_batch(target, draft, prompts, name, opts, sampling, budgets,
                          [0] * len(prompts), batch_size, gamma=gamma, random=rnd)
    return run


@pytest.mark.parametrize("name, opts, gamma, sampling", [
    ("block", {}, 2, Sampling()),
    ("token", {}, 2, Sampling(temperature=0.8)),
    ("ar", {}, 0, Sampling()),
    ("multidraft", {"num_drafts": 2}, 1, Sampling()),
    ("greedy-block", {}, 2, Sampling()),
])
def test_batched_engine_row_law_equals_target_law(name: str, opts: dict, gamma: int,
                                                  sampling: Sampling) -> None:
    target = RandomContextLM(3, seed=21, eos_token_id=2)
    draft = RandomContextLM(3, seed=22)
    prompts = [[0, 1, 0], [1], [1, 0]]  # row 2 is admitted into the slot the first to end frees
    budgets = [3, 4, 3]
    run = _engine(target, draft, prompts, name, opts, gamma, budgets, 2, sampling)
    gens = [torch.Generator().manual_seed(s) for s in (31, 32, 33)]

    def make(script: list[int]) -> ReplayRandom:
        for g, s in zip(gens, (31, 32, 33), strict=True):
            g.manual_seed(s)
        return ReplayRandom(gens, {2}, script)

    got = _enumerate(run, make, [2])
    want = target_law(target, prompts[2], sampling, budgets[2])
    assert abs(sum(got.values()) - 1) < 1e-12
    assert max(abs(got.get((k,), 0.0) - v) for k, v in want.items()) < 1e-12
    assert set(got) == {(k,) for k in want}


def test_batched_engine_joint_law_of_two_rows_is_the_product() -> None:
    target = RandomContextLM(2, seed=41)
    draft = RandomContextLM(2, seed=42)
    prompts = [[0, 1, 1], [1]]
    sampling = Sampling()
    run = _engine(target, draft, prompts, "block", {}, 1, [2, 3], 2, sampling)
    got = _enumerate(run, lambda s: ReplayRandom(_gens([0, 0]), {0, 1}, s), [0, 1])
    a = target_law(target, prompts[0], sampling, 2)
    b = target_law(target, prompts[1], sampling, 3)
    assert abs(sum(got.values()) - 1) < 1e-12
    for ka, pa in a.items():
        for kb, pb in b.items():
            assert abs(got.get((ka, kb), 0.0) - pa * pb) < 1e-12


class _CrossedRows(BatchedTableLM):
    """A deliberately broken batched model: with several rows, row b is scored with row
    b+1's context (the kind of bug padding or row bookkeeping can introduce)."""

    def _extend(self, tokens: list[list[int]], k_max: int) -> Tensor:
        logits = super()._extend(tokens, k_max)  # [R, k, V]
        if logits.shape[0] > 1 and k_max == 1:
            return logits.roll(1, dims=0)
        return logits


def test_enumeration_negative_control_detects_crossed_rows() -> None:
    target = RandomContextLM(3, seed=21)
    draft = RandomContextLM(3, seed=22)
    prompts = [[0, 1, 0], [1]]
    sampling = Sampling()
    want = target_law(target, prompts[1], sampling, 3)
    for model, ok in [(BatchedTableLM(target), True), (_CrossedRows(target), False)]:
        run = _engine(model, draft, prompts, "ar", {}, 0, [3, 3], 2, sampling)  # type: ignore
        got = _enumerate(run, lambda s: ReplayRandom(_gens([0, 0]), {1}, s), [1])
        assert abs(sum(got.values()) - 1) < 1e-12
        tv = tv_distance({k[0]: v for k, v in got.items()}, want)
        assert (tv < 1e-12) if ok else (tv > 1e-3)


def test_enumeration_negative_control_detects_a_lossy_verifier() -> None:
    target = RandomContextLM(3, seed=21)
    draft = RandomContextLM(3, seed=22)
    prompts = [[0, 1, 0], [1]]
    run = _engine(target, draft, prompts, "token", {}, 2, [3, 3], 2, Sampling())
    got = _enumerate(run, lambda s: ReplayRandom(_gens([0, 0]), {1}, s, lossy=0.3), [1])
    want = target_law(target, prompts[1], Sampling(), 3)
    assert abs(sum(got.values()) - 1) < 1e-12
    assert tv_distance({k[0]: v for k, v in got.items()}, want) > 1e-3


# Errors, API and CLI.

def test_engine_input_errors() -> None:
    t = BatchedTableLM(RandomContextLM(4, seed=1, max_length=5))
    m = [build_method("ar"), build_method("ar")]
    kw: dict[str, Any] = {"gamma": 0, "sampling": Sampling(), "max_new_tokens": 3,
                          "generators": _gens([0, 0])}
    with pytest.raises(ValueError, match="empty"):
        batched_generate(t, None, [[1], []], methods=m, **kw)
    with pytest.raises(ValueError, match="own Method"):
        batched_generate(t, None, [[1], [2]], methods=[m[0], m[0]], **kw)
    with pytest.raises(ValueError, match="needs a drafter"):
        batched_generate(t, None, [[1], [2]], methods=m, **{**kw, "gamma": 2})
    with pytest.raises(ValueError, match="batch_size"):
        batched_generate(t, None, [[1], [2]], methods=m, batch_size=0, **kw)
    with pytest.raises(ValueError, match="Generator"):
        batched_generate(t, None, [[1], [2]], methods=m, **{**kw, "generators": _gens([0])})
    with pytest.raises(ContextTooLongError):
        batched_generate(t, None, [[1], [0, 1, 2, 3, 0]], methods=m, **kw)
    out = batched_generate(t, None, [[1, 2, 3], [2]], methods=m, **{**kw, "max_new_tokens": 9})
    assert [r.stats.stop_reason for r in out.rows] == ["context_window", "context_window"]
    assert [len(r.tokens) for r in out.rows] == [2, 4]


def test_api_generate_batch_matches_generate_per_prompt() -> None:
    prompts = ["ABC", "A", "BBBBD"]
    for verifier, opts in [("block", {}), ("multidraft", {"num_drafts": 2}), ("ar", {})]:
        res = verispec.generate_batch("toy:random:5:1", "toy:random:5:2", prompts,
                                      verifier=verifier, max_new_tokens=9, seeds=[5, 6, 7],
                                      batch_size=2, **opts)
        for p, s, r in zip(prompts, [5, 6, 7], res.results, strict=True):
            one = verispec.generate("toy:random:5:1", "toy:random:5:2", p, verifier=verifier,
                                    max_new_tokens=9, seed=s, **opts)
            assert (r.tokens, r.text) == (one.tokens, one.text), verifier
        assert res.stats.num_prompts == 3 and res.stats.tokens_emitted == 27
    with pytest.raises(ValueError, match="not supported in batched mode"):
        verispec.generate_batch("toy:random:5:1", "toy:random:5:2", prompts, verifier="mjsd")
    with pytest.raises(ValueError, match="seeds"):
        verispec.generate_batch("toy:random:5:1", "toy:random:5:2", prompts, seeds=[1])
    with pytest.raises(TypeError, match="list of prompts"):
        verispec.generate_batch("toy:random:5:1", "toy:random:5:2", "ABC")


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(list(argv), out=out, err=err), out.getvalue(), err.getvalue()


TOY = ["--target", "toy:random:5:1", "--draft", "toy:random:5:2"]


def test_cli_prompts_file_json_lines_in_input_order(tmp_path: Any) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('"ABC"\n{"prompt": "A", "seed": 3}\n\n{"prompt": [1, 2, 2], '
                    '"max_new_tokens": 4}\n')
    code, out, err = _cli("generate", "--prompts", str(path), *TOY, "--batch-size", "2",
                          "--max-new-tokens", "6", "--json", "--verifier", "token")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 3 and "whole batch" in err
    for line, (prompt, seed) in zip(lines, [("ABC", 0), ("A", 3), ("BCC", 0)], strict=True):
        code1, single, _ = _cli("generate", prompt, *TOY, "--json", "--verifier", "token",
                            "--seed", str(seed), "--max-new-tokens",
                            "4" if prompt == "BCC" else "6")
        assert code1 == 0
        one = json.loads(single)
        assert set(line) == set(one) and set(line["stats"]) == set(one["stats"])
        assert (line["tokens"], line["text"]) == (one["tokens"], one["text"])
    code, out, _ = _cli("generate", "--prompts", str(path), *TOY, "--max-new-tokens", "6")
    assert code == 0 and out.count("=== prompt") == 3 and "tok/s for the whole batch" in out


def test_cli_batch_errors(tmp_path: Any) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('"AB"\n{"text": "A"}\n')
    code, _, err = _cli("generate", "--prompts", str(bad), *TOY)
    assert code == 2 and "bad.jsonl:2" in err
    code, _, err = _cli("generate", "AB", "--prompts", str(bad), *TOY)
    assert code == 2 and "not both" in err
    code, _, err = _cli("generate", "AB", "--batch-size", "2", *TOY)
    assert code == 2 and "--batch-size needs --prompts" in err
    code, _, err = _cli("generate", *TOY)
    assert code == 2 and "give a prompt" in err


# The embedded real pair (integration: loads ~10 GB in float32).

@pytest.mark.integration
def test_greedy_batch_equals_single_requests_on_the_real_pair() -> None:
    from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
    from verispec.models.loading import load_model

    target = load_model(DEFAULT_TARGET, dtype="float32")
    draft = load_model(DEFAULT_DRAFT, dtype="float32")
    prompts = ["def fib(n):", "import numpy as np\n\n\ndef mean(xs):\n    \"\"\"",
               "# print hello"]
    for verifier, opts in [("block", {}), ("multidraft", {"num_drafts": 2})]:
        batch = verispec.generate_batch(target, draft, prompts, verifier=verifier, gamma=5,
                                        temperature=0, max_new_tokens=[20, 12, 16],
                                        batch_size=2, **opts)
        for p, n, r in zip(prompts, [20, 12, 16], batch.results, strict=True):
            one = verispec.generate(target, draft, p, verifier=verifier, gamma=5,
                                    temperature=0, max_new_tokens=n, **opts)
            assert r.tokens == one.tokens, (verifier, p, r.text, one.text)
        assert batch.stats.tokens_per_second > 0
