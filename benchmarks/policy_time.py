"""What γ auto's batch choice costs per iteration: the time of ``choose_gammas``.

The embedded pair (``--precision auto``) decodes B random prompts of 150 ids through
``generate_batch`` with ``block`` and γ auto at T = 0, every row ``--tokens`` long; each
call of :func:`verispec.engine.batch_gamma.choose_gammas` (the engine's choice of every
row's γ, once per iteration) is timed, and the table gives its median and mean per batch
size next to the iteration's median (``Engine.step``). One untimed call per batch size goes
first (it times the pass-cost grid where no record is kept).

    python benchmarks/policy_time.py [--batch-sizes 2,4,8] [--tokens 48]
    python benchmarks/policy_time.py --baseline /path/to/older/checkout --rounds 3 \\
        [--out policy.json]
    python benchmarks/policy_time.py --table policy.json   # the table again, from the file

With ``--baseline`` each round runs the older checkout and this one in turn (fresh
processes, the one going first alternating). The choice depends only on what the engine
has recorded, so both sides make the same choices where their code decides alike.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import results_io

HERE = Path(__file__).resolve()
PROMPT_IDS = (200, 20000)  # random prompt ids are drawn from this range
PROMPT_LENGTH = 150


def _timed(obj: Any, name: str, into: list[float]) -> None:
    """Replace ``obj.name`` by a wrapper that appends each call's seconds to ``into``."""
    inner = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - start)

    setattr(obj, name, wrapper)


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from verispec.api import generate_batch, load_pair
    from verispec.engine import loop

    choices: list[float] = []
    steps: list[float] = []
    _timed(loop, "choose_gammas", choices)  # loop calls it by this module-level name
    _timed(loop.Engine, "step", steps)
    pair = load_pair("default-target", "default-draft")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(*PROMPT_IDS, (PROMPT_LENGTH,), generator=g).tolist()
               for _ in range(max(args.batch_sizes))]
    out: dict[str, Any] = {}
    for rows in args.batch_sizes:
        for timed in (False, True):
            choices.clear()
            steps.clear()
            result = generate_batch(pair.target, pair.draft, prompts[:rows], method="block",
                                    gamma="auto", temperature=0, max_new_tokens=args.tokens,
                                    batch_size=rows, ignore_eos=True)
        out[str(rows)] = {"choose_ms": [t * 1e3 for t in choices],
                          "step_ms": [t * 1e3 for t in steps],
                          "drafted": result.stats.drafted_total,
                          "passes": result.stats.target_passes}
    return out


def _run(checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [f"--batch-sizes={','.join(map(str, args.batch_sizes))}", f"--tokens={args.tokens}"]
    return results_io.run_worker(HERE, checkout, argv)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sides: dict[str, Path] = {"this": HERE.parents[1]}
    if args.baseline is not None:
        sides = {"baseline": args.baseline.resolve(), **sides}
    rounds = []
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        rounds.append({"round": r, "order": order,
                       **{name: _run(sides[name], args) for name in order}})
    rec = results_io.record(__file__, args, None, args.baseline)
    rec.update({"sides": list(sides), "rounds": rounds})
    return rec


def table(rec: dict[str, Any]) -> str:
    """Per side and batch size: choose_gammas' median and mean ms over every round's
    iterations, the iteration's median ms, and the rows' drafted tokens per round."""
    a = rec["args"]
    lines = [f"block, γ auto, T = 0, {a['tokens']} tokens per row, {a['rounds']} rounds",
             ("| side | B | choice: median ms | choice: mean ms | iteration: median ms | "
              "drafted tokens per round |"), "|---|---|---|---|---|---|"]
    for name in rec["sides"]:
        for rows in map(str, a["batch_sizes"]):
            runs = [rnd[name][rows] for rnd in rec["rounds"]]
            choose = [t for run in runs for t in run["choose_ms"]]
            steps = [t for run in runs for t in run["step_ms"]]
            drafted = ", ".join(str(run["drafted"]) for run in runs)
            lines.append(f"| {name} | {rows} | {statistics.median(choose):.3f} | "
                         f"{statistics.mean(choose):.3f} | {statistics.median(steps):.1f} | "
                         f"{drafted} |")
    return "\n".join(lines)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _counts(text: str) -> list[int]:
    values = [_positive(x) for x in text.split(",") if x]
    if not values:
        raise argparse.ArgumentTypeError("give at least one batch size")
    return values


def _options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-sizes", default=[2, 4, 8], type=_counts)
    p.add_argument("--tokens", type=_positive, default=48)
    p.add_argument("--rounds", type=_positive, default=1)


def main() -> None:
    results_io.baseline_cli(__doc__.split("\n\n")[0], _options, measure, table, _measure)


if __name__ == "__main__":
    main()
