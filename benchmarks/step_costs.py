"""Step costs of every runtime of the embedded pair: one forward pass of k tokens after a
200-token context (median of 7), native int8, int4 (on verispec's int4 kernel where it is
built; the draft also on torch's alone; the target as a target runs it, float64 attention)
and float32 and llama.cpp's Q4_K_M GGUF, as a Markdown table. The
draft's int8 and int4 rows are measured over the whole vocabulary and over a subset of
:data:`SUBSET` ids and each row's context ids (``VERISPEC_DRAFT_VOCABULARY``).

    python benchmarks/step_costs.py [--out costs.json]   # llama.cpp rows need the peers extra
    python benchmarks/step_costs.py --table costs.json    # the table again, from the file
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from verispec.bench.llamacpp import forward_ms, llamacpp_available
from verispec.bench.measure import machine_description
from verispec.models.fetch import model_path
from verispec.models.native import int4_kernel, load_native
from verispec.models.timing import pass_costs

KS = (1, 2, 4, 9)
PAIR = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
SUBSET = 32768  # the draft's static ids in the subset rows
#: (precision, scored ids) per model: None scores the whole vocabulary, "subset" SUBSET ids
RUNS: dict[str, tuple[tuple[str, str | None], ...]] = {
    PAIR[0]: (("int8", None), ("int4", None), ("float32", None)),
    PAIR[1]: (("int8", "subset"), ("int8", None), ("int4", "subset"), ("int4", None),
              ("int4-torch", None), ("float32", None)),
}


def torch_int4_only(model: Any) -> Any:
    """``model`` (a native int4 model) with every pass on torch's int4 kernel, as where
    verispec's own cannot be built: its layers keep no weights in that kernel's layout."""
    net = model.net
    layers = [lin for b in net.blocks for lin in (b.qkv, b.o, b.gate_up, b.down)]
    for lin in [*layers, getattr(net.head, "linear", net.head)]:
        lin.lanes = None
    return model


def _row(row: dict[str, Any]) -> str:
    ms = {int(k): v for k, v in row["ms"].items()}
    cells = " | ".join(f"{ms[k]:.1f}" for k in KS)
    return f"| {row['model']} | {row['runtime']} | {cells} | {ms[9] / ms[1]:.2f} |"


def table(rows: list[dict[str, Any]] | dict[str, Any]) -> str:
    """The Markdown table of measured rows, or of a record written by ``--out`` (then under
    a line naming its machine)."""
    if isinstance(rows, dict):
        return f"machine: {rows['machine']}\n" + table(rows["rows"])
    head = ["| model | runtime | " + " | ".join(f"k = {k}" for k in KS) + " (ms) | V(9) |",
            "|---|---|" + "---|" * (len(KS) + 1)]
    return "\n".join(head + [_row(r) for r in rows])


def _native(name: str, precision: str, scored: str | None) -> dict[str, Any]:
    vocabulary = SUBSET if scored == "subset" else None
    target = name == PAIR[0]  # loaded as load_model loads a target or a draft
    model = load_native(model_path(name, "hf"), precision.removesuffix("-torch"),
                        vocabulary=vocabulary, online_rotations=target, exact_passes=target)
    if precision == "int4-torch":
        torch_int4_only(model)
    elif precision == "int4":
        precision = f"int4 ({int4_kernel.status()})"
    costs = pass_costs(model, context=200, ks=KS, reps=7)
    label = f"native {precision}" + (f", {vocabulary} ids + context ids" if vocabulary else "")
    label = label.replace("native int4-torch", "native int4 (torch's int4 kernel)")
    return {"model": name, "runtime": label, "ms": {k: v * 1e3 for k, v in costs.items()}}


def measure() -> list[dict[str, Any]]:
    torch.set_num_threads(2)
    rows = []
    print(table([]), flush=True)
    for name in PAIR:
        for precision, scored in RUNS[name]:
            rows.append(_native(name, precision, scored))
            print(_row(rows[-1]), flush=True)
        if llamacpp_available() is None:
            gguf = model_path(name, "gguf")
            ms = {k: statistics.median(forward_ms(gguf, context=200, batch=k, repeats=7))
                  for k in KS}
            rows.append({"model": name, "runtime": "llama.cpp Q4_K_M", "ms": ms})
            print(_row(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the measured rows and the machine to this JSON file")
    ap.add_argument("--table", help="print the table of a JSON file written by --out")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())))
        return
    rows = measure()
    if args.out:
        record = {"command": "python benchmarks/step_costs.py " + " ".join(sys.argv[1:]),
                  "machine": machine_description(), "context": 200, "repeats": 7,
                  "rows": rows}
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
