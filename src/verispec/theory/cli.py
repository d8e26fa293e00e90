"""``verispec audit`` and ``verispec theory ...``: argument parsing and output.

:func:`add_commands` adds both commands to the main parser; :func:`run` executes one.
Exit status: 0 when everything checks out, 1 when an audit refutes a lossless claim or a
paper's number is not reproduced (``checks`` in the output), 2 for bad input (raised as
ValueError and reported by :func:`verispec.cli.main`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
from typing import Any, TextIO

from verispec.checks import TOLERANCE

__all__ = ["add_commands", "run"]



def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated token ids, got {text!r}") from None


def _output(p: argparse.ArgumentParser, plot: bool = True) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    if plot:
        p.add_argument("--plot", default=None, metavar="FILE.png", help="write a figure")


def add_commands(sub: Any) -> None:
    """Add ``audit`` and ``theory`` to the ``verispec`` subparsers."""
    from verispec.theory.audit import AUDIT_MODELS

    a = sub.add_parser(
        "audit", help="exact output distribution of a method vs the target (is it lossless?)",
        description="Enumerate every draft block and verifier outcome on small toy models and "
                    "compare the method's law of the first LENGTH tokens with the target's. "
                    f"Exit status 1 when a method that claims to be lossless deviates by > {TOLERANCE:g}.")
    a.add_argument("--method", required=True,
                   help="a registered method, or a user verifier as module:function (a plan "
                        "function (p, q, tokens) -> VerifyPlan is audited exactly; a verifier "
                        "(p, q, tokens, generator) -> VerifyResult by sampling its randomness)")
    a.add_argument("--vocab", type=int, default=None, help="vocabulary size (default 3; 2 for ab-example)")
    a.add_argument("--gamma", type=int, default=2)
    a.add_argument("--length", type=int, default=3, help="tokens of output whose law is compared")
    a.add_argument("--seed", type=int, default=0, help="seed of the random toy models")
    a.add_argument("--seeds", type=int, default=1, help="audit seeds SEED..SEED+N-1")
    a.add_argument("--model", choices=AUDIT_MODELS, default="random",
                   help="toy pair: random contexts, Markov, random with exact zeros, or the paper's A/B")
    a.add_argument("--prompt", type=_ints, default=(0,), help="prompt token ids, e.g. 0,1")
    a.add_argument("--eos", type=int, default=None, help="an EOS token id for both models")
    a.add_argument("--temperature", type=float, default=1.0)
    a.add_argument("--top-k", type=int, default=None)
    a.add_argument("--top-p", type=float, default=None)
    a.add_argument("--eps", "--epsilon", dest="epsilon", type=float, default=None, help="lossy: ε")
    a.add_argument("--residual", choices=["opt", "target"], default=None, help="lossy: residual")
    a.add_argument("--num-drafts", type=int, default=None, help="multidraft: M")
    a.add_argument("--num-beams", type=int, default=None, help="mjsd/mjgd: beam width")
    a.add_argument("--threshold", type=float, default=None, help="mjsd: threshold")
    a.add_argument("--no-paper-warp", dest="paper_warp", action="store_const", const=False,
                   default=None, help="mjsd/mjgd: keep the requested warp")
    a.add_argument("--verifier", dest="verifier", choices=["token", "block"], default=None,
                   help="pearl: the verifier of each window")
    a.add_argument("--no-pre-verify", dest="pre_verify", action="store_const", const=False, default=None)
    a.add_argument("--no-post-verify", dest="post_verify", action="store_const", const=False, default=None)
    a.add_argument("--draft-stop", type=float, default=None, metavar="P",
                   help="token/block/lossy: the model drafter's early stop below top probability P")
    a.add_argument("--samples", type=int, default=20000,
                   help="user verifier with a generator: draws per draft block")
    _output(a)
    _add_theory(sub)


def _add_theory(sub: Any) -> None:
    """``verispec theory`` and its subcommands."""
    from verispec.theory.audit import AUDIT_MODELS

    t = sub.add_parser("theory", help="the papers' numbers next to ours (toy example, Lemma 10, "
                       "rejections, batch, Pareto, draft length, predictions)")
    ts = t.add_subparsers(dest="theory_command", required=True)
    p = ts.add_parser("toy-example", help="Block Verification Accelerates Speculative "
                      "Decoding (Sun et al.) §2-3: 10/9, 11/9, 12/9 and the CCDF of τ")
    p.add_argument("--gamma", type=int, default=2)
    p.add_argument("--ccdf-gamma", type=int, default=10)
    _output(p)
    p = ts.add_parser("ot-bound", help="Lemma 10: Σ min(Ms, Mb) vs token, block, greedy-block E[τ]")
    p.add_argument("--model", choices=AUDIT_MODELS, default="random")
    p.add_argument("--vocab", type=int, default=3)
    p.add_argument("--gamma", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=1.0)
    _output(p)
    p = ts.add_parser("rejections", help="Theorem 1: Σ E[TV] for non-stationary Markov chains vs "
                      "the real engine")
    p.add_argument("--states", type=int, default=7)
    p.add_argument("--horizon", type=int, default=50)
    p.add_argument("--seed", type=int, default=10, help="seed of the random chains")
    p.add_argument("--runs", type=int, default=100, help="engine runs")
    p.add_argument("--num-drafts", type=int, default=1, help="M > 1: multidraft (Theorem 3)")
    p.add_argument("--sim-seed", type=int, default=0)
    _output(p)
    p = ts.add_parser("batch", help="Theorem 3: rejections and batch improvement vs M")
    p.add_argument("--max-drafts", type=int, default=8)
    p.add_argument("--states", type=int, default=7)
    p.add_argument("--horizon", type=int, default=50)
    p.add_argument("--seed", type=int, default=10)
    p.add_argument("--bernoulli-u", type=_floats, default=(0.6, 0.7, 0.8, 0.9), help="draft Ber(u) values")
    p.add_argument("--bernoulli-v", type=float, default=0.5, help="target Ber(v)")
    p.add_argument("--uniform-r", type=_floats, default=(2.0, 4.0, 8.0), help="r = V/V' values")
    _output(p)
    p = ts.add_parser("pareto", help="Theorems 4-5: rejection vs bias, OPT on the line, UNO above")
    p.add_argument("--vocab", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epsilons", type=_floats, default=None, help="comma-separated ε grid")
    _output(p)
    p = ts.add_parser("draft-length", help="PEARL §4: SD's (1-α^{γ+1})/(1-α), its optimal γ, "
                      "PEARL's Theorems 1-2, speed-up vs γ")
    p.add_argument("--alpha", type=float, default=0.8, help="per-token acceptance rate α")
    p.add_argument("--c", type=float, default=4.0, help="T(target forward) / T(draft forward)")
    p.add_argument("--max-gamma", type=int, default=16)
    p.add_argument("--simulate", type=int, default=0, metavar="TOKENS",
                   help="also run PEARL's reference schedule for TOKENS tokens with i.i.d. "
                        "acceptance α and measure accepted tokens per drafting phase (Theorem 2)")
    _output(p)
    p = ts.add_parser("predict", help="predict speed-up per γ and method from measured acceptance")
    p.add_argument("file", help="`verispec generate --json` output, bench results.jsonl or summary.json")
    p.add_argument("--c", type=float, default=None, help="override / supply c = T(target)/T(draft)")
    p.add_argument("--max-gamma", type=int, default=16)
    _output(p)


def _clean(x: Any) -> Any:
    """JSON-safe: non-finite floats become strings ("inf", "nan")."""
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return "[" + ", ".join(_short(x) for x in v[:8]) + (", ...]" if len(v) > 8 else "]")
    return str(v)


def _text(res: dict[str, Any], out: TextIO, indent: str = "") -> None:
    for key, value in res.items():
        if key in ("laws", "running_mean", "running_se", "counts", "per_position"):
            continue
        if isinstance(value, dict):
            out.write(f"{indent}{key}:\n")
            _text(value, out, indent + "  ")
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            out.write(f"{indent}{key}:\n")
            out.writelines(f"{indent}  - " + ", ".join(
                    f"{k}={_short(v)}" for k, v in item.items() if k not in ("laws", "notes")) + "\n" for item in value)
        elif isinstance(value, list):
            shown = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in value[:16])
            out.write(f"{indent}{key}: [{shown}{', ...' if len(value) > 16 else ''}]\n")
        elif isinstance(value, float):
            out.write(f"{indent}{key}: {value:.12g}\n")
        else:
            out.write(f"{indent}{key}: {value}\n")


def _emit(res: dict[str, Any], args: argparse.Namespace, out: TextIO, err: TextIO,
          plotter: Any = None) -> None:
    if args.plot is not None:
        if plotter is None:
            raise ValueError("this command has no figure")
        plotter(res, args.plot)
        print(f"figure written to {args.plot}", file=err)
    shown = {k: v for k, v in res.items() if k != "laws"}
    if args.json:
        out.write(json.dumps(_clean(shown)) + "\n")
    else:
        _text(shown, out)


def _run_audit(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from verispec.theory.audit import audit
    from verispec.theory.plots import plot_audit

    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    if args.vocab is None:
        args.vocab = 2 if args.model == "ab-example" else 3
    options = {k: getattr(args, k) for k in ("epsilon", "residual", "num_drafts", "num_beams",
                                             "threshold", "paper_warp", "verifier",
                                             "pre_verify", "post_verify")}
    results = [audit(args.method, vocab=args.vocab, gamma=args.gamma, length=args.length, seed=s,
                     temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                     model=args.model, prompt=args.prompt, eos=args.eos, samples=args.samples,
                     draft_stop=args.draft_stop,
                     with_laws=args.plot is not None and s == args.seed, **options)
               for s in range(args.seed, args.seed + args.seeds)]
    first = results[0]
    if args.seeds == 1:
        res = first.to_dict(with_laws=True)
    else:
        worst = max(results, key=lambda r: r.max_abs_error)
        res = {"method": args.method, "vocab": args.vocab, "gamma": args.gamma, "length": args.length,
               "seeds": [args.seed, args.seed + args.seeds - 1],
               "max_abs_error": worst.max_abs_error, "worst_seed": worst.seed,
               "tv": max(r.tv for r in results),
               "expected_tokens_per_iteration": first.expected_tokens_per_iteration,
               "lossless": all(r.lossless for r in results),
               "claims_lossless": first.claims_lossless, "ok": all(r.ok for r in results),
               "exact": first.exact, "runs": [r.to_dict() for r in results],
               "laws": first.laws, "lossless_by_seed": [r.lossless for r in results]}
    plot_res = {**res, "laws": first.laws, "max_abs_error": first.max_abs_error, "tv": first.tv,
                "lossless": first.lossless}
    _emit(res, args, out, err, lambda _r, path: plot_audit(plot_res, path))
    if not res["ok"]:
        print(f"verispec audit: {args.method} claims to be lossless but its output law differs from "
              f"the target's (max |error| {res['max_abs_error']:.3e})", file=err)
        return 1
    return 0


def _run_theory(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from verispec.theory import papers, speedup
    from verispec.theory.plots import PLOTTERS

    cmd = args.theory_command
    checks: dict[str, bool] = {}
    if cmd == "toy-example":
        res = papers.toy_example(args.gamma, args.ccdf_gamma)
        checks["token_closed_form"] = res["token_error"] <= TOLERANCE
        if "max_error_vs_paper" in res:
            checks["paper_values"] = res["max_error_vs_paper"] <= TOLERANCE
        checks["block_ge_token"] = all(b >= t - TOLERANCE for b, t in zip(res["ccdf"]["block"], res["ccdf"]["token"], strict=True))
    elif cmd == "ot-bound":
        res = papers.ot_bound(model=args.model, vocab=args.vocab, gamma=args.gamma, seed=args.seed,
                              temperature=args.temperature)
        checks.update({k: res[k] for k in ("token_le_block", "block_le_bound", "greedy_attains_bound")})
    elif cmd == "rejections":
        res = papers.rejection_study(states=args.states, horizon=args.horizon, seed=args.seed,
                                     runs=args.runs, num_drafts=args.num_drafts, sim_seed=args.sim_seed)
        if res["simulation"]["z"] > 4:
            print(f"warning: the simulation mean is {res['simulation']['z']:.1f} standard errors "
                  "from the exact value", file=err)
    elif cmd == "batch":
        res = papers.batch_curves(max_drafts=args.max_drafts, states=args.states, horizon=args.horizon,
                                  seed=args.seed, bernoulli_u=args.bernoulli_u,
                                  bernoulli_v=args.bernoulli_v, uniform_r=args.uniform_r)
        checks["closed_forms_match_enumeration"] = all(
            r["max_error"] <= TOLERANCE for r in res["bernoulli"] + res["uniform"])
        rej = res["markov"]["expected_rejections"]
        checks["rejections_decrease_in_M"] = all(a >= b - TOLERANCE for a, b in itertools.pairwise(rej))
    elif cmd == "pareto":
        res = papers.pareto_points(vocab=args.vocab, seed=args.seed,
                                   epsilons=list(args.epsilons) if args.epsilons else None)
        checks["opt_on_front"] = res["max_opt_error"] <= TOLERANCE
        checks["uno_above_front"] = res["uno_above_front"]
    elif cmd == "draft-length":
        res = speedup.draft_length_table(args.alpha, args.c, args.max_gamma)
        if args.simulate:
            sim = speedup.pearl_phase_simulation(args.alpha, max(1, round(args.c)), args.simulate)
            res["pearl_simulation"] = sim
            if abs(sim["mean_accepted_per_phase"] - sim["ours_accepted"]) > 4.5 * sim["se"]:
                print("warning: PEARL's measured accepted tokens per phase is more than 4.5 "
                      "standard errors from α/(1−α)", file=err)
        if float(args.c).is_integer() and args.c <= args.max_gamma:
            checks["pearl_optimum_is_c"] = res["pearl_optimal_gamma"] == int(args.c)
    elif cmd == "predict":
        res = speedup.predict(args.file, c=args.c, max_gamma=args.max_gamma)
        for w in res["warnings"]:
            print(f"warning: {w}", file=err)
    else:  # pragma: no cover - argparse restricts the choices
        raise ValueError(f"unknown theory command {cmd!r}")
    if checks:
        res["checks"] = checks
    _emit(res, args, out, err, PLOTTERS[cmd])
    failed = [k for k, ok in checks.items() if not ok]
    if failed:
        print(f"verispec theory {cmd}: check(s) failed: {', '.join(failed)}", file=err)
        return 1
    return 0


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """Run ``audit`` or ``theory`` for parsed ``args``."""
    if args.command == "audit":
        return _run_audit(args, out, err)
    return _run_theory(args, out, err)
