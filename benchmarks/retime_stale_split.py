"""How fast a mixed int8 kernel recovers from a stale library split, side by side in one run.

The int8 target (embedded pair, mixed kernel) decodes with a split forced on its layers —
by default the wide library (oneDNN) for every pass, the split a guest in oneDNN's fast
state would record — once as recorded (no re-timing) and once re-timed from its own passes
(:class:`verispec.models.native.retime.LibraryClock`, started afresh on each prompt with the
forced split as its first choice). Per prompt the two sides run in turns, the side going
first alternating; both sides' tokens are the same (the libraries compute the same bits,
checked here). Reported: tokens per second per side (medians) and the geometric mean of
the per-prompt ratios re-timed / recorded, and where the re-timed passes ended up.

    python benchmarks/retime_stale_split.py [--method ar|block] [--wide-from 1] \
        [--prompts 6] [--tokens 96] [--out retime.json]
    python benchmarks/retime_stale_split.py --table retime.json   # the summary, from the file

``--wide-from``: the forced split (the wide library runs passes of at least that many
token rows; 1: every pass, 0: none). ``--out`` keeps every prompt's tokens and seconds per
side with the order they ran in, where the last prompt's re-timed passes ended up, the
arguments, the machine and the checkout's commit (``results_io.py``); ``--table`` prints the
summary (the lines after the last ``prompt i:`` line) from that file without running anything.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any

import results_io

SIDES = ("recorded", "re-timed")


def _prompt(pair: Any, layers: list[Any], wide_from: int, text: str, i: int,
            args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """Prompt ``i`` on both sides in turns: its entry, and the re-timed side's clock."""
    from verispec import api
    from verispec.models.native.retime import LibraryClock

    net = pair.target.net
    order = list(SIDES) if i % 2 == 0 else list(SIDES)[::-1]
    entry: dict[str, Any] = {"prompt": i, "order": order}
    tokens, clock = {}, None
    for side in order:
        for layer in layers:
            layer.wide_from = wide_from
        net.libraries = LibraryClock(layers) if side == "re-timed" else None
        clock = net.libraries or clock
        t0 = time.perf_counter()
        out = api.generate(pair.target, pair.draft, text, method=args.method,
                           gamma=args.gamma if args.method != "ar" else None,
                           temperature=0, max_new_tokens=args.tokens, ignore_eos=True)
        entry[side] = {"tokens": len(out.tokens), "seconds": time.perf_counter() - t0}
        tokens[side] = out.tokens
    assert tokens["recorded"] == tokens["re-timed"], "the libraries changed a token"
    return entry, clock


def _clock(clock: Any) -> dict[str, Any] | None:
    """Where the last prompt's re-timed passes ended up: the text and each group's times."""
    if clock is None:
        return None
    groups = [{"rows": rows, "head": head, "current": g.current, "spent": g.spent,
               "seconds_per_row": {lib: list(t) for lib, t in g.times.items()}}
              for (rows, head), g in sorted(clock.groups.items())]
    return {"describe": clock.describe(), "groups": groups}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every prompt on both sides: the record ``--out`` keeps and the summary is computed
    from."""
    from verispec import api
    from verispec.bench.suites import load_suite
    from verispec.models.native import kernels
    from verispec.models.native.weights import int8_layers

    pair = api.load_pair("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct",
                         needs_draft=args.method != "ar", target_precision="int8",
                         progress=print)
    layers = int8_layers(pair.target.net)  # type: ignore[attr-defined]
    if layers[0].kernel.wide is None or len(layers[0].packed) != 2:
        raise SystemExit(f"the target's int8 kernel ({layers[0].kernel}) does not keep two "
                         f"libraries here: nothing to re-time")
    wide_from = args.wide_from if args.wide_from > 0 else kernels.NO_ROWS
    prompts, clock = [], None
    for i, prompt in enumerate(load_suite("humaneval", args.prompts)):
        entry, clock = _prompt(pair, layers, wide_from, prompt.text, i, args)
        prompts.append({**entry, "id": prompt.id})
        rates = {side: entry[side]["tokens"] / entry[side]["seconds"] for side in SIDES}
        print(f"prompt {i}: recorded {rates['recorded']:.2f}, "
              f"re-timed {rates['re-timed']:.2f} tok/s", flush=True)
    rec = results_io.record(__file__, args, results_io.torch_info())
    rec.update({"kernel": str(layers[0].kernel), "wide_library": f"{layers[0].kernel.wide}",
                "prompts": prompts, "clock": _clock(clock)})
    return rec


def table(rec: dict[str, Any]) -> str:
    """The summary of a record (a run's, or one read back from ``--out``'s file)."""
    a = rec["args"]
    rates = {side: [p[side]["tokens"] / p[side]["seconds"] for p in rec["prompts"]]
             for side in SIDES}
    logs = [math.log(new / old)
            for old, new in zip(rates["recorded"], rates["re-timed"], strict=True)]
    lines = [f"CPU: {rec['machine']['cpu_model']}; method {a['method']}, "
             f"forced split: {rec['wide_library']} from {a['wide_from']} rows, "
             f"{a['prompts']} HumanEval prompts x {a['tokens']} tokens, T = 0"]
    lines += [f"{side}: median {statistics.median(r):.2f} tok/s" for side, r in rates.items()]
    lines.append(f"re-timed / recorded: geometric mean {math.exp(statistics.mean(logs)):.3f} "
                 f"(per prompt {', '.join(f'{math.exp(x):.3f}' for x in logs)})")
    lines.append(rec["clock"]["describe"] if rec["clock"] is not None else "")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="ar", choices=("ar", "block"))
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--wide-from", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--out", help="write every prompt's measurements and the machine as JSON")
    ap.add_argument("--table", help="print the summary of a JSON file written by --out (no run)")
    args = ap.parse_args()
    if args.table:
        print(table(results_io.read(args.table)))
        return
    results_io.measure_and_print(args.out, lambda: measure(args), table)


if __name__ == "__main__":
    main()
