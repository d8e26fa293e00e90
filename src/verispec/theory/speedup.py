"""Draft length and predicted speed-up (Section 4 of *Parallel Speculative Decoding with
Adaptive Draft Length*, Liu et al.).

Timing model (the paper's): a draft forward takes t, a target forward c·t, whatever the
number of tokens it scores; autoregressive decoding emits one token per c·t.

* **SD** with i.i.d. acceptance α: an iteration takes γt + ct and emits
  (1 − α^{γ+1})/(1 − α) tokens, so the speed-up is SD(γ) = (1 − α^{γ+1}) / ((1 − α)(γ/c + 1))
  (equation 2); its optimal γ is found by search over integers.
* **PEARL**, Theorem 2: the paper states E[#accepted tokens] = 1/(1 − α) + 1. Its proof sums
  (1 − α) Σ_k k α^k = S − αS with S = Σ_k k α^k; but S − αS = Σ_{k≥1} α^k = α/(1 − α), not
  1/(1 − α). We report both: the paper's value and ours,
  α/(1 − α) accepted draft tokens + 1 target token = 1/(1 − α) tokens per drafting phase.
* **PEARL speed-up** (our model of Algorithm 2 under the paper's timing, consistent with its
  proof of Theorem 1): every phase lasts max(γ, c)·t, draft and target running at once. In a
  post-verify phase the target checks a window of γ tokens, emitting min(K + 1, γ) with K the
  number of leading acceptances, and stays in post-verify iff all γ are accepted (α^γ); a
  pre-verify phase emits one token and moves to post-verify iff that first draft token is
  accepted (α). The stationary reward rate gives PEARL(γ) = c·R(γ)/max(γ, c) with
  R(γ) = (1 − α^γ) / ((1 − α)(1 + α − α^γ)); it rises for γ < c and falls for γ > c, so its
  maximiser is c (Theorem 1) up to rounding.
* :func:`predict` applies the SD model to *measured* per-position acceptance (the
  ``acceptance_by_position`` of ``verispec generate --json`` or a bench file) and a measured
  or given c, and warns about configurations predicted to be slower than ``ar``.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

__all__ = [
    "draft_length_table",
    "load_measurements",
    "pearl_expected_tokens",
    "pearl_phase_simulation",
    "pearl_speedup",
    "predict",
    "sd_expected_tokens",
    "sd_optimal_gamma",
    "sd_speedup",
]


def _check(alpha: float, c: float | None = None) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"the acceptance rate α must lie in [0, 1], got {alpha}")
    if c is not None and not c > 0:
        raise ValueError(f"c = T(target forward) / T(draft forward) must be > 0, got {c}")


def sd_expected_tokens(alpha: float, gamma: int) -> float:
    """(1 − α^{γ+1}) / (1 − α): tokens per SD iteration (γ + 1 at α = 1)."""
    _check(alpha)
    return float(gamma + 1) if alpha == 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def sd_speedup(alpha: float, gamma: int, c: float) -> float:
    """Equation (2): SD(γ) = (1 − α^{γ+1}) / ((1 − α)(γ/c + 1))."""
    _check(alpha, c)
    return sd_expected_tokens(alpha, gamma) / (gamma / c + 1)


def sd_optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> int:
    """argmax_γ SD(γ) over integers 1..max_gamma (the smallest maximiser)."""
    return max(range(1, max_gamma + 1), key=lambda g: (sd_speedup(alpha, g, c), -g))


def pearl_expected_tokens(alpha: float) -> dict[str, float]:
    """Theorem 2: the paper's 1/(1 − α) + 1 and ours, 1/(1 − α) (see the module docstring)."""
    _check(alpha)
    if alpha == 1.0:
        return {"paper": math.inf, "ours": math.inf, "ours_accepted": math.inf}
    return {"paper": 1 / (1 - alpha) + 1, "ours": 1 / (1 - alpha), "ours_accepted": alpha / (1 - alpha)}


def _pearl_rate(alpha: float, gamma: int) -> float:
    """R(γ): expected tokens per PEARL phase in the stationary regime."""
    if alpha == 1.0:
        return float(gamma)
    post = (1 - alpha ** gamma) / (1 - alpha)  # E[min(K + 1, γ)]
    leave = 1 - alpha ** gamma  # post → pre
    if leave == 0.0:
        return post
    pi_post = alpha / (alpha + leave)
    return pi_post * post + (1 - pi_post) * 1.0


def pearl_speedup(alpha: float, gamma: int, c: float) -> float:
    """PEARL(γ) = c·R(γ) / max(γ, c) under the paper's timing model (our derivation)."""
    _check(alpha, c)
    if gamma < 1:
        raise ValueError(f"PEARL's window γ must be >= 1, got {gamma}")
    return c * _pearl_rate(alpha, gamma) / max(gamma, c)


def pearl_phase_simulation(alpha: float, gamma: int, tokens: int = 3000, seed: int = 0) -> dict[str, Any]:
    """Theorem 2 checked on PEARL's sequential reference schedule (the real code).

    Target p = (α, 1 − α), draft q = (1, 0), token verification: every draft token is token 0
    and is accepted with probability α, independently — the theorem's i.i.d. assumption.
    Returns the measured mean accepted draft tokens per drafting phase with its standard
    error (geometric law: sd = √α / (1 − α)), next to ours α/(1 − α) and the paper's 1/(1 − α).
    """
    import torch

    _check(alpha)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"the simulation needs 0 < α < 1, got {alpha}")
    from verispec.methods.pearl.reference import reference_generate
    from verispec.methods.pearl.schedule import PearlConfig
    from verispec.models.toy import ContextIndependentLM
    from verispec.sampling import Sampling

    target, draft = ContextIndependentLM([alpha, 1 - alpha]), ContextIndependentLM([1.0, 0.0])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: intra-op threads only add contention
    try:
        out = reference_generate(target, draft, [0], cfg=PearlConfig(gamma=gamma, verifier="token"),
                                 sampling=Sampling(), max_new_tokens=tokens,
                                 generator=torch.Generator().manual_seed(seed))
    finally:
        torch.set_num_threads(threads)
    st: Any = out.stats
    phases = int(st.drafting_phases)
    se = math.sqrt(alpha) / (1 - alpha) / math.sqrt(phases) if phases else math.inf
    return {"alpha": alpha, "gamma": gamma, "tokens": tokens, "phases": phases,
            "mean_accepted_per_phase": st.mean_accepted_per_phase, "se": se,
            "ours_accepted": alpha / (1 - alpha), "paper_accepted": 1 / (1 - alpha)}


def draft_length_table(alpha: float, c: float, max_gamma: int = 16) -> dict[str, Any]:
    """SD and PEARL predictions for γ = 1..max_gamma and both optimal γ."""
    _check(alpha, c)
    gammas = list(range(1, max_gamma + 1))
    sd = [sd_speedup(alpha, g, c) for g in gammas]
    pearl = [pearl_speedup(alpha, g, c) for g in gammas]
    best_pearl = max(gammas, key=lambda g: (pearl[g - 1], -g))
    return {
        "alpha": alpha, "c": c, "gamma": gammas,
        "sd_expected_tokens": [sd_expected_tokens(alpha, g) for g in gammas],
        "sd_speedup": sd, "pearl_speedup": pearl,
        "sd_optimal_gamma": sd_optimal_gamma(alpha, c, max_gamma),
        "pearl_optimal_gamma": best_pearl,
        "pearl_optimal_gamma_theorem1": c,
        "pearl_expected_tokens": pearl_expected_tokens(alpha),
        "sd_expected_tokens_limit": sd_expected_tokens(alpha, 10**6) if alpha < 1 else math.inf,
        "note": "speed-ups over ar under the paper's timing model (draft forward t, target c·t); "
                "Theorem 2's proof gives α/(1−α) accepted tokens, so ours = 1/(1−α) per phase",
    }


# --------------------------------------------------------------------------------------
# Predict before you run.


def _records(data: Any) -> list[dict[str, Any]]:
    """Every dict in ``data`` that carries per-position acceptance counts or rates."""
    found: list[dict[str, Any]] = []

    def visit(x: Any, inherited: dict[str, Any]) -> None:
        if isinstance(x, dict):
            ctx = {**inherited, **{k: x[k] for k in ("method", "temperature", "gamma") if k in x}}
            if "drafted_by_position" in x or "acceptance_by_position" in x:
                found.append({**ctx, **x})
                return
            for v in x.values():
                visit(v, ctx)
        elif isinstance(x, list):
            for v in x:
                visit(v, inherited)

    visit(data, {})
    return found


def load_measurements(path: str | Path) -> list[dict[str, Any]]:
    """Read a ``generate --json`` output, a JSONL of such outputs or of bench rows
    (``results.jsonl``), or a bench ``summary.json``; return the acceptance records."""
    p = Path(path)
    if p.is_dir():
        p = p / "summary.json" if (p / "summary.json").exists() else p / "results.jsonl"
    text = p.read_text(encoding="utf-8")
    try:
        items: list[Any] = [json.loads(text)]
    except json.JSONDecodeError:
        items = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{p}:{number}: not valid JSON ({exc.msg})") from exc
    records = _records(items)
    if not records:
        raise ValueError(f"{p}: no acceptance_by_position / drafted_by_position found (give the "
                         "output of `verispec generate --json` or a bench results file)")
    return records


def _pool(records: list[dict[str, Any]]) -> dict[tuple[str, Any], dict[str, Any]]:
    """Per (method, temperature): survival A_i = P(τ ≥ i | drafted ≥ i) and c if measurable."""
    groups: dict[tuple[str, Any], dict[str, Any]] = defaultdict(lambda: {
        "drafted": [], "accepted": [], "rates": [], "t_draft": 0.0, "n_draft": 0, "t_target": 0.0,
        "n_target": 0, "gammas": set()})
    for r in records:
        if r.get("method") in ("ar", "mjgd", "pearl", "hf-ar"):
            continue  # no SD iterations to model (PEARL's phases are not Algorithm 3's)
        if r.get("gamma") in (0, None) and not r.get("drafted_by_position"):
            continue
        g = groups[(str(r.get("method", "?")), r.get("temperature"))]
        if r.get("gamma") is not None:
            g["gammas"].add(r["gamma"])
        if r.get("drafted_by_position"):
            for key, name in (("drafted", "drafted_by_position"), ("accepted", "accepted_by_position")):
                vals = r.get(name) or []
                g[key] += [0] * (len(vals) - len(g[key]))
                for i, v in enumerate(vals):
                    g[key][i] += int(v)
        elif r.get("acceptance_by_position"):
            g["rates"].append(list(r["acceptance_by_position"]))
        for side in ("draft", "target"):
            t, n = r.get(f"{side}_time_s"), r.get(f"{side}_calls")
            if t and n:
                g[f"t_{side}"] += float(t)
                g[f"n_{side}"] += int(n)
    out = {}
    for key, g in groups.items():
        if g["drafted"]:
            acc = g["accepted"] + [0] * (len(g["drafted"]) - len(g["accepted"]))
            surv = [a / d for a, d in zip(acc, g["drafted"], strict=True) if d]
        elif g["rates"]:
            n = min(len(x) for x in g["rates"])
            surv = [sum(x[i] for x in g["rates"]) / len(g["rates"]) for i in range(n)]
        else:
            continue
        c = None
        if g["n_draft"] and g["n_target"] and g["t_draft"] > 0:
            c = (g["t_target"] / g["n_target"]) / (g["t_draft"] / g["n_draft"])
        out[key] = {"survival": surv, "c": c, "gammas": sorted(g["gammas"])}
    return out


def _extend_survival(surv: list[float], gamma: int) -> tuple[list[float], float]:
    """Survival A_1..A_γ: measured, then extended geometrically with the fitted
    per-token α̂ = A_n^{1/n} (the i.i.d. assumption of equation 2)."""
    n = len(surv)
    alpha = surv[-1] ** (1 / n) if n and surv[-1] > 0 else 0.0
    out = list(surv[:gamma])
    while len(out) < gamma:
        out.append((out[-1] if out else 1.0) * alpha)
    return out, alpha


def predict(path: str | Path, *, c: float | None = None, max_gamma: int = 16) -> dict[str, Any]:
    """Predicted speed-up over ``ar`` for each γ ≤ max_gamma of every measured method (SD
    model with the measured acceptance) and of PEARL (i.i.d. α̂); the best; warnings."""
    groups = _pool(load_measurements(path))
    if not groups:
        raise ValueError(f"{path}: no speculative run with drafted tokens to predict from")
    results, warnings = [], []
    best: dict[str, Any] | None = None
    for (method, temperature), g in groups.items():
        cc = c if c is not None else g["c"]
        if cc is None:
            raise ValueError(f"{path}: cannot measure c for {method} (no draft/target times and "
                             "calls); give --c T(target forward)/T(draft forward)")
        _check(0.0, cc)
        gammas = list(range(1, max_gamma + 1))
        surv, alpha = _extend_survival(g["survival"], max_gamma)
        sd = [(1 + sum(surv[:k])) / (k / cc + 1) for k in gammas]
        pearl = [pearl_speedup(min(alpha, 1.0), k, cc) for k in gammas]
        row = {"method": method, "temperature": temperature, "measured_gammas": g["gammas"],
               "c": cc, "c_measured": g["c"] is not None and c is None, "alpha_hat": alpha,
               "acceptance_survival": g["survival"], "gamma": gammas, "sd_speedup": sd,
               "pearl_speedup": pearl,
               "best": {"gamma": gammas[max(range(len(sd)), key=sd.__getitem__)], "speedup": max(sd)},
               "pearl_best": {"gamma": gammas[max(range(len(pearl)), key=pearl.__getitem__)],
                              "speedup": max(pearl)}}
        results.append(row)
        for name, vals in ((method, sd), ("pearl", pearl)):
            slow = [k for k, s in zip(gammas, vals, strict=True) if s < 1.0]
            if slow:
                warnings.append(f"{name} (from {method} at T={temperature}) is predicted slower than "
                                f"ar for γ in {slow}")
            cand = {"method": name, "based_on": method, "temperature": temperature,
                    "gamma": gammas[max(range(len(vals)), key=vals.__getitem__)], "speedup": max(vals)}
            if best is None or cand["speedup"] > best["speedup"]:
                best = cand
    if best is not None and best["speedup"] < 1.0:
        warnings.append("every configuration is predicted slower than ar: use ar")
    return {"source": str(path), "predictions": results, "best": best, "warnings": warnings,
            "note": "SD: (1 + Σ_{i≤γ} A_i)/(γ/c + 1) with measured survival A_i, extended "
                    "geometrically beyond the measured γ; PEARL: our timing model with i.i.d. α̂"}
