"""The draft's int4 layers on each kernel: one row through 24 copies of each layer shape of
the embedded draft and its head (``DRAFT_TIMING_LAYERS``, every copy with weights of its own,
so that they stream from memory as in a step), on torch's int4 kernel and on verispec's with
each instruction set this CPU runs it with, at 1 and 2 threads (median of 9 sweeps per
shape), as a Markdown table and, with ``--out``, JSON.

    python benchmarks/int4_kernels.py [--out FILE]
    python benchmarks/int4_kernels.py --table FILE
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from verispec.bench.measure import machine_description
from verispec.models.native import int4_kernel
from verispec.models.native.linear import DRAFT_TIMING_LAYERS, Int4Linear

SWEEPS = 9


def _sweep_ms(layers: list[Int4Linear], x: torch.Tensor, kernel: str) -> float:
    def run() -> None:
        for lin in layers:
            if kernel == "torch":
                torch.ops.aten._weight_int4pack_mm_for_cpu(
                    x.to(torch.bfloat16), lin.packed, lin.group, lin.scales)
            else:
                int4_kernel.matmul(x, lin.lanes, use_isa=int(kernel))  # type: ignore[arg-type]

    run()
    times = []
    for _ in range(SWEEPS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure() -> list[dict[str, Any]]:
    kernels = ["torch"] + [str(i) for i in int4_kernel.ISAS if i <= int4_kernel.isa()]
    g = torch.Generator().manual_seed(0)
    rows = []
    for n, k, count in DRAFT_TIMING_LAYERS:
        layers = [Int4Linear.quantize(torch.randn((n, k), generator=g) * 0.02)
                  for _ in range(count)]
        x = torch.randn((1, k), generator=g)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            ms = {("torch's" if kn == "torch" else f"verispec's, {int4_kernel.ISAS[int(kn)]}"):
                  _sweep_ms(layers, x, kn) for kn in kernels}
            rows.append({"shape": [n, k], "count": count, "threads": threads, "ms": ms,
                         "megabytes": count * n * k / 2 / 1e6})
            print(_row(rows[-1]), flush=True)
    return rows


def _row(r: dict[str, Any]) -> str:
    cells = " | ".join(f"{ms:.2f}" for ms in r["ms"].values())
    return (f"| {r['shape'][0]} × {r['shape'][1]} × {r['count']} | {r['megabytes']:.0f} | "
            f"{r['threads']} | {cells} |")


def table(rows: list[dict[str, Any]]) -> str:
    names = list(rows[0]["ms"])
    lines = ["| layers [N × K × copies] | int4 MB | threads | "
             + " | ".join(f"{name} (ms)" for name in names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    lines += [_row(r) for r in rows if r["threads"] == 1]
    lines += [_row(r) for r in rows if r["threads"] == 2]
    for threads in (1, 2):
        mine = [r for r in rows if r["threads"] == threads]
        total = {name: sum(r["ms"][name] for r in mine) for name in names}
        lines.append(_row({"shape": ["all", "", ""], "count": "", "threads": threads,
                           "ms": total, "megabytes": sum(r["megabytes"] for r in mine)}))
    return "\n".join(lines).replace("| all ×  ×  |", "| all |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the rows and the machine to this JSON file")
    ap.add_argument("--table", help="print the table of a JSON file written by --out")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(Path(args.table).read_text())["rows"]))
        return
    if not int4_kernel.available():
        raise SystemExit(int4_kernel.status())
    rows = measure()
    print(table(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"command": "python benchmarks/int4_kernels.py " + " ".join(sys.argv[1:]),
             "machine": machine_description(), "sweeps": SWEEPS, "rows": rows},
            indent=2) + "\n")


if __name__ == "__main__":
    main()
