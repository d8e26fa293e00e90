"""A two-sample test of the first-k-token law of a method against a reference.

At each of a few prompts, N independent generations (one seed each) of a method and N of its
reference are cut to their first k tokens. At every prefix of the pooled samples the next
token's method/reference table gives a chi-square; each depth's sum is ranked within its
permutation null (the method/reference labels shuffled within each prompt), and the
statistic is the smallest of those per-depth p-values, itself ranked within the same
relabellings (see :mod:`verispec.bench.lawstats`: an exact-level permutation test). A
comparison is flagged when p < ``ALPHA``.

* **References.** verispec's methods and the biased control are compared with verispec's
  ``ar``; ``llamacpp-ar`` (the target's GGUF) also with ``ar``: a peer that runs another
  quantization must be flagged; ``llamacpp-spec`` with ``llamacpp-ar`` (same weights).
  A method named like its reference (``ar`` against ``ar``) is an independent second
  sample: a null comparison.
* **Prompts.** The first prompts of a suite (HumanEval), each advanced along the target's
  greedy path until the target's next-token law has at least ``MIN_ENTROPY`` nats
  (HumanEval prompts end where the next token, the indentation, is nearly certain).
* **Sampling.** verispec's samplers score each distinct context once
  (:class:`~verispec.bench.lawsource.SharedPrefixLM`), ``llamacpp-ar``'s evaluates each once
  and ``llamacpp-spec`` is one request per generation to one ``llama-server`` with the draft
  model (both loaded once, the prompt cached), so a default of thousands of generations per
  prompt costs minutes, not hours.
* **Power.** From the reference's own samples (their empirical law, with a Good–Turing
  share of unseen sequences) the test is simulated at its size against mixtures with three
  directions (:func:`verispec.bench.lawstats.directions`); the threshold is the largest,
  over the directions, of the mean TV over prompts flagged 80% of the time.
* **Biased control.** :class:`~verispec.bench.lawsource.FirstTokenBias` with ε chosen so
  that its exact TV, ε · mean TV(p₁, q₁), is ``CONTROL_TV_RATIO`` times the threshold.

``python -m verispec.bench.lawtest --methods token,block,biased-control,llamacpp-ar --out DIR``
writes ``lawtest.json`` and ``lawtest.md``; ``python -m verispec.bench.lawtest --report
DIR/lawtest.json`` prints that markdown again from the JSON alone (nothing is loaded or run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from verispec.api import Pair, load_pair
from verispec.bench.lawsource import (
    Seq,
    advance_prompt,
    control_samples,
    entropy,
    first_token_laws,
    llamacpp_samples,
    method_samples,
)
from verispec.bench.lawstats import (
    ALPHA,
    PERMUTATIONS,
    POWER_LEVEL,
    POWER_REPS,
    PowerCurve,
    TestResult,
    directions,
    empirical_law,
    permutation_test,
    power_threshold,
)
from verispec.methods import METHODS
from verispec.models.fetch import DEFAULT_DRAFT, DEFAULT_TARGET

__all__ = ["CONTROL", "Comparison", "LawTestConfig", "main", "reference_of", "run_lawtest"]

CONTROL = "biased-control"
LLAMACPP = ("llamacpp-ar", "llamacpp-spec")
DEFAULT_PROMPTS = 3
DEFAULT_SAMPLES = 3000  # per side and prompt: enough to see a 4-bit requantization's TV
DEFAULT_TOKENS = 2  # k: the first k tokens (k ≥ 2: k = 1 drafts nothing)
DEFAULT_GAMMA = 4  # ≥ k − 1: every token but the k-th is drafted
MIN_ENTROPY = 1.0  # nats: prompts advance until the next token is at least this uncertain
MAX_ADVANCE = 8  # greedy tokens a prompt may advance by
CONTROL_TV_RATIO = 1.5  # the control's TV, in units of the power threshold (≤ 2)
SEED_STRIDE = 1_000_000  # seeds of one sampler: base + prompt · N + i, base from its name

Progress = Callable[[str], None]


def reference_of(method: str) -> str:
    """The sampler a method is compared with."""
    return "llamacpp-ar" if method == "llamacpp-spec" else "ar"


@dataclass
class LawTestConfig:
    """Everything a run depends on (recorded in the report)."""

    methods: list[str]
    target: str = DEFAULT_TARGET
    draft: str = DEFAULT_DRAFT
    suite: str = "humaneval"
    prompts: int = DEFAULT_PROMPTS
    samples: int = DEFAULT_SAMPLES
    tokens: int = DEFAULT_TOKENS
    temperature: float = 1.0
    gamma: int = DEFAULT_GAMMA
    permutations: int = PERMUTATIONS
    alpha: float = ALPHA
    power_reps: int = POWER_REPS
    control_epsilon: float | None = None  # None: chosen from the power threshold
    llamacpp_prefill: str = "shared"
    precision: str = "auto"
    seed: int = 0
    min_entropy: float = MIN_ENTROPY
    max_advance: int = MAX_ADVANCE

    def check(self) -> None:
        known = set(METHODS) | {CONTROL, *LLAMACPP}
        unknown = [m for m in self.methods if m not in known]
        if unknown or not self.methods:
            raise ValueError(f"unknown method(s) {', '.join(unknown) or '(none given)'}; "
                             f"choose from {', '.join(sorted(known))}")
        if self.tokens < 2 or self.gamma < self.tokens - 1:
            raise ValueError(f"tokens must be >= 2 and gamma >= tokens - 1 (got tokens="
                             f"{self.tokens}, gamma={self.gamma}): with k = 1 nothing is drafted")
        if self.samples < 10 or self.prompts < 1 or self.temperature <= 0:
            raise ValueError("need samples >= 10, prompts >= 1 and temperature > 0")
        if self.samples * self.prompts > SEED_STRIDE:
            raise ValueError(f"at most {SEED_STRIDE} generations per sampler (seed ranges)")

    def seeds(self, source: str, prompt: int) -> list[int]:
        """The seeds of one sampler's generations at one prompt."""
        base = self.seed + SEED_STRIDE * (zlib.crc32(source.encode()) % 4096)
        return [base + prompt * self.samples + i for i in range(self.samples)]


@dataclass
class Comparison:
    """One method against its reference."""

    method: str
    reference: str
    statistic: float
    pvalue: float
    flagged: bool
    samples: int  # per side and prompt
    per_prompt: list[float]  # Σ_nodes X² of each prompt
    cells: list[int]
    nodes: list[int]
    known_tv: float | None = None  # exact TV of the method's first-k-token law (the control)
    verdict: str = ""


@dataclass
class _Prompt:
    id: str
    ids: list[int]
    advanced: int
    entropy: float
    tv_pq: float  # TV(p₁, q₁) of the first token
    ratio: dict[int, float] = field(default_factory=dict)  # q₁/p₁ on p₁'s likely tokens


class _Run:
    """The samplers, their samples (cached per source) and the pair."""

    def __init__(self, cfg: LawTestConfig, pair: Pair, progress: Progress) -> None:
        self.cfg, self.pair, self.progress = cfg, pair, progress
        self.samples: dict[str, list[list[Seq]]] = {}
        self.seconds: dict[str, float] = {}
        self.epsilon: float | None = cfg.control_epsilon

    def get(self, source: str, prompts: Sequence[_Prompt]) -> list[list[Seq]]:
        if source not in self.samples:
            start = time.perf_counter()
            self.samples[source] = [self._sample(source, j, p) for j, p in enumerate(prompts)]
            self.seconds[source] = time.perf_counter() - start
        return self.samples[source]

    def _sample(self, source: str, j: int, prompt: _Prompt) -> list[Seq]:
        cfg = self.cfg
        name = source.removeprefix("reference:")
        self.progress(f"sampling {source}: prompt {j + 1} ({prompt.id}), {cfg.samples} "
                      f"generations of {cfg.tokens} tokens")
        seeds = cfg.seeds(source, j)
        kw: dict[str, Any] = {"tokens": cfg.tokens, "temperature": cfg.temperature,
                              "gamma": cfg.gamma}
        if name == CONTROL:
            assert self.epsilon is not None
            return control_samples(self.pair, self.epsilon, prompt.ids, seeds, **kw)
        if name in LLAMACPP:
            from verispec.models.fetch import model_path

            return llamacpp_samples(
                name, prompt.ids, seeds, **kw, target_gguf=model_path(cfg.target, "gguf"),
                draft_gguf=model_path(cfg.draft, "gguf") if name == "llamacpp-spec" else None,
                eos=sorted(self.pair.target.eos_token_ids), prefill=cfg.llamacpp_prefill,
                progress=self.progress)
        return method_samples(self.pair, name, prompt.ids, seeds, **kw)


def _prompts(cfg: LawTestConfig, pair: Pair, progress: Progress) -> list[_Prompt]:
    from verispec.bench.suites import encode, load_suite

    out = []
    for p in load_suite(cfg.suite, cfg.prompts):
        raw = encode(p, pair.target.tokenizer)
        ids = advance_prompt(pair.target, raw, temperature=cfg.temperature,
                             min_entropy=cfg.min_entropy, max_advance=cfg.max_advance)
        p1, q1 = first_token_laws(pair, ids, cfg.temperature)  # [V] each
        likely = (p1 > 1e-6).nonzero()[:, 0].tolist()
        ratio = {t: float(q1[t] / p1[t]) for t in likely}
        out.append(_Prompt(p.id, ids, len(ids) - len(raw), entropy(p1),
                           float((p1 - q1).abs().sum() / 2), ratio))
        progress(f"prompt {p.id}: advanced {len(ids) - len(raw)} tokens, first-token entropy "
                 f"{out[-1].entropy:.2f} nats, TV(p1, q1) = {out[-1].tv_pq:.3f}")
    return out


def _power(cfg: LawTestConfig, ref: list[list[Seq]], prompts: Sequence[_Prompt]) -> list[PowerCurve]:
    laws = [empirical_law(s) for s in ref]
    dirs = [directions(law, p.ratio) for law, p in zip(laws, prompts, strict=True)]
    return power_threshold(laws, dirs, cfg.samples, cfg.samples, reps=cfg.power_reps,
                           permutations=cfg.permutations, alpha=cfg.alpha, seed=cfg.seed)


def _threshold(curves: Sequence[PowerCurve]) -> float | None:
    """The largest per-direction threshold TV (None if a direction is never reached)."""
    tvs = [c.tv for c in curves]
    return None if not tvs or any(t is None for t in tvs) else max(t for t in tvs if t is not None)


def verdict(flagged: bool, pvalue: float, reference: str, known_tv: float | None,
            threshold: float | None) -> str:
    """What a comparison's outcome says, given the power of the test."""
    if flagged:
        return f"flagged: its law differs from {reference}'s (p = {pvalue:.4f})"
    power = f"the power threshold {threshold:.3f}" if threshold is not None else \
        "the power threshold (not reached)"
    if known_tv is not None:
        if threshold is None or known_tv < threshold:
            return f"not flagged; its TV {known_tv:.4f} is below {power}: a miss is expected"
        return f"not flagged although its TV {known_tv:.4f} is above {power} (a miss)"
    return (f"not flagged: no deviation seen (a TV of {threshold:.3f} would be flagged "
            f"{POWER_LEVEL:.0%} of the time)" if threshold is not None else
            "not flagged: no deviation seen (the test's power was not established)")


def _compare(cfg: LawTestConfig, method: str, a: list[list[Seq]], b: list[list[Seq]],
             known_tv: float | None, threshold: float | None) -> Comparison:
    res: TestResult = permutation_test(list(zip(a, b, strict=True)),
                                       permutations=cfg.permutations, seed=cfg.seed,
                                       alpha=cfg.alpha)
    ref = reference_of(method)
    return Comparison(method, ref, res.statistic, res.pvalue, res.flagged, cfg.samples,
                      res.per_prompt, res.cells, res.nodes, known_tv,
                      verdict(res.flagged, res.pvalue, ref, known_tv, threshold))


def run_lawtest(cfg: LawTestConfig, *, pair: Pair | None = None,
                progress: Progress | None = None) -> dict[str, Any]:
    """Run the test for every method of ``cfg``; returns the report (a JSON-able dict)."""
    cfg.check()
    say = progress or (lambda _m: None)
    start = time.perf_counter()
    if pair is None:
        say(f"loading {cfg.target} and {cfg.draft} (precision {cfg.precision})")
        pair = load_pair(cfg.target, cfg.draft, precision=cfg.precision, progress=say)
    prompts = _prompts(cfg, pair, say)
    run = _Run(cfg, pair, say)
    powers: dict[str, list[PowerCurve]] = {}
    comparisons: list[Comparison] = []
    control: dict[str, Any] | None = None
    for method in cfg.methods:
        ref_name = reference_of(method)
        ref = run.get(f"reference:{ref_name}", prompts)
        if ref_name not in powers:
            say(f"power of the test against {ref_name}'s law ({cfg.power_reps} simulated "
                "checks per point)")
            powers[ref_name] = _power(cfg, ref, prompts)
        threshold = _threshold(powers[ref_name])
        known_tv = None
        if method == CONTROL:
            mean_tv = float(np.mean([p.tv_pq for p in prompts]))
            if run.epsilon is None:
                run.epsilon = 1.0 if threshold is None or mean_tv == 0 else \
                    min(1.0, CONTROL_TV_RATIO * threshold / mean_tv)
            known_tv = run.epsilon * mean_tv
            control = {"epsilon": run.epsilon, "tv": known_tv, "threshold": threshold,
                       "tv_per_prompt": [run.epsilon * p.tv_pq for p in prompts],
                       "ratio_to_threshold": None if not threshold else known_tv / threshold}
        comparisons.append(_compare(cfg, method, run.get(method, prompts), ref, known_tv,
                                    threshold))
        say(f"{method} vs {ref_name}: p = {comparisons[-1].pvalue:.4f} "
            f"({comparisons[-1].verdict})")
    return {
        "config": asdict(cfg),
        "prompts": [{k: v for k, v in asdict(p).items() if k != "ratio"} for p in prompts],
        "power": {ref: {"threshold_tv": _threshold(c), "level": POWER_LEVEL,
                        "curves": [asdict(x) for x in c]} for ref, c in powers.items()},
        "control": control,
        "comparisons": [asdict(c) for c in comparisons],
        "sampling_seconds": run.seconds,
        "llamacpp_spec": _spec_sampler(cfg) if "llamacpp-spec" in cfg.methods else None,
        "seconds": time.perf_counter() - start,
        "seeds": f"sampler s, prompt j, sample i: seed + {SEED_STRIDE} * (crc32(s) % 4096) "
                 "+ j * samples + i; s is the method's name or 'reference:<name>'",
    }


def _spec_sampler(cfg: LawTestConfig) -> dict[str, Any]:
    """How ``llamacpp-spec``'s samples were drawn: the program, its build and the requests."""
    from verispec.bench.lawsource import SERVED_SLOTS
    from verispec.bench.llamacpp import build_record, speculative_binary
    from verispec.bench.llamacpp.server import server_binary, spec_budget

    if cfg.llamacpp_prefill == "shared":
        binary = server_binary()
        how = (f"one llama-server (draft-simple, gamma {cfg.gamma}, p_min 0), one /completion "
               f"request per seed, {SERVED_SLOTS} at a time, n_predict {spec_budget(cfg.tokens)}")
    else:
        binary = speculative_binary()
        how = f"one llama-speculative-simple process per seed (gamma {cfg.gamma}, p_min 0)"
    return {"how": how, "binary": str(binary) if binary else None,
            "build": build_record(binary) if binary else None}


def markdown(report: dict[str, Any]) -> str:
    """The report as a markdown page."""
    cfg = report["config"]
    title = (f"# Two-sample law test: {cfg['suite']}, {cfg['prompts']} prompts, "
             f"{cfg['samples']} samples per side and prompt, first {cfg['tokens']} tokens, "
             f"T = {cfg['temperature']:g}")
    how = ("Chi-square homogeneity of the next token at every prefix of the pooled samples, "
           "summed per depth over the prompts; statistic: the smallest per-depth permutation "
           f"p-value, ranked within the same {cfg['permutations']} relabellings; flagged at "
           f"p < {cfg['alpha']:g}.")
    lines = [title, "", how, "",
             "| method | reference | smallest depth p | p-value | flagged | verdict |",
             "| --- | --- | ---: | ---: | --- | --- |"]
    for c in report["comparisons"]:
        lines.append(f"| {c['method']} | {c['reference']} | {c['statistic']:.4f} | "
                     f"{c['pvalue']:.4f} | {'yes' if c['flagged'] else 'no'} | {c['verdict']} |")
    lines += ["", "## Power (TV of the first-k-token law, mean over prompts)", "",
              "| reference | direction | TV per unit t | size (t = 0) | threshold t | threshold TV |",
              "| --- | --- | ---: | ---: | ---: | ---: |"]
    for ref, p in report["power"].items():
        for c in p["curves"]:
            t = "not reached" if c["t"] is None else f"{c['t']:.3f}"
            tv = "not reached" if c["tv"] is None else f"{c['tv']:.4f}"
            lines.append(f"| {ref} | {c['direction']} | {c['tv_per_t']:.3f} | "
                         f"{c['null_rate']:.3f} | {t} | {tv} |")
    if report["control"]:
        c = report["control"]
        thr = "not reached" if c["threshold"] is None else f"{c['threshold']:.4f}"
        ratio = "" if c["ratio_to_threshold"] is None else \
            f", {c['ratio_to_threshold']:.2f} times the threshold"
        lines += ["", (f"Biased control: ε = {c['epsilon']:.4f}, exact TV of its first-k-token "
                       f"law {c['tv']:.4f} (power threshold {thr}{ratio}).")]
    lines += ["", "## Prompts", "",
              "| prompt | tokens | advanced | first-token entropy | TV(p1, q1) |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for p in report["prompts"]:
        lines.append(f"| {p['id']} | {len(p['ids'])} | {p['advanced']} | {p['entropy']:.2f} | "
                     f"{p['tv_pq']:.3f} |")
    if report.get("llamacpp_spec"):
        lines += ["", f"llamacpp-spec: {report['llamacpp_spec']['how']}."]
    lines += ["", f"Seeds: {report['seeds']}. Wall time {report['seconds']:.0f} s."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m verispec.bench.lawtest``."""
    ap = argparse.ArgumentParser(prog="python -m verispec.bench.lawtest",
                                 description="two-sample test of the first-k-token law")
    ap.add_argument("--report", default=None,
                    help="print the markdown of a lawtest.json written by --out (nothing is run)")
    ap.add_argument("--methods", default=None,
                    help=f"comma list: verispec methods, {CONTROL}, llamacpp-ar, llamacpp-spec")
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--suite", default="humaneval")
    ap.add_argument("--prompts", type=int, default=DEFAULT_PROMPTS)
    ap.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="per side and prompt")
    ap.add_argument("--tokens", type=int, default=DEFAULT_TOKENS)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--gamma", type=int, default=DEFAULT_GAMMA)
    ap.add_argument("--permutations", type=int, default=PERMUTATIONS)
    ap.add_argument("--power-reps", type=int, default=POWER_REPS)
    ap.add_argument("--control-epsilon", type=float, default=None)
    ap.add_argument("--llamacpp-prefill", choices=("shared", "each"), default="shared",
                    help="shared: llamacpp-ar evaluates each distinct context once and "
                         "llamacpp-spec is served by one llama-server (prompt cached); each: "
                         "one generation (llamacpp-spec: one llama-speculative-simple "
                         "process) per sample")
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="directory for lawtest.json and lawtest.md")
    args = ap.parse_args(argv)
    if args.report:
        print(markdown(json.loads(Path(args.report).read_text(encoding="utf-8"))), end="")
        return 0
    if not args.methods or not args.out:
        ap.error("--methods and --out are required (or --report FILE)")
    cfg = LawTestConfig(methods=[m.strip() for m in args.methods.split(",") if m.strip()],
                        target=args.target, draft=args.draft, suite=args.suite,
                        prompts=args.prompts, samples=args.samples, tokens=args.tokens,
                        temperature=args.temperature, gamma=args.gamma,
                        permutations=args.permutations, power_reps=args.power_reps,
                        control_epsilon=args.control_epsilon,
                        llamacpp_prefill=args.llamacpp_prefill, precision=args.precision,
                        seed=args.seed)
    try:
        cfg.check()
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report = run_lawtest(cfg, progress=lambda m: print(m, file=sys.stderr, flush=True))
    report["command"] = "python -m verispec.bench.lawtest " + " ".join(
        sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "lawtest.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "lawtest.md").write_text(markdown(report))
    print(out / "lawtest.md")
    return 1 if any(c["flagged"] and c["method"] != CONTROL and c["method"] != "llamacpp-ar"
                    for c in report["comparisons"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
