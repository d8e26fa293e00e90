"""The exact distribution audit (verispec.theory.audit, ``verispec audit``).

Every lossless method is audited on >= 50 seeds with varied toy pairs, sizes, temperatures,
EOS and prompts (exact enumeration, 1e-12); methods that are not lossless must be flagged;
user verifiers given as module:function are audited, and biased ones (negative controls)
are caught by the exact path and by the sampling path.
"""

from __future__ import annotations

import io
import json
import random
from collections import Counter
from typing import Any

import pytest
import torch

from verispec.checks import TOLERANCE
from verispec.cli import main
from verispec.drafters.beam import BeamDrafter
from verispec.engine.loop import generate_one
from verispec.engine.request import Request
from verispec.methods import METHODS, build_method
from verispec.sampling import Randomness, Sampling
from verispec.engine.protocols import SingleDraftMethod
from verispec.theory import audit as audit_module
from verispec.theory.audit import audit, audit_models, load_user_function, method_law
from verispec.theory.replay import engine_law, marginal
from verispec.verify import VerifyPlan, VerifyResult, draw, token_plan, token_verify

MODULE = __name__  # user verifiers below are referenced as f"{MODULE}:name"
SEEDS = range(50)


# ----- user verifiers (module:function) ---------------------------------------------------

def biased_plan(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> VerifyPlan:
    """Token verification that accepts 5% too often: a plan function, NOT lossless."""
    plan = token_plan(p, q, tokens)
    return VerifyPlan(torch.clamp(plan.accept_probs * 1.05, max=1.0), plan.residuals, plan.rule)


def tiny_bias_plan(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> VerifyPlan:
    """Token verification with acceptance lowered by a factor 1 - 1e-9 (bonus unchanged)."""
    plan = token_plan(p, q, tokens)
    return VerifyPlan(plan.accept_probs * (1 - 1e-9), plan.residuals, plan.rule)


def greedy_accept_verify(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor,
                         generator: torch.Generator) -> VerifyResult:
    """Accepts every draft token and draws the bonus: the draft's law leaks through. Biased."""
    b, g = tokens.shape
    plan = VerifyPlan(torch.ones((b, g), dtype=p.dtype), p, "first_reject")
    return draw(plan, generator)


def good_verify(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor,
                generator: torch.Generator) -> VerifyResult:
    """A correct verifier with the core signature (token verification)."""
    return token_verify(p, q, tokens, generator)


def wrong_arity(p: torch.Tensor, q: torch.Tensor) -> None:
    return None


def not_a_plan(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor) -> int:
    return 3


# ----- lossless methods across many seeds ---------------------------------------------------

LOSSLESS: list[tuple[str, dict[str, Any]]] = [
    ("ar", {}),
    ("token", {}),
    ("block", {}),
    ("greedy-block", {}),
    ("multidraft", {"num_drafts": 2}),
    ("lossy", {"epsilon": 0.0, "residual": "opt"}),
    ("pearl", {"verifier": "block"}),
    ("pearl", {"verifier": "token"}),
]


def _config(seed: int, method: str) -> dict[str, Any]:
    """A varied, small configuration for one seed."""
    rng = random.Random(1000 + seed)
    vocab, gamma, length = rng.choice([(2, 1, 3), (2, 2, 3), (2, 3, 4), (3, 1, 3), (3, 2, 3),
                                       (2, 2, 5), (3, 2, 2), (3, 3, 3)])
    if method in ("multidraft", "greedy-block") and vocab ** gamma > 9:
        gamma = 2 if vocab == 2 else 1
    temperature = rng.choice([1.0, 1.0, 0.7, 1.6, 0.0])
    cfg: dict[str, Any] = {
        "vocab": vocab, "gamma": max(gamma, 1) if method == "pearl" else gamma, "length": length,
        "seed": seed, "temperature": temperature, "model": rng.choice(["random", "markov", "sparse"]),
        "eos": rng.choice([None, None, vocab - 1]),
        "prompt": tuple(rng.randrange(vocab) for _ in range(rng.choice([1, 2]))),
    }
    if rng.random() < 0.2 and temperature > 0:
        cfg["top_k"] = vocab - 1
    return cfg


@pytest.mark.parametrize(("method", "options"), LOSSLESS, ids=lambda x: str(x))
def test_lossless_methods_are_exact_on_many_seeds(method: str, options: dict[str, Any]) -> None:
    for seed in SEEDS:
        cfg = _config(seed, method)
        r = audit(method, **cfg, **options)
        assert r.claims_lossless, method
        assert r.exact
        assert r.max_abs_error <= TOLERANCE, (method, cfg, r.max_abs_error)
        assert r.lossless and r.ok, (method, cfg)
        assert r.num_sequences >= 1


def test_draft_stop_is_lossless() -> None:
    for seed in range(20):
        for method in ("token", "block"):
            r = audit(method, vocab=3, gamma=3, length=4, seed=seed, draft_stop=0.5)
            assert r.lossless and r.ok and r.max_abs_error <= TOLERANCE
    with pytest.raises(ValueError, match="draft-stop"):
        audit("multidraft", draft_stop=0.5)


def test_bracketed_options_are_the_keyword_options() -> None:
    for spec, options in (("lossy[epsilon=0.2,residual=target]",
                           {"epsilon": 0.2, "residual": "target"}),
                          ("multidraft[num_drafts=3]", {"num_drafts": 3}),
                          ("pearl[verifier=token,post_verify=false]",
                           {"verifier": "token", "post_verify": False})):
        name = spec.split("[")[0]
        bracketed = audit(spec, vocab=2, gamma=2, length=3, seed=3, with_laws=True)
        keyword = audit(name, vocab=2, gamma=2, length=3, seed=3, with_laws=True, **options)
        assert bracketed.laws == keyword.laws and bracketed.max_abs_error == keyword.max_abs_error
        assert bracketed.claims_lossless == keyword.claims_lossless
    differs = audit("multidraft[num_drafts=3]", vocab=2, gamma=2, length=3, seed=3, with_laws=True)
    default = audit("multidraft", vocab=2, gamma=2, length=3, seed=3, with_laws=True)
    assert differs.expected_tokens_per_iteration != default.expected_tokens_per_iteration
    with pytest.raises(ValueError, match="given twice"):
        audit("lossy[epsilon=0.2]", epsilon=0.1)
    with pytest.raises(TypeError, match="does not take"):
        audit("token[epsilon=0.2]")


def test_audit_covers_every_registered_method() -> None:
    for name in METHODS:
        r = audit(name, vocab=2, gamma=2, length=3, seed=1)
        assert r.method == name
        assert r.claims_lossless == METHODS[name].lossless
        assert r.ok


# ----- methods that are not lossless are flagged -------------------------------------------

def test_greedy_block_without_modification_reproduces_the_counterexample() -> None:
    # Block Verification Accelerates Speculative Decoding (Sun et al.), App. C: with the A/B
    # models and γ = 2, Algorithm 4 alone emits BA as its first two tokens with
    # probability 1/3 instead of Mb(BA) = 2/9.
    r = audit("greedy-block-unmodified", model="ab-example", vocab=2, gamma=2, length=3,
              with_laws=True)
    assert not r.claims_lossless and not r.lossless and r.ok
    assert r.laws is not None
    ba_method = sum(v for k, v in r.laws["method"].items() if k.startswith("1,0"))
    ba_target = sum(v for k, v in r.laws["target"].items() if k.startswith("1,0"))
    assert ba_method == pytest.approx(1 / 3, abs=1e-12)
    assert ba_target == pytest.approx(2 / 9, abs=1e-12)
    fixed = audit("greedy-block", model="ab-example", vocab=2, gamma=2, length=3)
    assert fixed.lossless and fixed.max_abs_error <= TOLERANCE


@pytest.mark.parametrize(("method", "options"), [
    ("lossy", {"epsilon": 0.2}),
    ("lossy", {"epsilon": 0.0, "residual": "target"}),
    ("mjsd", {}),
    ("mjgd", {}),
])
def test_biased_methods_are_flagged_but_not_failures(method: str, options: dict[str, Any]) -> None:
    for seed in range(5):
        r = audit(method, vocab=3, gamma=2, length=3, seed=seed, **options)
        assert not r.claims_lossless
        assert not r.lossless and r.max_abs_error > 1e-6 and r.tv > 1e-6
        assert r.ok  # no lossless claim is refuted


def test_expected_tokens_per_iteration_on_the_paper_example() -> None:
    # γ = 2 on the A/B models: E[τ] = 10/9 (token), 11/9 (block), 12/9 (greedy block).
    for name, value in (("token", 10 / 9), ("block", 11 / 9), ("greedy-block", 12 / 9)):
        r = audit(name, model="ab-example", vocab=2, gamma=2, length=3)
        assert r.expected_tokens_per_iteration == pytest.approx(1 + value, abs=1e-12)
    r = audit("multidraft", model="ab-example", vocab=2, gamma=1, length=2, num_drafts=1)
    assert r.expected_tokens_per_iteration == pytest.approx(1 + 2 / 3, abs=1e-12)


# ----- user verifiers and negative controls ------------------------------------------------

def test_user_plan_function_is_audited_exactly() -> None:
    ok = audit("verispec.verify:token_plan", vocab=3, gamma=2, length=3, seed=4)
    assert ok.exact and ok.lossless and ok.ok and ok.claims_lossless
    for seed in range(10):
        bad = audit(f"{MODULE}:biased_plan", vocab=3, gamma=2, length=3, seed=seed)
        assert bad.exact and not bad.lossless and not bad.ok
        assert bad.max_abs_error > 1e-4


def test_exact_audit_detects_a_bias_of_1e_9() -> None:
    r = audit(f"{MODULE}:tiny_bias_plan", vocab=3, gamma=2, length=3, seed=2)
    assert TOLERANCE < r.max_abs_error < 1e-7
    assert not r.ok


def test_user_verifier_with_generator_is_audited_by_sampling() -> None:
    for seed in range(6):  # a correct verifier passes the statistical test (no false alarm)
        good = audit(f"{MODULE}:good_verify", vocab=2 + seed % 2, gamma=2, length=3, seed=seed,
                     samples=4000)
        assert not good.exact
        assert good.lossless and good.ok, (seed, good.z_max, good.z_critical)
        assert good.z_critical is not None and good.z_critical > 3
        assert good.max_abs_error < 0.05
    lib = audit("verispec.verify:token_verify", vocab=2, gamma=1, length=3, seed=2, samples=4000)
    assert lib.ok
    bad = audit(f"{MODULE}:greedy_accept_verify", vocab=2, gamma=2, length=3, seed=1, samples=4000)
    assert not bad.lossless and not bad.ok
    assert bad.z_max is not None and bad.z_critical is not None and bad.z_max > bad.z_critical


def test_user_verifier_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="module:function"):
        load_user_function("nocolon")
    with pytest.raises(ValueError, match="cannot import"):
        audit("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="no attribute"):
        audit(f"{MODULE}:missing_function")
    with pytest.raises(ValueError, match="required positional"):
        audit(f"{MODULE}:wrong_arity")
    with pytest.raises(ValueError, match="VerifyPlan"):
        audit(f"{MODULE}:not_a_plan")
    with pytest.raises(ValueError, match="unknown method"):
        audit("nope")
    with pytest.raises(ValueError, match="takes no method options"):
        audit(f"{MODULE}:biased_plan", epsilon=0.1)
    with pytest.raises(ValueError, match="vocabulary of 2"):
        audit_models("ab-example", 3, 0)
    with pytest.raises(ValueError, match="prompt"):
        audit("token", vocab=2, prompt=(5,))
    with pytest.raises(ValueError, match="too many to enumerate"):
        audit("multidraft", vocab=10, gamma=4, length=6, num_drafts=2)
    with pytest.raises(ValueError, match="too many to enumerate"):
        audit("multidraft[num_drafts=2]", vocab=10, gamma=4, length=6)
    target, draft = audit_models("random", 3, 0)
    with pytest.raises(ValueError, match="declares none"):  # a method outside the table
        method_law(SingleDraftMethod("custom", token_plan), target, draft, [0], gamma=2,
                   sampling=Sampling(), length=3)
    assert audit_module.TOLERANCE == TOLERANCE == 1e-12


# ----- the exact laws agree with the real engine ---------------------------------------------

def test_mjsd_law_matches_the_real_engine() -> None:
    """The audit's MJSD law (enumeration with the real beam search) vs the real engine: its
    exact law by replaying every random decision, and samples."""
    target, draft = audit_models("random", 3, 7)
    method = build_method("mjsd", num_beams=2, threshold=0.3)
    sampling = method.adjust_sampling(Sampling())
    r = audit("mjsd", vocab=3, gamma=2, length=3, seed=7, num_beams=2, threshold=0.3, with_laws=True)
    assert r.laws is not None
    law = {tuple(int(t) for t in k.split(",")): v for k, v in r.laws["method"].items()}

    def run(randoms: list[Randomness]) -> list[list[int]]:
        request = Request([0], method, sampling, 3, randoms[0], 2, BeamDrafter(draft, 2))
        return [generate_one(target, request).tokens]

    replayed = marginal(engine_law(run, rows=1), 0)
    assert max(abs(replayed.get(k, 0.0) - law.get(k, 0.0)) for k in set(law) | set(replayed)) \
        <= TOLERANCE
    n = 700
    counts: Counter[tuple[int, ...]] = Counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only slow the engine down
    try:
        for i in range(n):
            out = generate_one(target, Request([0], method, sampling, 3,
                                               Randomness(torch.Generator().manual_seed(i)), 2,
                                               BeamDrafter(draft, 2)))
            counts[tuple(out.tokens)] += 1
    finally:
        torch.set_num_threads(threads)
    assert set(counts) <= set(law)
    for seq, prob in law.items():  # every sequence within 5 binomial standard errors
        se = (prob * (1 - prob) / n) ** 0.5
        assert abs(counts[seq] / n - prob) <= 5 * se + 1e-9, (seq, counts[seq] / n, prob)


# ----- the command ----------------------------------------------------------------------------

def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(argv, out=out, err=err), out.getvalue(), err.getvalue()


def test_cli_audit_json_and_exit_status(tmp_path: Any) -> None:
    code, out, _ = _run(["audit", "--method", "block", "--vocab", "3", "--gamma", "2",
                         "--length", "3", "--json"])
    assert code == 0
    res = json.loads(out)
    for key in ("method", "vocab", "gamma", "length", "max_abs_error", "tv",
                "expected_tokens_per_iteration", "lossless"):
        assert key in res
    assert res["lossless"] is True and res["max_abs_error"] <= TOLERANCE
    code, out, err = _run(["audit", "--method", f"{MODULE}:biased_plan", "--json"])
    assert code == 1 and json.loads(out)["lossless"] is False and "claims to be lossless" in err
    code, out, _ = _run(["audit", "--method", "lossy", "--eps", "0.3", "--json"])
    assert code == 0 and json.loads(out)["lossless"] is False
    code, bracketed, _ = _run(["audit", "--method", "lossy[epsilon=0.3]", "--json"])
    assert code == 0 and json.loads(bracketed)["max_abs_error"] == json.loads(out)["max_abs_error"]
    png = tmp_path / "audit.png"
    code, out, _ = _run(["audit", "--method", "pearl", "--verifier", "token", "--seeds", "3",
                         "--json", "--plot", str(png)])
    res = json.loads(out)
    assert code == 0 and res["lossless"] and len(res["runs"]) == 3
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    code, _, err = _run(["audit", "--method", "nope:nothing"])
    assert code == 2 and "cannot import" in err
