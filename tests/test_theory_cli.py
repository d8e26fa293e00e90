"""``verispec theory``: the papers' numbers, each asserted against its closed form or the
paper's stated value, and every figure written as a PNG."""

from __future__ import annotations

import io
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from verispec.cli import main
from verispec.sampling import Sampling
from verispec.theory.exact import warped
from verispec.theory.markov import (
    NonStationaryMarkovLM,
    expected_rejections,
    random_chain_pair,
    rejection_limit,
    simulate_rejections,
)
from verispec.theory.papers import batch_curves, ot_bound, pareto_points, toy_example
from verispec.theory.speedup import (
    draft_length_table,
    pearl_expected_tokens,
    pearl_phase_simulation,
    pearl_speedup,
    predict,
    sd_expected_tokens,
    sd_optimal_gamma,
    sd_speedup,
)
from verispec.verify.multidraft import multidraft_law, multidraft_plan

PNG = b"\x89PNG\r\n\x1a\n"


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    return main(argv, out=out, err=err), out.getvalue(), err.getvalue()


def _json(argv: list[str], code: int = 0) -> dict[str, Any]:
    status, out, err = _run(argv)
    assert status == code, err
    return json.loads(out)  # type: ignore[no-any-return]


# ----- block verification toy example --------------------------------------------------------

def test_toy_example_reproduces_10_11_12_ninths(tmp_path: Path) -> None:
    png = tmp_path / "ccdf.png"
    res = _json(["theory", "toy-example", "--gamma", "2", "--json", "--plot", str(png)])
    assert res["token"] == pytest.approx(10 / 9, abs=1e-12)
    assert res["block"] == pytest.approx(11 / 9, abs=1e-12)
    assert res["optimal"] == pytest.approx(12 / 9, abs=1e-12)
    assert res["paper_fraction"] == {"token": "10/9", "block": "11/9", "optimal": "12/9"}
    assert all(res["checks"].values())
    assert png.read_bytes()[:8] == PNG
    cc = res["ccdf"]
    assert cc["gamma"] == 10 and len(cc["token"]) == 11
    for x, value in enumerate(cc["token"]):  # token verification: P(τ ≥ x) = (2/3)^x
        assert value == pytest.approx((2 / 3) ** x, abs=1e-12)
    assert all(b >= t - 1e-12 for b, t in zip(cc["block"], cc["token"], strict=True))
    assert cc["block"][-1] > 5 * cc["token"][-1]  # Figure 3: block's tail is far heavier


def test_block_ccdf_for_gamma_2_by_hand() -> None:
    # Section 2: accept AB, BB fully, BA's B always and A w.p. 1/2, AA w.p. 1/4:
    # P(τ = 2) = 2/9 + 1/9 + 1/9 + 1/9 = 5/9 and E[τ] = 11/9, so P(τ ≥ 1) = 6/9.
    res = toy_example(2, 2)
    assert res["ccdf"]["block"] == pytest.approx([1.0, 6 / 9, 5 / 9], abs=1e-12)
    with pytest.raises(ValueError, match="gamma"):
        toy_example(0)


# ----- Lemma 10 ---------------------------------------------------------------------------------

def test_ot_bound_orders_token_block_bound() -> None:
    for seed in range(12):
        for model, vocab, gamma, temp in (("random", 3, 3, 1.0), ("markov", 2, 4, 0.8),
                                          ("sparse", 3, 2, 1.0)):
            r = ot_bound(model=model, vocab=vocab, gamma=gamma, seed=seed, temperature=temp)
            assert r["token"] <= r["block"] + 1e-12 <= r["bound"] + 2e-12
            assert r["greedy_block"] == pytest.approx(r["bound"], abs=1e-12)  # Lemma 9
    ab = ot_bound(model="ab-example", vocab=2, gamma=2)
    assert ab["bound"] == pytest.approx(12 / 9, abs=1e-12)


def test_cli_ot_bound(tmp_path: Path) -> None:
    png = tmp_path / "ot.png"
    res = _json(["theory", "ot-bound", "--vocab", "3", "--gamma", "2", "--seed", "3", "--json",
                 "--plot", str(png)])
    assert res["checks"] == {"token_le_block": True, "block_le_bound": True, "greedy_attains_bound": True}
    assert png.read_bytes()[:8] == PNG


# ----- expected rejections (Theorems 1 and 3) ----------------------------------------------------

def _expected_rejections_by_engine_law(target: NonStationaryMarkovLM, draft: NonStationaryMarkovLM,
                                       m: int) -> float:
    """E[N_rej] by exact enumeration of the engine's multi-draft iterations (γ = T)."""
    s = Sampling()
    p, q = warped(target, s), warped(draft, s)
    v, t = target.vocab_size, target.horizon

    def walk(ctx: tuple[int, ...], room: int) -> float:
        g = room - 1
        if g <= 0:
            return 0.0
        blocks = list(itertools.product(range(v), repeat=g))
        total = 0.0
        for combo in itertools.product(blocks, repeat=m):
            w = math.prod(float(q(ctx + b[:i])[b[i]]) for b in combo for i in range(g))
            p_blk = torch.stack([torch.stack([p(ctx + b[:i]) for i in range(g + 1)]) for b in combo])
            q_blk = torch.stack([torch.stack([q(ctx + b[:i]) for i in range(g)]) for b in combo])
            tok = torch.tensor(combo, dtype=torch.int64)
            law = multidraft_law(multidraft_plan(p_blk[None], q_blk[None], tok[None]))[0]
            for j, tau, y in (law > 0).nonzero().tolist():
                new = combo[j][:tau] + (y,)
                total += w * float(law[j, tau, y]) * ((tau < g) + walk(ctx + new, room - len(new)))
        return total

    return sum(walk((x0,), t + 1) for x0 in range(v)) / v


def test_theorem1_exact_sum_of_tv() -> None:
    target, draft = random_chain_pair(states=2, horizon=4, seed=3)
    exact, per_pos = expected_rejections(target, draft, 1)
    # Independent check: E[TV at position n] = Σ_{x_{<n}} p(x_{<n}) TV(p_n, q_n).
    v, ref = 2, 0.0
    for n in range(4):
        for prefix in itertools.product(range(v), repeat=n + 1):  # x_0..x_n-1 (x_0 uniform)
            prob, ctx = 1.0 / v, (prefix[0],)
            for x in prefix[1:]:
                prob *= float(target.next_probs(ctx)[x])
                ctx = ctx + (x,)
            ref += prob * 0.5 * float((target.next_probs(ctx) - draft.next_probs(ctx)).abs().sum())
    assert exact == pytest.approx(ref, abs=1e-12)
    assert sum(per_pos) == pytest.approx(exact, abs=1e-12)
    # with one draft the engine's exact law gives the same number (Theorem 1)
    assert _expected_rejections_by_engine_law(target, draft, 1) == pytest.approx(exact, abs=1e-12)


def test_theorem3_recursion_matches_the_engine_law() -> None:
    target, draft = random_chain_pair(states=2, horizon=3, seed=5)
    for m in (2,):
        exact, _ = expected_rejections(target, draft, m)
        assert _expected_rejections_by_engine_law(target, draft, m) == pytest.approx(exact, abs=1e-12)
        assert exact <= expected_rejections(target, draft, m - 1)[0] + 1e-12


def test_engine_simulation_converges_to_exact() -> None:
    target, draft = random_chain_pair(states=4, horizon=6, seed=2)
    for m in (1, 2):
        exact, _ = expected_rejections(target, draft, m)
        counts = simulate_rejections(target, draft, runs=60, num_drafts=m, seed=m)
        mean = sum(counts) / len(counts)
        se = (sum((c - mean) ** 2 for c in counts) / (len(counts) - 1) / len(counts)) ** 0.5
        assert abs(mean - exact) <= 4.5 * se, (m, mean, exact, se)


def test_cli_rejections_with_plot(tmp_path: Path) -> None:
    png = tmp_path / "rej.png"
    res = _json(["theory", "rejections", "--states", "3", "--horizon", "6", "--runs", "15",
                 "--json", "--plot", str(png)])
    assert res["exact"] == pytest.approx(
        expected_rejections(*random_chain_pair(3, 6, 10), 1)[0], abs=1e-12)
    sim = res["simulation"]
    assert len(sim["running_mean"]) == 15 and sim["mean"] == pytest.approx(sum(sim["counts"]) / 15)
    assert png.read_bytes()[:8] == PNG


# ----- batch improvement -------------------------------------------------------------------------

def test_batch_closed_forms_limits_and_markov(tmp_path: Path) -> None:
    png = tmp_path / "batch.png"
    res = _json(["theory", "batch", "--max-drafts", "5", "--states", "3", "--horizon", "6",
                 "--json", "--plot", str(png)])
    assert all(res["checks"].values())
    assert png.read_bytes()[:8] == PNG
    for row in res["bernoulli"]:
        u, v = row["u"], row["v"]
        assert row["batch_improvement"] == pytest.approx([(u - v) * (1 - u ** (m - 1)) for m in res["M"]],
                                                         abs=1e-12)
        assert row["limit_M_inf"] == pytest.approx(u - v, abs=1e-12)
        assert row["max_error"] <= 1e-12 and len(row["enumerated"]) == 4
    for row in res["uniform"]:
        r = row["r"]
        assert row["batch_improvement"] == pytest.approx([(1 - 1 / r) - (1 - 1 / r) ** m for m in res["M"]],
                                                         abs=1e-12)
        assert row["limit_M_inf"] == pytest.approx(1 - 1 / r, abs=1e-12)
    mk = res["markov"]
    target, draft = random_chain_pair(3, 6, 10)
    assert mk["expected_rejections"][0] == pytest.approx(expected_rejections(target, draft, 1)[0], abs=1e-12)
    assert mk["limit_M_inf"] <= mk["expected_rejections"][-1] + 1e-12
    # the M → ∞ limit is approached from above (slowly: factors 1 − q(x*) for rare x*)
    e50, e400 = (expected_rejections(target, draft, m)[0] for m in (50, 400))
    assert mk["limit_M_inf"] - 1e-12 <= e400 <= e50 <= mk["expected_rejections"][-1] + 1e-12
    assert e400 - mk["limit_M_inf"] < 0.25 * (mk["expected_rejections"][0] - mk["limit_M_inf"])


def test_rejection_limit_keeps_mass_outside_the_draft_support() -> None:
    p = torch.tensor([0.5, 0.5, 0.0], dtype=torch.float64)
    q = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)
    # token 0 is never drafted: every draft is rejected w.p. >= p(0) = 1/2 ... in the limit
    # r* = δ_0 and TV(r*, q) = 1, so the product stops at TV(p, q)·TV(r^2, q) = 0.5·1.
    assert rejection_limit(p, q) == pytest.approx(0.5, abs=1e-12)
    assert batch_curves(max_drafts=2, states=2, horizon=2)["M"] == [1, 2]


# ----- Pareto front --------------------------------------------------------------------------------

def test_pareto_opt_on_line_uno_above(tmp_path: Path) -> None:
    for seed in range(5):
        res = pareto_points(vocab=6, seed=seed)
        assert res["max_opt_error"] <= 1e-12 and res["uno_above_front"]
        pts = res["points"]
        assert pts[0]["p_reject"] == pytest.approx(res["tv"], abs=1e-12)  # ε = 0: token verification
        assert any(r["tv_uno"] > r["front"] + 1e-3 for r in pts)  # strictly above somewhere
    png = tmp_path / "pareto.png"
    out = _json(["theory", "pareto", "--epsilons", "0,0.05,0.1", "--json", "--plot", str(png)])
    assert [r["epsilon"] for r in out["points"]] == [0.0, 0.05, 0.1]
    assert png.read_bytes()[:8] == PNG


# ----- draft length (PEARL §4) -------------------------------------------------------------------

def test_sd_formulas() -> None:
    for alpha in (0.0, 0.3, 0.8, 0.95):
        for g in range(9):
            assert sd_expected_tokens(alpha, g) == pytest.approx(sum(alpha ** i for i in range(g + 1)))
    assert sd_expected_tokens(1.0, 4) == 5.0
    assert sd_speedup(0.8, 3, 4.0) == pytest.approx((1 - 0.8 ** 4) / (0.2 * (3 / 4 + 1)))
    for alpha, c in ((0.6, 3.0), (0.8, 5.0), (0.9, 10.0)):
        brute = max(range(1, 65), key=lambda g: (sd_speedup(alpha, g, c), -g))
        assert sd_optimal_gamma(alpha, c) == brute
    with pytest.raises(ValueError, match="α"):
        sd_speedup(1.5, 2, 3.0)


def test_pearl_theorems() -> None:
    # Theorem 2: the paper's 1/(1−α)+1 next to ours; ours is the exact geometric series.
    for alpha in (0.5, 0.8, 0.9):
        e = pearl_expected_tokens(alpha)
        assert e["paper"] == pytest.approx(1 / (1 - alpha) + 1)
        series = sum(k * (1 - alpha) * alpha ** k for k in range(2000))  # E[#accepted]
        assert e["ours_accepted"] == pytest.approx(series, rel=1e-12)
        assert e["ours"] == pytest.approx(series + 1, rel=1e-12)
        assert e["ours"] == pytest.approx(sd_expected_tokens(alpha, 10**5), rel=1e-9)
    # Theorem 1: the optimal window is c (integer c), in our timing model.
    for alpha in (0.2, 0.5, 0.8, 0.95):
        for c in (1, 2, 3, 5, 8):
            assert draft_length_table(alpha, float(c), 24)["pearl_optimal_gamma"] == c
    assert pearl_speedup(1.0, 4, 4.0) == pytest.approx(4.0)


def test_theorem2_on_pearls_reference_schedule() -> None:
    # The real PEARL schedule with i.i.d. acceptance α = 0.8 accepts α/(1−α) = 4 draft tokens
    # per drafting phase, not the 1/(1−α) = 5 of the paper's equation (4) (before its "+1").
    sim = pearl_phase_simulation(0.8, gamma=4, tokens=3000, seed=0)
    assert sim["phases"] > 300
    assert abs(sim["mean_accepted_per_phase"] - sim["ours_accepted"]) <= 4.5 * sim["se"]
    assert abs(sim["mean_accepted_per_phase"] - sim["paper_accepted"]) > 4.5 * sim["se"]


def test_cli_draft_length(tmp_path: Path) -> None:
    png = tmp_path / "dl.png"
    res = _json(["theory", "draft-length", "--alpha", "0.8", "--c", "4", "--json", "--plot", str(png)])
    assert res["pearl_optimal_gamma"] == 4 and res["checks"]["pearl_optimum_is_c"]
    assert res["sd_optimal_gamma"] == 3
    assert res["pearl_expected_tokens"] == {"paper": pytest.approx(6.0), "ours": pytest.approx(5.0),
                                            "ours_accepted": pytest.approx(4.0)}
    assert png.read_bytes()[:8] == PNG


# ----- predict before you run ----------------------------------------------------------------------

def _stats_file(tmp_path: Path) -> Path:
    stats = {"method": "token", "gamma": 3, "iterations": 100, "drafted_by_position": [100, 100, 100],
             "accepted_by_position": [80, 64, 51], "draft_time_s": 1.0, "draft_calls": 100,
             "target_time_s": 0.5, "target_calls": 10}
    path = tmp_path / "gen.json"
    path.write_text(json.dumps({"text": "x", "tokens": [1], "stats": stats}))
    return path


def test_predict_from_measurements(tmp_path: Path) -> None:
    path = _stats_file(tmp_path)
    res = predict(path)
    row = res["predictions"][0]
    assert row["c"] == pytest.approx(5.0) and row["c_measured"]
    assert row["sd_speedup"][2] == pytest.approx((1 + 0.8 + 0.64 + 0.51) / (3 / 5 + 1))
    alpha = 0.51 ** (1 / 3)
    assert row["alpha_hat"] == pytest.approx(alpha)
    assert row["sd_speedup"][3] == pytest.approx((1 + 0.8 + 0.64 + 0.51 + 0.51 * alpha) / (4 / 5 + 1))
    assert res["best"]["speedup"] == max(max(row["sd_speedup"]), max(row["pearl_speedup"]))
    slow = predict(path, c=0.3)
    assert any("slower than ar" in w for w in slow["warnings"])
    assert any(w.startswith("every configuration") for w in slow["warnings"])
    code, out, err = _run(["theory", "predict", str(path), "--c", "0.3", "--json"])
    assert code == 0 and "warning:" in err and json.loads(out)["best"]["speedup"] < 1


def test_predict_from_bench_results_jsonl(tmp_path: Path) -> None:
    rows = [{"method": m, "temperature": 0.0, "gamma": 4, "drafted_by_position": [50, 50, 50, 50],
             "accepted_by_position": acc, "draft_time_s": 0.5, "draft_calls": 200,
             "target_time_s": 1.0, "target_calls": 50}
            for m, acc in (("token", [40, 30, 22, 15]), ("block", [42, 34, 27, 20]))]
    rows.append({"method": "ar", "temperature": 0.0, "gamma": 0, "drafted_by_position": []})
    path = tmp_path / "results.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    res = predict(path, max_gamma=6)
    assert [r["method"] for r in res["predictions"]] == ["token", "block"]
    for r in res["predictions"]:
        assert r["c"] == pytest.approx(8.0)  # (1.0/50) / (0.5/200)
    block = res["predictions"][1]
    assert block["sd_speedup"][3] == pytest.approx((1 + 0.84 + 0.68 + 0.54 + 0.4) / (4 / 8 + 1))
    assert res["best"]["speedup"] >= block["best"]["speedup"]


def test_predict_from_a_real_generate_json(tmp_path: Path) -> None:
    code, out, err = _run(["generate", "AB", "--target", "toy:random:3:1", "--draft", "toy:random:3:2",
                           "--method", "token", "--gamma", "3", "--max-new-tokens", "30", "--json"])
    assert code == 0, err
    path = tmp_path / "run.json"
    path.write_text(out)
    png = tmp_path / "pred.png"
    res = _json(["theory", "predict", str(path), "--c", "6", "--json", "--plot", str(png)])
    row = res["predictions"][0]
    stats = json.loads(out)["stats"]
    surv = [a / d for a, d in zip(stats["accepted_by_position"] + [0] * 3, stats["drafted_by_position"],
                                  strict=False) if d]
    assert row["acceptance_survival"] == pytest.approx(surv)
    assert row["sd_speedup"][2] == pytest.approx((1 + sum(surv[:3])) / (3 / 6 + 1))
    assert png.read_bytes()[:8] == PNG


def test_predict_errors(tmp_path: Path) -> None:
    bad = tmp_path / "empty.json"
    bad.write_text(json.dumps({"text": "x"}))
    code, _, err = _run(["theory", "predict", str(bad)])
    assert code == 2 and "acceptance" in err
    no_times = tmp_path / "no_times.json"
    no_times.write_text(json.dumps({"method": "block", "gamma": 2, "acceptance_by_position": [0.7, 0.5]}))
    code, _, err = _run(["theory", "predict", str(no_times)])
    assert code == 2 and "--c" in err
    assert _json(["theory", "predict", str(no_times), "--c", "3", "--json"])["best"] is not None
