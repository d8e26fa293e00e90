"""Draft formats side by side in one run: the int8 draft as verispec loads it (no run-time
rotations), the int8 draft with the target's run-time rotations, the weight-only int4
draft (on verispec's int4 kernel for short passes where it is built; ``int4-torch``: on
torch's int4 kernel alone), and the int8 and int4 drafts over a vocabulary subset
(``int8-subset``, ``int4-subset``: SUBSET ids and each row's context ids, as
``VERISPEC_DRAFT_VOCABULARY``).

The target is the same model in every case (int8, or int4 with ``--target-precision
int4``; so ``ar`` and the output law are unchanged); only the draft differs. Per prompt and
temperature the drafts run one after the other (the order rotating from prompt to prompt),
``block`` with γ chosen by measurement (or fixed, ``--gamma``). Reported: the drafts' step
costs (one pass of k tokens after a 200-token context, interleaved, median of 7) and prompt
reading (200 tokens, median of 3, ms per token), and per temperature each draft's tokens per
second, its paired ratio to the first format (geometric mean over prompts with a 95%
Student-t interval over prompts, ``paired.py``) and tokens per target call.

    python benchmarks/draft_formats.py [--formats int8,int8-rotated,int4] [--num-prompts 10]
        [--target-precision int8|int4] [--out FILE]
        # --out: the figures and every prompt's speeds as JSON
    python benchmarks/draft_formats.py --table FILE   # the tables again, from such a file
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import results_io
from paired import format_interval
from step_costs import SUBSET, torch_int4_only

from verispec.api import generate
from verispec.bench.measure import machine_description
from verispec.bench.suites import encode, load_suite
from verispec.models.base import CausalLM
from verispec.models.fetch import model_path
from verispec.models.loading import load_model
from verispec.models.native import load_native
from verispec.models.timing import interleaved_costs

PAIR = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
#: format -> how the draft is loaded
LOADERS: dict[str, Callable[[], CausalLM]] = {
    "int8": lambda: load_model(PAIR[1], precision="int8", role="draft"),
    "int8-rotated": lambda: load_native(model_path(PAIR[1], "hf"), "int8"),
    "int4": lambda: load_model(PAIR[1], precision="int4", role="draft"),
    "int8-subset": lambda: load_native(model_path(PAIR[1], "hf"), "int8", vocabulary=SUBSET,
                                       online_rotations=False),
    "int4-subset": lambda: load_native(model_path(PAIR[1], "hf"), "int4", vocabulary=SUBSET,
                                       online_rotations=False),
    "int4-torch": lambda: torch_int4_only(load_model(PAIR[1], precision="int4", role="draft")),
}
KS = (1, 2, 4)
READ = 200  # prompt tokens read to time prompt reading


def _reading_ms(model: CausalLM, reps: int = 3) -> float:
    """Median ms per token of reading a READ-token prompt (one row)."""
    twin, times = model.spawn(), []
    ids = torch.randint(0, model.vocab_size, (READ,), generator=torch.Generator().manual_seed(0))
    for _ in range(reps):
        twin.reset()
        start = time.perf_counter()
        twin.add_rows([ids.tolist()])
        times.append(time.perf_counter() - start)
    return statistics.median(times) / READ * 1e3


def _steps_head() -> str:
    return ("| draft | " + " | ".join(f"k = {k} (ms)" for k in KS)
            + " | prompt reading (ms/token) |\n|---|" + "---|" * (len(KS) + 1))


def _steps_row(record: dict[str, Any], fmt: str) -> str:
    ms = {int(k): v for k, v in record["steps_ms"][fmt].items()}
    cells = " | ".join(f"{ms[k]:.1f}" for k in KS)
    return f"| {fmt} | {cells} | {record['reading_ms'][fmt]:.2f} |"


def _speed_head(first: str) -> str:
    return ("| T | draft | tok/s (median) | × " + first + " (paired, 95% interval) "
            "| tokens per target call |\n|---|---|---|---|---|")


def _speed_rows(record: dict[str, Any], temperature: float) -> list[str]:
    """Per format at one temperature: median tok/s over prompts, the paired ratio to the
    first format (prompts as the unit, ``paired.py``) and tokens per target call."""
    formats = record["args"]["formats"].split(",")
    runs = [r for r in record["runs"] if r["temperature"] == temperature]
    speed = {f: {r["prompt"]: r["tok_s"] for r in runs if r["draft"] == f} for f in formats}
    first, lines = formats[0], []
    for f in formats:
        ratio = "–" if f == first else format_interval(
            [(p, speed[f][p] / speed[first][p]) for p in speed[first] if p in speed[f]])
        made = sum(r["tokens"] for r in runs if r["draft"] == f)
        calls = sum(r["target_calls"] for r in runs if r["draft"] == f)
        lines.append(f"| {temperature:g} | {f} | {statistics.median(speed[f].values()):.2f} | "
                     f"{ratio} | {made / calls:.2f} |")
    return lines


def table(record: dict[str, Any]) -> str:
    """The step costs and the speeds of a record written by ``--out``."""
    formats = record["args"]["formats"].split(",")
    temperatures = sorted({r["temperature"] for r in record["runs"]})
    return "\n".join([_steps_head(), *(_steps_row(record, f) for f in formats), "",
                      _speed_head(formats[0]),
                      *(row for t in temperatures for row in _speed_rows(record, t))])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", default="int8,int8-rotated,int4")
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--gamma", default="auto", help="block's draft length: auto or a number")
    p.add_argument("--target-precision", default="int8", choices=("int8", "int4"))
    p.add_argument("--out", help="write the figures and every prompt's speeds as JSON")
    p.add_argument("--table", help="print the tables of a file written by --out (nothing runs)")
    args = p.parse_args()
    if args.table:
        print(table(results_io.read(args.table)))
        return
    formats = args.formats.split(",")
    unknown = sorted(set(formats) - set(LOADERS))
    if unknown:
        p.error(f"unknown formats {unknown}; choose from {', '.join(LOADERS)}")
    torch.set_num_threads(2)
    target = load_model(PAIR[0], precision=args.target_precision)
    drafts = {f: LOADERS[f]() for f in formats}
    costs = interleaved_costs([(d, KS) for d in drafts.values()], context=200, reps=7)
    record: dict[str, Any] = {"machine": machine_description(),
                              "args": {k: v for k, v in vars(args).items() if k != "table"},
                              "steps_ms": {}, "reading_ms": {}, "runs": []}
    print(_steps_head())
    for (f, d), ms in zip(drafts.items(), costs, strict=True):
        record["steps_ms"][f] = {k: ms[k] * 1e3 for k in KS}
        record["reading_ms"][f] = _reading_ms(d)
        print(_steps_row(record, f), flush=True)
    prompts = load_suite("humaneval", args.num_prompts)
    print("\n" + _speed_head(formats[0]))
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for i, prompt in enumerate(prompts):
            ids = encode(prompt, target.tokenizer)
            for f in formats[i % len(formats):] + formats[:i % len(formats)]:
                start = time.perf_counter()
                r = generate(target, drafts[f], ids, method="block",
                             gamma=args.gamma if args.gamma == "auto" else int(args.gamma),
                             temperature=temperature, seed=i,
                             max_new_tokens=args.max_new_tokens)
                record["runs"].append({"temperature": temperature, "prompt": prompt.id,
                                       "draft": f,
                                       "tok_s": len(r.tokens) / (time.perf_counter() - start),
                                       "tokens": len(r.tokens),
                                       "target_calls": r.stats.target_calls})
        print("\n".join(_speed_rows(record, temperature)), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
