"""How far a lower-precision model is from the float32 reference, on benchmark prompts.

For every prompt: the reference's greedy continuation of ``tokens`` tokens, then, along that
same text (teacher forcing, one pass per model), the per-token KL divergence
KL(p_ref || p_test) of the next-token distributions at temperature 1; and whether the test
model's own greedy continuation is the same ``tokens`` tokens. Speculative decoding with the
test model as the target samples the *test* model's law exactly; this measures how far that
law is from the float32 model's.

``python -m verispec.bench.fidelity --precision int8 --num-prompts 20 --tokens 128``

``--blocks 128/64,256/128`` compares int8 models built with those block sizes of the run-time
rotations before ``down_proj`` / ``o_proj`` (``0``: none; a ``:dense`` suffix, as in
``256/64:dense``, takes dense random orthogonal blocks instead of Kronecker products of
signed Hadamard matrices; :func:`~verispec.models.native.weights.int8_state`) on the same
reference texts.

``--report FILE [--against OTHER]`` prints the figures of a file written by ``--out`` (nothing
is loaded): per scheme the mean and max KL, the positions and the greedy agreement; with
several schemes in the file, or ``--against`` another run on the same prompts (7-bit codes
against 8-bit ones, say), the per-prompt ratio of the mean KLs (:func:`kl_ratios`), its
range and geometric mean with a 95% Student-t interval over prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from verispec.api import generate
from verispec.bench.metrics import paired_ratio_ci
from verispec.models.base import CausalLM

__all__ = ["PromptFidelity", "compare", "compare_many", "int8_schemes", "kl_ratios", "main",
           "render_file", "report"]

Record = dict[str, Any]


@dataclass
class PromptFidelity:
    """One prompt: mean and max KL over the positions scored, and greedy agreement."""

    prompt_id: str
    positions: int
    mean_kl: float
    max_kl: float
    agree: bool
    first_difference: int | None


def _logprobs(model: CausalLM, ids: list[int], first: int) -> torch.Tensor:
    """log p(· | ids[:i+1]) for i = first-1 .. len(ids)-2: [n, V] float64."""
    model.reset()
    model.add_rows([ids[: first - 1]])
    logits = model.extend([ids[first - 1 : -1]])[0]  # [n, V]
    model.reset()
    return torch.log_softmax(logits.double(), dim=-1)


def compare(reference: CausalLM, test: CausalLM, prompt: list[int], *, tokens: int,
            prompt_id: str = "") -> PromptFidelity:
    """KL(reference || test) along the reference's greedy continuation, and agreement."""
    return compare_many(reference, {"test": test}, prompt, tokens=tokens,
                        prompt_id=prompt_id)["test"]


def compare_many(reference: CausalLM, tests: dict[str, CausalLM], prompt: list[int], *,
                 tokens: int, prompt_id: str = "") -> dict[str, PromptFidelity]:
    """:func:`compare` for several test models along one reference continuation."""
    ref = generate(reference, None, prompt, method="ar", temperature=0, max_new_tokens=tokens)
    ids = prompt + ref.tokens
    lp_ref = _logprobs(reference, ids, len(prompt))  # [n, V]
    out = {}
    for name, test in tests.items():
        own = generate(test, None, prompt, method="ar", temperature=0, max_new_tokens=tokens)
        lp_test = _logprobs(test, ids, len(prompt))
        kl = (lp_ref.exp() * (lp_ref - lp_test)).sum(-1)  # [n]
        diff = next((i for i, (a, b) in enumerate(zip(ref.tokens, own.tokens, strict=False))
                     if a != b), None)
        if diff is None and len(ref.tokens) != len(own.tokens):
            diff = min(len(ref.tokens), len(own.tokens))
        out[name] = PromptFidelity(prompt_id, int(kl.numel()), float(kl.mean()),
                                   float(kl.max()), diff is None, diff)
    return out


def int8_schemes(model: str, blocks: str, eos_token_ids: frozenset[int] = frozenset(),
                 ) -> dict[str, CausalLM]:
    """int8 models of ``model`` for each ``down/o`` pair of rotation block sizes in
    ``blocks`` (comma-separated; 0 = no rotation), built in memory (not cached), stopping
    at ``eos_token_ids`` like the reference."""
    import json
    from pathlib import Path

    from verispec.models.fetch import resolve
    from verispec.models.native import NativeCausalLM, NativeConfig
    from verispec.models.native.weights import build_int8, dir_tensors, int8_state

    schemes = {pair: pair.removesuffix(":dense").partition("/")[::2]
               for pair in blocks.split(",")}  # name -> (down, o)
    for pair, (down, o) in schemes.items():
        if not (down.isdigit() and o.isdigit()):
            raise ValueError(f"--blocks takes down/o pairs like 128/64 or 256/64:dense, "
                             f"got {pair!r}")
    path = Path(resolve(model))
    config = NativeConfig.from_hf(json.loads((path / "config.json").read_text()))
    out: dict[str, CausalLM] = {}
    for pair, (down, o) in schemes.items():
        state = int8_state(config, dir_tensors(path), down_block=int(down) or None,
                           o_block=int(o) or None, hadamard=not pair.endswith(":dense"))
        out[f"int8 {pair}"] = NativeCausalLM(build_int8(config, state), name=f"int8 {pair}",
                                             eos_token_ids=eos_token_ids)
    return out


def summarize(rows: Sequence[PromptFidelity]) -> dict[str, float]:
    """Mean per-token KL over all positions, its 95% interval over prompts, agreement."""
    positions = sum(r.positions for r in rows)
    mean = sum(r.mean_kl * r.positions for r in rows) / positions
    per = [r.mean_kl for r in rows]
    sd = (sum((x - sum(per) / len(per)) ** 2 for x in per) / max(len(per) - 1, 1)) ** 0.5
    half = 1.96 * sd / math.sqrt(len(per))
    return {"prompts": len(rows), "positions": positions, "mean_kl": mean,
            "prompt_mean_kl_ci95": half, "max_kl": max(r.max_kl for r in rows),
            "greedy_agreement": sum(r.agree for r in rows) / len(rows)}


# -- reports of files written by --out -----------------------------------------------------

def _schemes(record: Record) -> dict[str, Record]:
    """scheme -> {"summary", "rows"} of a record written by ``--out`` (one scheme, named by
    its precision, where the run compared no blocks)."""
    if "schemes" in record:
        return dict(record["schemes"])
    return {record["precision"]: {"summary": record["summary"], "rows": record["rows"]}}


def _unit(prompt_id: str) -> str:
    """A prompt's id without its suite's name: the suite is named after its file, so
    ``specbench-3/161`` and ``specbench-3-per-category/161`` are the same prompt."""
    return prompt_id.split("/", 1)[-1]


def kl_ratios(rows: Sequence[Record], base: Sequence[Record]) -> dict[str, float]:
    """Per prompt, mean KL of ``rows`` over that of ``base``, on the prompts both scored
    along reference texts of the same length (the same positions)."""
    by_unit = {_unit(r["prompt_id"]): r for r in base}
    out = {}
    for r in rows:
        b = by_unit.get(_unit(r["prompt_id"]))
        if b is not None and b["positions"] == r["positions"] and b["mean_kl"] > 0:
            out[_unit(r["prompt_id"])] = r["mean_kl"] / b["mean_kl"]
    return out


def _summary_rows(record: Record, name: str) -> list[str]:
    rows = []
    for scheme, s in _schemes(record).items():
        sm, agree = s["summary"], sum(bool(r.get("agree")) for r in s["rows"])
        rows.append(f"| {name} | {scheme} | {sm['prompts']} | {sm['positions']} | "
                    f"{sm['mean_kl']:.5f} | {sm['prompt_mean_kl_ci95']:.5f} | "
                    f"{sm['max_kl']:.3f} | {agree} of {len(s['rows'])} |")
    return rows


def _ratio_row(label: str, ratios: dict[str, float], prompts: int) -> str:
    if not ratios:
        return f"| {label} | 0 of {prompts} | – | – |"
    gm, ci = paired_ratio_ci([math.log(x) for x in ratios.values()])
    interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    return (f"| {label} | {len(ratios)} of {prompts} | {min(ratios.values()):.2f}–"
            f"{max(ratios.values()):.2f} | {gm:.2f}{interval} |")


def report(record: Record, against: Record | None = None,
           names: tuple[str, str] = ("A", "B")) -> str:
    """The figures of a ``--out`` file (and of ``against``), and the per-prompt KL ratios:
    each scheme over the file's first, and each scheme over ``against``'s (the same scheme,
    or its only one)."""
    lines = [f"{names[0]}: {record.get('model')}, {record.get('tokens')} tokens"
             + (f"; {names[1]}: {against.get('model')}, {against.get('tokens')} tokens"
                if against else ""), "",
             "| file | scheme | prompts | positions | mean KL | ± 95% over prompts | max KL | "
             "greedy continuations identical |", "|---|---|---|---|---|---|---|---|"]
    lines += _summary_rows(record, names[0]) + (_summary_rows(against, names[1]) if against
                                                else [])
    mine = _schemes(record)
    ratios = []
    first = next(iter(mine))
    for scheme, s in list(mine.items())[1:]:
        ratios.append(_ratio_row(f"{names[0]} {scheme} / {names[0]} {first}",
                                 kl_ratios(s["rows"], mine[first]["rows"]), len(s["rows"])))
    if against:
        theirs = _schemes(against)
        for scheme, s in mine.items():
            other = scheme if scheme in theirs else next(iter(theirs)) if len(theirs) == 1 \
                else None
            if other is not None:
                ratios.append(_ratio_row(f"{names[0]} {scheme} / {names[1]} {other}",
                                         kl_ratios(s["rows"], theirs[other]["rows"]),
                                         len(s["rows"])))
    if ratios:
        lines += ["", "| per-prompt mean KL ratio | prompts (same positions) | range | "
                  "geometric mean [95% interval] |", "|---|---|---|---|", *ratios]
    return "\n".join(lines)


def render_file(path: str | Path, against: str | Path | None = None) -> str:
    """:func:`report` of a ``--out`` file (and of ``against``), files named by their stems."""
    a = json.loads(Path(path).read_text(encoding="utf-8"))
    b = json.loads(Path(against).read_text(encoding="utf-8")) if against else None
    return report(a, b, (Path(path).stem, Path(against).stem if against else "B"))


def main(argv: Sequence[str] | None = None) -> int:
    from verispec.bench.suites import encode, load_suites
    from verispec.models.fetch import DEFAULT_TARGET
    from verispec.models.loading import PRECISIONS, load_model

    ap = argparse.ArgumentParser(prog="python -m verispec.bench.fidelity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=DEFAULT_TARGET)
    ap.add_argument("--precision", default="int8", choices=[p for p in PRECISIONS if p != "auto"])
    ap.add_argument("--suite", default="humaneval", help="as in verispec bench")
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--blocks", default=None,
                    help="compare int8 models with these down/o rotation blocks, e.g. "
                         "128/64,256/128 (0: none); replaces --precision")
    ap.add_argument("--step-costs", action="store_true",
                    help="also time each test model's pass of 1 and 9 tokens after a 200-token "
                         "context (interleaved, median of 7) and stop")
    ap.add_argument("--out", default=None, help="write the per-prompt rows and summary as JSON")
    ap.add_argument("--report", default=None,
                    help="print the figures of a file written by --out (nothing is run)")
    ap.add_argument("--against", default=None,
                    help="with --report: another --out file, per-prompt KL ratios against it")
    args = ap.parse_args(argv)
    if args.report:
        print(render_file(args.report, args.against))
        return 0
    # the float32 reference only where texts are compared (a timing generates nothing)
    reference = None if args.step_costs else load_model(args.model, precision="float32")
    eos = frozenset() if reference is None else reference.eos_token_ids
    tests = (int8_schemes(args.model, args.blocks, eos) if args.blocks else
             {args.precision: load_model(args.model, precision=args.precision)})
    if args.step_costs:
        from verispec.models.timing import interleaved_costs

        costs = interleaved_costs([(m, (1, 9)) for m in tests.values()], context=200, reps=7)
        print(json.dumps({name: {f"k={k}": round(c[k] * 1e3, 1) for k in c}
                          for name, c in zip(tests, costs, strict=True)}))
        return 0
    assert reference is not None
    prompts = load_suites(args.suite.split(","), args.num_prompts, None)
    rows: dict[str, list[PromptFidelity]] = {name: [] for name in tests}
    for i, p in enumerate(prompts):
        start = time.perf_counter()
        ids = encode(p, reference.tokenizer, "auto")
        for name, r in compare_many(reference, tests, ids, tokens=args.tokens,
                                    prompt_id=p.id).items():
            rows[name].append(r)
            print(f"[{i + 1}/{len(prompts)}] {p.id} {name}: mean KL {r.mean_kl:.2e}, max "
                  f"{r.max_kl:.2e}, greedy "
                  f"{'agrees' if r.agree else f'differs at {r.first_difference}'} "
                  f"({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    summaries = {name: summarize(r) for name, r in rows.items()}
    print(json.dumps(summaries if args.blocks else summaries[args.precision], indent=2))
    if args.out:
        if args.blocks:
            record = {"schemes": {name: {"summary": summaries[name],
                                         "rows": [asdict(r) for r in rows[name]]}
                                  for name in tests}, "blocks": args.blocks}
        else:
            record = {"summary": summaries[args.precision], "precision": args.precision,
                      "rows": [asdict(r) for r in rows[args.precision]]}
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(record | {"model": args.model, "tokens": args.tokens}, f, indent=2)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
