"""The engine loop (Algorithm 3): greedy equivalence, the temperature-0 fast path,
reproducibility, clamping at EOS / budget / context window, draft-cache consistency,
continuous batching and the statistics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

import pytest
import torch

import verispec
from verispec.drafters.model import ModelDrafter
from verispec.engine.loop import Engine, PhaseClock, generate_one
from verispec.engine.protocols import SingleDraftMethod, VerifyBatch
from verispec.engine.request import GenerationOutput, Request
from verispec.models.base import CausalLM
from verispec.models.hf import HFCausalLM
from verispec.models.toy import MarkovLM, RandomContextLM, TableLM
from verispec.sampling import Randomness, Sampling
from verispec.verify import VerifyResult, block_plan, token_plan

PLANS = {"token": token_plan, "block": block_plan}


class Recorder(SingleDraftMethod):
    """A lossless method that also records, per verify call, the rows it verified and per
    row (γ of the draft, τ, draft tokens, Y)."""

    def __init__(self, name: str, matches_at_greedy: bool = True) -> None:
        super().__init__(name, PLANS[name], matches_at_greedy=matches_at_greedy)
        self.trace: list[tuple[int, int, list[int], int]] = []
        self.calls: list[int] = []

    def verify(self, batch: VerifyBatch) -> VerifyResult:
        result = super().verify(batch)
        self.calls.append(int(batch.draft_tokens.shape[0]))
        for b in range(batch.draft_tokens.shape[0]):
            g = int(batch.lengths[b])
            self.trace.append((g, int(result.num_accepted[b]), batch.draft_tokens[b, 0, :g].tolist(),
                               int(result.next_token[b])))
        return result


def _run(target: CausalLM, draft: CausalLM, prompt: Sequence[int], *, method: Recorder,
         gamma: int, max_new_tokens: int, seed: int, sampling: Sampling | None = None,
         on_tokens: Callable[[list[int]], None] | None = None) -> GenerationOutput:
    request = Request(list(prompt), method, sampling or Sampling(), max_new_tokens,
                      Randomness(torch.Generator().manual_seed(seed)), gamma,
                      ModelDrafter(draft), on_tokens)
    return generate_one(target, request)


# --------------------------------------------------------------------------------------
# Greedy: speculative output is token-for-token the autoregressive greedy output.
# --------------------------------------------------------------------------------------

PROMPT = [5, 17, 3, 42, 8, 8, 30]


@pytest.mark.parametrize("drafter, draft_kind", [
    ("model", "close"), ("model", "other"), ("ngram", None)])
@pytest.mark.parametrize("method", ["token", "block", "multidraft[num_drafts=3]", "greedy-block"])
def test_greedy_hf_matches_autoregressive(method: str, drafter: str, draft_kind: str | None,
                                          tiny: Callable[[str], HFCausalLM]) -> None:
    draft = tiny(draft_kind) if draft_kind else None
    if drafter == "ngram" and method.startswith(("multidraft", "greedy")):  # refused
        name = method.split("[")[0]
        with pytest.raises(ValueError, match=f"{name} cannot use the n-gram drafter"):
            verispec.generate(tiny("target"), draft, PROMPT, method=method, gamma=4,
                              temperature=0, max_new_tokens=40, drafter=drafter, seed=3)
        return
    ar = verispec.generate(tiny("target"), None, PROMPT, method="ar", temperature=0,
                           max_new_tokens=40)
    assert len(ar.tokens) == 40 and ar.stats.iterations == 40
    spec = verispec.generate(tiny("target"), draft, PROMPT, method=method, gamma=4,
                             temperature=0, max_new_tokens=40, drafter=drafter, seed=3)
    assert spec.tokens == ar.tokens
    s = spec.stats
    assert s.drafted_total > 0
    if draft_kind != "other":  # a close draft / repetitive text: drafts really get accepted
        assert s.accepted_total > 0 and s.target_calls < 40


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("model_cls", [RandomContextLM, MarkovLM])
def test_greedy_toy_matches_argmax_chain(method: str, model_cls: type) -> None:
    if model_cls is MarkovLM:
        target, draft = MarkovLM.random(5, 1), MarkovLM.random(5, 2)
    else:
        target, draft = RandomContextLM(5, 1), RandomContextLM(5, 2)
    prompt, n = [0, 1], 12
    chain: list[int] = []
    for _ in range(n):  # independent expectation: argmax of the exact table
        chain.append(int(target.next_probs(tuple(prompt + chain)).argmax()))
    for drafter in ("model", "ngram"):
        out = verispec.generate(target, draft, prompt, method=method, gamma=3,
                                temperature=0, max_new_tokens=n, drafter=drafter)
        assert out.tokens == chain, drafter


@pytest.mark.parametrize("method", ["token", "block"])
def test_greedy_fast_path_equals_verifying_one_hot_distributions(
        method: str, tiny: Callable[[str], HFCausalLM]) -> None:
    """At temperature 0 the engine compares draft tokens with the target's argmax instead of
    building one-hot p and q; the output and every statistic are the same as verifying
    the one-hot distributions."""
    outs = []
    for fast in (True, False):
        rec = Recorder(method, matches_at_greedy=fast)
        outs.append((_run(tiny("target"), tiny("close"), PROMPT, method=rec, gamma=4,
                          max_new_tokens=30, seed=0, sampling=Sampling(temperature=0)), rec))
    (fast_out, fast_rec), (slow_out, slow_rec) = outs
    assert fast_out.tokens == slow_out.tokens
    assert fast_rec.calls == [] and len(slow_rec.calls) == slow_out.stats.iterations
    for key in ("iterations", "accepted_total", "tau_histogram", "target_tokens_scored"):
        assert getattr(fast_out.stats, key) == getattr(slow_out.stats, key), key
    assert fast_out.stats.nll_sum == pytest.approx(slow_out.stats.nll_sum, rel=1e-6)


# --------------------------------------------------------------------------------------
# Reproducibility.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["token", "block"])
def test_seeded_runs_are_reproducible_toy(method: str) -> None:
    def run(seed: int) -> list[int]:
        return verispec.generate(RandomContextLM(6, 3), RandomContextLM(6, 4), [1, 2],
                                 method=method, gamma=3, seed=seed, max_new_tokens=20).tokens

    assert run(7) == run(7)
    assert len({tuple(run(s)) for s in range(5)}) > 1


@pytest.mark.parametrize("method", ["token", "block", "ar"])
def test_seeded_runs_are_reproducible_hf(method: str, tiny: Callable[[str], HFCausalLM]) -> None:
    def run(seed: int) -> list[int]:
        return verispec.generate(tiny("target"), tiny("close"), PROMPT, method=method,
                                 gamma=3, seed=seed, max_new_tokens=16).tokens

    first = run(11)
    assert run(11) == first
    assert run(12) != first and run(13) != first


# --------------------------------------------------------------------------------------
# Clamping: EOS, budget, context window.
# --------------------------------------------------------------------------------------

def _eos_pair(identical: bool) -> tuple[TableLM, TableLM]:
    target = RandomContextLM(4, seed=8, eos_token_id=3)
    draft = RandomContextLM(4, seed=8 if identical else 9)
    return target, draft


@pytest.mark.parametrize("method", ["token", "block"])
def test_eos_and_budget_clamp_inside_the_block(method: str) -> None:
    eos, clamped_inside = 3, 0
    for seed in range(150):
        target, draft = _eos_pair(identical=seed % 2 == 0)
        budget = [1, 2, 5, 9, 14][seed % 5]
        rec = Recorder(method)
        chunks: list[list[int]] = []
        out = _run(target, draft, [0, 1], method=rec, gamma=4, max_new_tokens=budget,
                   seed=seed, on_tokens=chunks.append)
        toks = out.tokens
        assert 1 <= len(toks) <= budget
        assert eos not in toks[:-1], "emitted past EOS"
        if toks[-1] == eos:
            assert out.stats.stop_reason == "eos"
        else:
            assert len(toks) == budget and out.stats.stop_reason == "max_new_tokens"
        assert [t for c in chunks for t in c] == toks and len(chunks) == len(rec.trace)
        emitted = 0
        for (g, tau, xs, y), new in zip(rec.trace, chunks, strict=True):
            assert g + 1 <= budget - emitted  # γ is cut so the block fits the budget
            block = xs[:tau] + [y]
            cut = block.index(eos) + 1 if eos in block else len(block)
            assert new == block[:cut]  # the emitted chunk is the block cut after its EOS
            clamped_inside += cut < len(block)
            emitted += len(new)
    assert clamped_inside >= 5  # EOS really was met inside accepted blocks


def test_context_window_is_never_exceeded() -> None:
    target = RandomContextLM(4, seed=2, max_length=12)
    draft = RandomContextLM(4, seed=3, max_length=12)
    prompt = [0, 1, 2, 3, 0]
    out = _run(target, draft, prompt, method=Recorder("block"), gamma=4, max_new_tokens=50,
               seed=0)
    assert len(prompt) + len(out.tokens) == 12
    assert out.stats.stop_reason == "context_window"


# --------------------------------------------------------------------------------------
# Draft cache consistency.
# --------------------------------------------------------------------------------------

def _draft_cache_checker(draft: CausalLM, prompt: list[int], emitted: list[int]
                         ) -> Callable[[list[int]], None]:
    def check(new: list[int]) -> None:
        emitted.extend(new)
        ctx = prompt + emitted
        n = draft.length
        assert len(ctx) - 2 <= n <= len(ctx) - 1, (n, len(ctx))
        if isinstance(draft, TableLM):
            assert draft._rows[0] == ctx[:n]  # the cached tokens are a prefix of the context
        else:  # HF: the cache must give the same logits as a fresh prefill of ctx[:n + 1]
            got = draft.extend([ctx[n : n + 1]], num_logits=1)
            fresh = draft.spawn()
            fresh.add_rows([ctx[:n]])
            want = fresh.extend([ctx[n : n + 1]], num_logits=1)
            draft.rollback(n)
            assert torch.allclose(got, want, atol=1e-5, rtol=0)

    return check


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("backend", ["toy", "hf"])
def test_identical_draft_accepts_everything_and_cache_stays_consistent(
    method: str, backend: str, tiny: Callable[[str], HFCausalLM]
) -> None:
    if backend == "toy":
        target, draft = RandomContextLM(5, seed=4), RandomContextLM(5, seed=4)
        prompt = [1, 2, 3]
    else:
        target, draft = tiny("target"), tiny("target")  # same weights, separate caches
        prompt = list(PROMPT)
    rec, emitted = Recorder(method), []
    gamma, budget = 3, 22
    out = _run(target, draft, prompt, method=rec, gamma=gamma, max_new_tokens=budget,
               seed=1, on_tokens=_draft_cache_checker(draft, prompt, emitted))
    assert emitted == out.tokens and len(out.tokens) == budget
    assert all(tau == g for g, tau, _, _ in rec.trace)  # p = q: τ = γ every iteration
    full = budget // (gamma + 1)
    assert out.stats.tau_histogram[gamma] == full and out.stats.iterations == full + 1
    # The last iteration's γ shrinks to fit the budget (22 = 5·4 + 2).
    assert rec.trace[-1][0] == budget - full * (gamma + 1) - 1


@pytest.mark.parametrize("method", ["token", "block"])
def test_draft_cache_consistent_under_rejections(method: str) -> None:
    target, draft = RandomContextLM(5, seed=4), RandomContextLM(5, seed=5)
    rec, emitted = Recorder(method), []
    _run(target, draft, [4], method=rec, gamma=4, max_new_tokens=40, seed=2,
         on_tokens=_draft_cache_checker(draft, [4], emitted))
    taus = Counter(tau for _, tau, _, _ in rec.trace)
    assert taus[0] > 0 and len(taus) > 2  # rejections at several positions happened


# --------------------------------------------------------------------------------------
# Batches: one verify call per iteration, rows joining and leaving, cancelling.
# --------------------------------------------------------------------------------------

def _requests(method: Recorder, drafter: ModelDrafter, prompts: list[list[int]],
              budgets: list[int], seeds: list[int], gamma: int = 3) -> list[Request]:
    return [Request(p, method, Sampling(), n, Randomness(torch.Generator().manual_seed(s)),
                    gamma, drafter) for p, n, s in zip(prompts, budgets, seeds, strict=True)]


def test_every_row_of_an_iteration_is_verified_in_one_call() -> None:
    target, draft = RandomContextLM(5, seed=1), RandomContextLM(5, seed=2)
    rec = Recorder("block")
    engine = Engine(target, batch_size=3)
    prompts, budgets = [[0], [1, 2], [3, 4, 0]], [9, 4, 6]  # ragged: γ is cut per row
    outs = engine.run(_requests(rec, ModelDrafter(draft), prompts, budgets, [1, 2, 3]))
    assert len(rec.calls) == engine.passes  # one verify call per target pass
    assert rec.calls[0] == 3 and sum(rec.calls) == sum(o.stats.iterations for o in outs)
    assert len({g for g, _, _, _ in rec.trace}) > 1  # ragged draft lengths in one call
    for p, n, s, out in zip(prompts, budgets, [1, 2, 3], outs, strict=True):
        alone = _run(target, draft, p, method=Recorder("block"), gamma=3, max_new_tokens=n,
                     seed=s)
        assert out.tokens == alone.tokens  # a row's output does not depend on its batch


def test_rows_join_while_others_decode_and_cancel_frees_a_row() -> None:
    target, draft = RandomContextLM(5, seed=1), RandomContextLM(5, seed=2)
    rec, drafter = Recorder("token"), ModelDrafter(draft)
    engine = Engine(target, batch_size=2)
    first, second, third = _requests(rec, drafter, [[0], [1], [2, 3]], [30, 30, 5], [1, 2, 3])
    rows = [engine.submit(first), engine.submit(second)]
    engine.step()
    engine.step()
    late = engine.submit(third)  # waits: both slots are taken
    engine.step()
    assert len(engine.active) == 2 and late.emitted == []
    engine.cancel(rows[0])
    kept = len(rows[0].emitted)
    finished = engine.step()  # the cancelled row leaves first; the waiting one takes its slot
    assert rows[0] in finished and rows[0].stats.stop_reason == "cancelled"
    assert len(rows[0].emitted) == kept and rows[0] not in engine.active
    assert late in engine.active and late.emitted
    assert target.rows == len(engine.active) == 2  # the cancelled row's cache row was freed
    while not engine.idle:
        engine.step()
    assert late.stats.stop_reason in ("max_new_tokens", "eos") and len(late.emitted) <= 5
    alone = _run(target, draft, [2, 3], method=Recorder("token"), gamma=3, max_new_tokens=5,
                 seed=3)
    assert late.emitted == alone.tokens


def test_phase_clock_synchronises_only_when_profiling() -> None:
    cpu = PhaseClock(torch.device("cpu"), profile=False)
    assert cpu.enabled and not cpu.sync
    gpu = PhaseClock(torch.device("cuda"), profile=False)
    assert not gpu.enabled and not gpu.sync  # no synchronisation per phase
    assert PhaseClock(torch.device("cuda"), profile=True).sync


# --------------------------------------------------------------------------------------
# Statistics.
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("prompt", [[2], [2, 0, 1]])
def test_stats_are_consistent_with_the_trace(method: str, prompt: list[int]) -> None:
    target, draft = MarkovLM.random(4, 10), MarkovLM.random(4, 11)
    rec = Recorder(method)
    out = _run(target, draft, prompt, method=rec, gamma=3, max_new_tokens=30, seed=4)
    s, trace = out.stats, rec.trace
    gs, taus = [g for g, _, _, _ in trace], [t for _, t, _, _ in trace]
    assert s.iterations == len(trace) == s.target_calls
    assert s.tokens_emitted == len(out.tokens) == 30
    assert s.block_efficiency == pytest.approx(30 / s.target_calls, abs=1e-12)
    assert sum(s.tau_histogram) == s.iterations
    assert s.tau_histogram == [taus.count(t) for t in range(max(taus) + 1)]
    assert s.accepted_total == sum(taus) and s.drafted_total == sum(gs)
    assert s.mean_accepted == pytest.approx(sum(taus) / len(taus), abs=1e-12)
    for i, rate in enumerate(s.acceptance_by_position):
        drafted = sum(g > i for g in gs)
        assert rate == pytest.approx(sum(t > i for t in taus) / drafted, abs=1e-12)
    assert len(s.acceptance_by_position) == max(gs)
    assert s.prefill_calls == (1 if len(prompt) > 1 else 0)
    assert s.target_tokens_scored == sum(g + 1 for g in gs)  # one pending token + the block
    assert s.draft_calls == sum(gs) + s.prefill_calls  # one draft forward per drafted token
    assert s.method == method and s.lossless and str(s.gamma) == "3"
    d = s.to_dict()
    assert d["block_efficiency"] == s.block_efficiency and d["iterations"] == s.iterations
    assert "block efficiency" in s.summary()


def test_ar_stats() -> None:
    out = verispec.generate(RandomContextLM(5, 1), None, [0, 1], method="ar",
                            max_new_tokens=9, seed=0)
    s = out.stats
    assert len(out.tokens) == 9 and s.iterations == s.target_calls == 9
    assert s.block_efficiency == 1.0 and s.accepted_total == 0 and s.tau_histogram == [9]
    assert s.draft_calls == 0 and s.drafted_total == 0
