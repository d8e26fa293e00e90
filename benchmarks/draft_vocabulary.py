"""What a draft that scores part of the vocabulary keeps, without timing noise.

At T = 0 a drafted token is kept exactly when the draft's greedy guess after the same prefix
equals the target's token. One teacher-forced pass of the whole-vocabulary draft over each
greedy `ar` output of a bench results file gives, per position, whether its guess matches;
a draft over a subset guesses the same token there exactly when that token is scored (the
argmax over a set that holds the overall argmax). Printed per static-set size: the positions
where the whole-vocabulary draft matches, those a subset keeps with the static set alone and
with each row's context ids too (the ids of the prompt and of the tokens before the
position), and the share of the target's tokens that lie outside the scored ids.

    python benchmarks/draft_vocabulary.py RESULTS.jsonl [--sizes 16384,32768,49152] [--out F]
    python benchmarks/draft_vocabulary.py --table F   # the table again, from such a file
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import results_io
from gamma_replay import greedy_outputs

from verispec.api import DEFAULT_DRAFT, DEFAULT_TARGET
from verispec.bench.measure import machine_description
from verispec.bench.suites import encode, load_suite
from verispec.models.fetch import model_path
from verispec.models.native import load_native
from verispec.models.native.vocabulary import subset_ids


def count(outputs: dict[str, list[int]], draft: Any, tokenizer: Any,
          static: dict[int, set[int]]) -> dict[str, Any]:
    """Positions kept per static-set size, alone and with the context ids."""
    prompts = {p.id: p for p in load_suite("humaneval")}
    found: dict[str, Any] = {"positions": 0, "matches": 0,
                             "sizes": {s: {"static": 0, "context": 0, "outside": 0}
                                       for s in static}}
    for pid, output in outputs.items():
        ids = encode(prompts[pid], tokenizer)
        row = draft.spawn()
        row.add_rows([ids[:-1]])
        guess = row.extend([[ids[-1]] + output[:-1]])[0].argmax(-1).tolist()  # [n]
        seen = set(ids)
        for g, t in zip(guess, output, strict=True):
            found["positions"] += 1
            found["matches"] += g == t
            for size, kept in static.items():
                c = found["sizes"][size]
                c["outside"] += t not in kept and t not in seen
                c["static"] += g == t and t in kept
                c["context"] += g == t and (t in kept or t in seen)
            seen.add(t)
    return found


def table(found: dict[str, Any]) -> str:
    """The counts of :func:`count` (or of a file written by ``--out``) as the script prints
    them; the draft's format is the record's ``precision`` (older files: their command's)."""
    precision = found.get("precision")
    if precision is None:
        words = str(found.get("command", "")).split()
        precision = words[words.index("--precision") + 1] if "--precision" in words else "?"
    n, m = found["positions"], found["matches"]
    lines = [f"{n} positions; the whole-vocabulary {precision} draft's greedy guess is the "
             f"target's token at {m} ({m / n:.1%})",
             "| static ids | kept: static set | kept: + context ids | target tokens outside |",
             "|---|---|---|---|"]
    for size, c in found["sizes"].items():
        lines.append(f"| {size} | {c['static']} ({c['static'] / m:.1%}) | {c['context']} "
                     f"({c['context'] / m:.1%}) | {c['outside']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?",
                    help="a `verispec bench` results.jsonl with `ar` at T = 0")
    ap.add_argument("--sizes", default="16384,32768,49152", help="static-set sizes")
    ap.add_argument("--precision", default="int4", help="the draft's format")
    ap.add_argument("--out", help="also write the counts as JSON")
    ap.add_argument("--table", help="print the table of a file written by --out (nothing runs)")
    args = ap.parse_args()
    if args.table:
        print(table(results_io.read(args.table)))
        return
    if not args.results:
        ap.error("RESULTS is required (or --table FILE)")
    torch.set_num_threads(2)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path(DEFAULT_TARGET, "hf"))
    draft = load_native(model_path(DEFAULT_DRAFT, "hf"), args.precision,
                        online_rotations=False)
    eos = draft.eos_token_ids
    static = {}
    for size in (int(s) for s in args.sizes.split(",")):
        ids = subset_ids(size, draft.vocab_size, eos, tokenizer)
        static[size] = set(range(draft.vocab_size)) if ids is None else set(ids.tolist())
    found = count(greedy_outputs(args.results), draft, tokenizer, static)
    print(table({**found, "precision": args.precision}))
    if args.out:
        record = {"command": "python benchmarks/draft_vocabulary.py " + " ".join(
            [args.results, "--sizes", args.sizes, "--precision", args.precision]),
            "machine": machine_description(), "precision": args.precision, **found}
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
