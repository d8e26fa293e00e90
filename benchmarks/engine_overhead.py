"""The engine's own cost per iteration: everything outside the model passes.

Stand-in models with the embedded pair's vocabulary (151,936 ids) whose passes cost
almost nothing (fixed float32 logits, a target and a draft law that differ) run
``generate_batch`` with B rows; the stand-ins time their own passes, and the rest of the
wall time, divided by the batched target passes, is the engine's overhead per iteration:
drafting bookkeeping, gathering p and q, verification, sampling, row admission and
retirement.

    python benchmarks/engine_overhead.py [--batch 8] [--method block] [--gamma 4]
    python benchmarks/engine_overhead.py --baseline /path/to/older/checkout --rounds 5 \
        [--out overhead.json]
    python benchmarks/engine_overhead.py --baseline ... --same-allocator
    python benchmarks/engine_overhead.py --table overhead.json   # the table again, from the file

With ``--baseline`` each round runs the older checkout and this one in turn (fresh
processes, the one going first alternating) and the table pairs them round by round.
The engine sets glibc's malloc to reuse freed blocks (:mod:`verispec.engine.memory`); an
older engine may not, so ``--same-allocator`` gives both processes those settings through
``GLIBC_TUNABLES``, separating the allocator's share of a difference from the code's.
``--out`` keeps every round's raw measurements of each side, the arguments, the machine and
both checkouts' commits (``results_io.py``); ``--table`` prints the table from that file.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import results_io

HERE = Path(__file__).resolve()
VOCAB = 151_936  # the embedded pair's vocabulary


def _measure(args: argparse.Namespace) -> dict[str, float]:
    import torch

    from verispec.api import generate_batch
    from verispec.models.toy import TableLM

    class FixedLM(TableLM):
        """Every position has the same float32 logits; passes are timed into ``spent``, a
        box shared with the twins ``spawn`` makes (the API runs the pair on twins)."""

        def __init__(self, seed: int) -> None:
            super().__init__(VOCAB, name=f"fixed-{seed}")
            g = torch.Generator().manual_seed(seed)
            self.logits = torch.randn(VOCAB, generator=g) * 3  # [V]
            self.spent = [0.0]  # seconds in passes

        def _add_rows(self, prefixes: list[list[int]]) -> None:
            start = time.perf_counter()
            super()._add_rows(prefixes)
            self.spent[0] += time.perf_counter() - start

        def _extend(self, tokens: list[list[int]], num_logits: int) -> torch.Tensor:
            start = time.perf_counter()
            for row, new in zip(self._rows, tokens, strict=True):
                row.extend(new)
            out = self.logits.expand(len(tokens), num_logits, VOCAB)  # [R, n, V]
            self.spent[0] += time.perf_counter() - start
            return out

    torch.set_num_threads(2)
    target, draft = FixedLM(1), FixedLM(2)
    draft.logits = 0.7 * target.logits + 0.3 * draft.logits  # a draft close to the target
    prompts = [[(7 * i + j) % 1000 for j in range(16)] for i in range(args.batch)]
    kw = {"method": args.method, "gamma": args.gamma, "temperature": args.temperature,
          "max_new_tokens": args.tokens, "batch_size": args.batch, "ignore_eos": True}
    generate_batch(target, draft, prompts[:2], **{**kw, "max_new_tokens": 4})  # warm up
    target.spent[0] = draft.spent[0] = 0.0
    start = time.perf_counter()
    out = generate_batch(target, draft, prompts, **kw)
    wall = time.perf_counter() - start
    passes, model_s = out.stats.target_passes, target.spent[0] + draft.spent[0]
    return {"wall_s": wall, "model_s": model_s, "passes": passes,
            "overhead_ms": (wall - model_s) / passes * 1e3,
            "tokens": sum(len(r.tokens) for r in out.results)}


def _tunables(same_allocator: bool) -> str | None:
    """The engine's malloc settings as ``GLIBC_TUNABLES``, or None (each side's own)."""
    if not same_allocator:
        return None
    from verispec.engine.memory import MMAP_THRESHOLD, TRIM_THRESHOLD

    return (f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD}:"
            f"glibc.malloc.trim_threshold={TRIM_THRESHOLD}")


def _run(checkout: Path | None, argv: list[str], tunables: str | None) -> dict[str, Any]:
    env = None if tunables is None else {"GLIBC_TUNABLES": tunables}
    return results_io.run_worker(HERE, checkout, argv, env)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every round of both sides, fresh processes, the one going first alternating: the
    record ``--out`` keeps and the table is computed from."""
    argv = [f"--batch={args.batch}", f"--method={args.method}", f"--gamma={args.gamma}",
            f"--temperature={args.temperature}", f"--tokens={args.tokens}"]
    sides: dict[str, Path | None] = {"this": HERE.parents[1]}
    if args.baseline is not None:
        sides = {"baseline": args.baseline.resolve(), **sides}
    tunables = _tunables(args.same_allocator)
    rounds: list[dict[str, Any]] = []
    torch: dict[str, Any] | None = None
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        entry: dict[str, Any] = {"round": r, "order": order}
        for name in order:
            entry[name] = _run(sides[name], argv, tunables)
            info = entry[name].pop("torch")  # the same interpreter on both sides
            if name == "this":
                torch = info
        rounds.append(entry)
    rec = results_io.record(__file__, args, torch, args.baseline)
    rec.update({"glibc_tunables": tunables, "sides": list(sides), "rounds": rounds})
    return rec


def table(rec: dict[str, Any]) -> str:
    """The table of a record (a run's, or one read back from ``--out``'s file)."""
    a = rec["args"]
    runs = {name: [rnd[name] for rnd in rec["rounds"]] for name in rec["sides"]}
    lines = [f"B = {a['batch']}, {a['method']}, γ = {a['gamma']}, T = {a['temperature']:g}, "
             f"{a['tokens']} tokens per row, {a['rounds']} rounds"
             + (", both sides with the engine's malloc settings" if a["same_allocator"] else ""),
             "| engine | overhead per iteration, ms (median) | rounds | target passes |",
             "|---|---|---|---|"]
    for name, rs in runs.items():
        ms = [x["overhead_ms"] for x in rs]
        lines.append(f"| {name} | {statistics.median(ms):.1f} | "
                     f"{', '.join(f'{m:.1f}' for m in ms)} | {int(rs[0]['passes'])} |")
    if "baseline" in runs:
        ratios = [new["overhead_ms"] / old["overhead_ms"]
                  for old, new in zip(runs["baseline"], runs["this"], strict=True)]
        lines += ["", f"this / baseline per round: {', '.join(f'{x:.2f}' for x in ratios)} "
                      f"(median {statistics.median(ratios):.2f})"]
    return "\n".join(lines)


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--method", default="block")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--same-allocator", action="store_true",
                   help="give both sides the engine's malloc settings through GLIBC_TUNABLES")


def main() -> None:
    results_io.baseline_cli(__doc__.split("\n\n")[0], _options, measure, table,
                            lambda args: {**_measure(args), "torch": results_io.torch_info()})


if __name__ == "__main__":
    main()
