"""The law checks. The bench's one-sample check: exact samples pass, a sampler at the wrong
temperature or a greedy-biased one is flagged. The two-sample test of the first-k-token law
(verispec.bench.lawtest): its level under the null, its power on a synthetic law, the biased
control's exact law, flagged at the default ratio to the power threshold, and a bias below
the power reported as such."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from verispec.api import load_pair, make_drafter
from verispec.bench.lawcheck import law_check, token_terms
from verispec.bench.lawsource import (
    FirstTokenBias,
    SharedPrefixLM,
    control_samples,
    first_token_laws,
    llamacpp_samples,
    method_samples,
)
from verispec.bench.lawstats import (
    ALPHA,
    NOVEL,
    cells_of,
    directions,
    empirical_law,
    permutation_test,
    power_threshold,
)
from verispec.bench.lawtest import LawTestConfig, reference_of, run_lawtest
from verispec.engine.exact import target_law, tv_distance
from verispec.engine.loop import Engine
from verispec.engine.request import Request
from verispec.models.toy import RandomContextLM
from verispec.sampling import Sampling
from verispec.theory.replay import engine_law, marginal


def _check(sample_temperature: float, score_temperature: float, n: int = 3000,
           seed: int = 0) -> object:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn((n, 50), generator=g, dtype=torch.float64) * 2.0  # [n, V] contexts
    probs = torch.softmax(logits / sample_temperature, dim=-1)
    tokens = torch.multinomial(probs, 1, generator=g)[:, 0].tolist()
    z, v, pits = token_terms(logits, tokens, score_temperature, g)
    return law_check(z, v, pits)


def test_exact_samples_pass() -> None:
    for seed in range(3):
        check = _check(1.0, 1.0, seed=seed)
        assert not check.flagged and abs(check.z) < 3.3 and check.ks_pvalue > 1e-3


def test_wrong_temperatures_are_flagged() -> None:
    cold = _check(0.8, 1.0)
    assert cold.flagged and cold.z < -3.3 and cold.excess_nll < 0
    hot = _check(1.25, 1.0)
    assert hot.flagged and hot.z > 3.3


def test_ks_catches_tokens_drawn_from_the_wrong_places() -> None:
    """Tokens from a permuted distribution (the same probabilities on other tokens): the
    probability-integral transform is far from uniform."""
    g = torch.Generator().manual_seed(5)
    n, v = 3000, 20
    logits = torch.randn((n, v), generator=g, dtype=torch.float64) * 2.0
    probs = torch.softmax(logits, dim=-1)
    shuffled = probs.flip(-1)  # same multiset of probabilities per row, other tokens
    tokens = torch.multinomial(shuffled, 1, generator=g)[:, 0].tolist()
    check = law_check(*token_terms(logits, tokens, 1.0, g))
    assert check.flagged and check.ks_pvalue < 1e-3


# --------------------------------------------------------------------------- two-sample test
# verispec.bench.lawtest: the first-k-token law of a method against a reference, a
# permutation test over prompts; its level, its power, the biased control.

TOY_TARGET, TOY_DRAFT = "toy:random:5:1", "toy:random:5:2"


def _zipf(m: int, s: float = 1.2) -> np.ndarray:
    p = 1.0 / np.arange(1, m + 1) ** s
    return p / p.sum()


def _draws(rng: np.random.Generator, p: np.ndarray, n: int) -> list[tuple[int, ...]]:
    return [(int(i),) for i in rng.choice(len(p), n, p=p)]


def test_cells_pool_rare_sequences() -> None:
    rare_a, rare_b = [f"r{i}" for i in range(7)], [f"s{i}" for i in range(7)]
    ids = ["a"] * 12 + ["b"] * 12 + rare_a + ["a"] * 10 + ["b"] * 6 + rare_b
    cells = cells_of(ids, 31)  # share 23/54: a (22) and b (18) are cells, the 14 rare pooled
    assert sorted(set(cells.tolist())) == [0, 1, 2]
    assert set(cells[24:31].tolist()) == set(cells[47:].tolist()) == {2}
    # a pool too small to stand alone is merged into the smallest kept cell (b)
    merged = cells_of(["a"] * 30 + ["b"] * 20 + ["z"] + ["a"] * 30 + ["b"] * 20, 51)
    assert sorted(set(merged.tolist())) == [0, 1] and merged[50] == 1


def test_permutation_test_has_its_level() -> None:
    """Both sides from one law: P(p < α) ≤ α, and p-values are roughly uniform."""
    rng = np.random.default_rng(0)
    laws = [_zipf(30), _zipf(8, 0.5), _zipf(60, 1.5)]
    pvalues = []
    for rep in range(300):
        samples = [(_draws(rng, p, 60), _draws(rng, p, 60)) for p in laws]
        pvalues.append(permutation_test(samples, permutations=199, seed=rep).pvalue)
    pv = np.array(pvalues)
    assert (pv < ALPHA).mean() <= 0.03  # 3 expected of 300 at α = 0.01
    assert (pv < 0.05).mean() <= 0.09
    assert 0.35 < (pv < 0.5).mean() < 0.65


def test_permutation_test_sees_a_shifted_law() -> None:
    rng = np.random.default_rng(1)
    p = _zipf(20)
    q = 0.7 * p + 0.3 * np.eye(20)[5]  # TV 0.3 · (1 − p₅)
    samples = [(_draws(rng, q, 200), _draws(rng, p, 200)) for _ in range(3)]
    res = permutation_test(samples, seed=0)
    assert res.flagged and res.pvalue == pytest.approx(1 / 1000)
    assert len(res.per_prompt) == 3 and all(c >= 2 for c in res.cells)


def test_power_threshold_on_a_synthetic_law() -> None:
    """A law of 25 sequences: the size is ≤ α, power rises with t, the reported threshold
    is the TV the simulation reaches, and a fresh simulation at it flags ~80%."""
    rng = np.random.default_rng(2)
    p = _zipf(25)
    laws = [empirical_law(_draws(rng, p, 4000)) for _ in range(2)]
    assert NOVEL not in laws[0].atoms  # no singletons among 4000 draws of 25 sequences
    dirs = [directions(law) for law in laws]
    assert set(dirs[0]) == {"confident"}
    (curve,) = power_threshold(laws, dirs, 150, 150, reps=120, permutations=199, seed=3)
    assert curve.null_rate <= 0.05
    top = max(float(law.probs.max()) for law in laws)
    assert curve.tv_per_t == pytest.approx(np.mean([1 - law.probs.max() for law in laws]))
    assert curve.t is not None and curve.tv == pytest.approx(curve.t * curve.tv_per_t)
    rates = dict(curve.points)
    assert rates[curve.t] >= 0.8 and min(rates.values()) < 0.8 and top < 1
    check = power_threshold(laws, [{"confident": d["confident"] * 0 + (
        (1 - curve.t) * law.probs + curve.t * d["confident"])} for law, d in
        zip(laws, dirs, strict=True)], 150, 150, reps=120, permutations=199, seed=99)
    assert 0.6 <= max(r for t, r in check[0].points if t == 1.0) <= 0.97


def test_directions_first_token_reweights_the_first_token() -> None:
    law = empirical_law([(0, 1)] * 30 + [(0, 2)] * 10 + [(1, 1)] * 40 + [(3, 3)])
    d = directions(law, {0: 2.0, 1: 0.5})
    assert set(d) == {"confident", "diffuse", "first-token"}
    r = d["first-token"]
    seen = {a: r[i] for i, a in enumerate(law.atoms)}
    assert seen[(0, 1)] / seen[(0, 2)] == pytest.approx(3.0)  # conditionals kept
    assert seen[(3, 3)] == 0.0  # a token without a ratio gets no mass
    assert r.sum() == pytest.approx(1.0)


# --------------------------------------------------------------------------- the biased control


def test_biased_control_law_is_exact() -> None:
    """Enumerated exactly: the control's first-3-token law is (1 − ε)·p₁ + ε·q₁ on the first
    token with the target's conditionals after it, so its TV is ε · TV(p₁, q₁)."""
    target, draft = RandomContextLM(3, seed=21), RandomContextLM(3, seed=22)
    prompt, eps, k = [0, 1], 0.3, 3
    method = FirstTokenBias(eps)

    def run(randoms: list) -> list[list[int]]:
        drafter = make_drafter(target, draft.spawn(), method)
        engine = Engine(target.spawn(), batch_size=1)
        reqs = [Request(list(prompt), method, Sampling(), k, r, 4, drafter) for r in randoms]
        return [o.tokens for o in engine.run(reqs)]

    got = marginal(engine_law(run, rows=1), 0)
    want = target_law(target, prompt, Sampling(), k)
    p1 = target.next_probs(tuple(prompt))
    q1 = draft.next_probs(tuple(prompt))
    first = (1 - eps) * p1 + eps * q1
    for seq, prob in got.items():
        cond = want[seq] / float(p1[seq[0]])  # the target's law of the rest given x₁
        assert prob == pytest.approx(float(first[seq[0]]) * cond, abs=1e-12)
    assert tv_distance(got, want) == pytest.approx(eps * float((p1 - q1).abs().sum() / 2),
                                                   abs=1e-12)


def _toy_pair() -> object:
    return load_pair(TOY_TARGET, TOY_DRAFT)


def test_shared_prefix_samples_match_plain_generation() -> None:
    """Prefilling a prompt once changes nothing: the samples are generate()'s per seed."""
    import verispec

    pair = _toy_pair()
    seeds = [3, 4, 5, 6]
    shared = method_samples(pair, "token", [0, 1, 2], seeds, tokens=3, temperature=1.0, gamma=2)
    for seed, got in zip(seeds, shared, strict=True):
        one = verispec.generate(TOY_TARGET, TOY_DRAFT, [0, 1, 2], method="token", gamma=2,
                                seed=seed, max_new_tokens=3)
        assert tuple(one.tokens) == got
    assert isinstance(SharedPrefixLM(pair.target).spawn(), SharedPrefixLM)
    with pytest.raises(ValueError, match="tokens >= 2"):
        control_samples(pair, 0.5, [0, 1], seeds, tokens=1, temperature=1.0, gamma=2)


def _toy_config(tmp_path: object, methods: list[str], **kw: object) -> LawTestConfig:
    suite = tmp_path / "toy.jsonl"  # type: ignore[operator]
    suite.write_text('{"prompt": "ABCA"}\n{"prompt": "BDDE"}\n{"prompt": "EAB"}\n')
    base: dict = {"target": TOY_TARGET, "draft": TOY_DRAFT, "suite": str(suite), "prompts": 3,
                  "samples": 120, "tokens": 3, "gamma": 2, "power_reps": 40, "permutations": 199}
    return LawTestConfig(methods=methods, **{**base, **kw})


def test_exact_methods_pass_and_the_control_is_flagged(tmp_path: object) -> None:
    report = run_lawtest(_toy_config(tmp_path, ["ar", "token", "block", "biased-control"]),
                         pair=_toy_pair())
    rows = {c["method"]: c for c in report["comparisons"]}
    assert [rows[m]["flagged"] for m in ("ar", "token", "block")] == [False] * 3
    control = report["control"]
    threshold = report["power"]["ar"]["threshold_tv"]
    assert control["tv"] <= 2 * threshold and control["epsilon"] <= 1
    assert rows["biased-control"]["flagged"] and rows["biased-control"]["known_tv"] == \
        pytest.approx(control["tv"])
    pair = _toy_pair()
    for p, tv in zip(report["prompts"], control["tv_per_prompt"], strict=True):
        p1, q1 = first_token_laws(pair, p["ids"], 1.0)
        assert tv == pytest.approx(control["epsilon"] * float((p1 - q1).abs().sum() / 2))


def test_a_bias_below_the_power_is_reported_as_such(tmp_path: object) -> None:
    report = run_lawtest(_toy_config(tmp_path, ["biased-control"], control_epsilon=0.02),
                         pair=_toy_pair())
    (row,) = report["comparisons"]
    assert row["known_tv"] < report["power"]["ar"]["threshold_tv"]
    assert not row["flagged"] and "below the power threshold" in row["verdict"]


def test_exact_sampler_flags_at_about_alpha_over_seeds() -> None:
    """token against ar, 12 independent checks (fresh seeds): flagged about α of the time."""
    pair = _toy_pair()
    prompts, n = [[0, 1, 2, 0], [1, 3, 3, 4]], 60
    pvalues = []
    for rep in range(12):
        samples = [(method_samples(pair, "token", p, range(2 * rep * n, (2 * rep + 1) * n),
                                   tokens=3, temperature=1.0, gamma=2),
                    method_samples(pair, "ar", p, range((2 * rep + 1) * n, (2 * rep + 2) * n),
                                   tokens=3, temperature=1.0, gamma=2)) for p in prompts]
        pvalues.append(permutation_test(samples, permutations=199, seed=rep).pvalue)
    assert sum(p < ALPHA for p in pvalues) <= 1
    assert 0.2 < float(np.mean(pvalues)) < 0.8


def test_llamacpp_spec_is_compared_with_llamacpp_ar(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peers' code path (``each``): one run_llamacpp call per sample, cut at k tokens
    (``shared``, one llama-server, is tested in test_llamacpp_server)."""
    from verispec.bench import llamacpp
    from verispec.bench.peers import PeerResult

    calls: list[dict] = []

    def fake(name: str, prompt: list[int], **kw: object) -> PeerResult:
        calls.append({"name": name, **kw})
        return PeerResult(tokens=[int(kw["seed"]) % 5, 1, 2, 3, 4], seconds=0.0)  # type: ignore[call-overload]

    monkeypatch.setattr(llamacpp, "run_llamacpp", fake)
    out = llamacpp_samples("llamacpp-spec", [0, 1], [7, 8], tokens=3, temperature=1.0,
                           gamma=4, target_gguf="t.gguf", draft_gguf="d.gguf", eos=[0],
                           prefill="each")
    assert out == [(2, 1, 2), (3, 1, 2)]
    assert [c["seed"] for c in calls] == [7, 8] and calls[0]["gamma"] == 4
    assert calls[0]["draft_gguf"] == "d.gguf" and calls[0]["max_new_tokens"] == 3
    assert reference_of("llamacpp-spec") == "llamacpp-ar" and reference_of("token") == "ar"
    assert reference_of("llamacpp-ar") == "ar"


def test_llamacpp_spec_samples_through_the_fake_binary(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """llamacpp-spec (``each``) samples through run_llamacpp and the fake
    llama-speculative-simple of the llama.cpp tests (no library, no GGUF): the k-token
    prefix of its output per seed."""
    fake = pytest.importorskip("test_llamacpp_spec")
    for name in ("t.gguf", "d.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    monkeypatch.setattr(fake.L, "_llama_cpp", lambda: None)
    monkeypatch.setattr(fake.LIB, "_vocab", lambda path: fake.FakeVocab())
    monkeypatch.setattr(fake.SPEC, "_eog_checker", lambda vocab: lambda t: t in fake.EOG)
    rounds = [([*b"retu"], 3, ord("r")), ([*b"n x!"], 2, 151643)]
    binary, log = tmp_path / "llama-speculative-simple", tmp_path / "argv.txt"
    binary.write_text(fake.FAKE_BINARY.format(
        python=sys.executable, log=str(log), text=b"retrn ", rc=0,
        stderr=fake._stderr(3, 7, 8, 5, enc=0.5, dec=2.0, gamma=4, rounds=rounds)))
    binary.chmod(0o755)
    monkeypatch.setenv(fake.SPEC.BINARY_ENV, str(binary))
    out = llamacpp_samples("llamacpp-spec", list(b"x ="), [11, 12], tokens=3, temperature=1.0,
                           gamma=4, target_gguf=tmp_path / "t.gguf",
                           draft_gguf=tmp_path / "d.gguf", eos=[151645], prefill="each")
    assert out == [tuple(b"ret")] * 2
    argv = log.read_text().splitlines()
    assert argv[argv.index("--seed") + 1] == "12" and argv[argv.index("--temp") + 1] == "1.0"
