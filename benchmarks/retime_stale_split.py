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
        [--prompts 6] [--tokens 96]

``--wide-from``: the forced split (the wide library runs passes of at least that many
token rows; 1: every pass, 0: none).
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import time

from verispec import api
from verispec.bench.suites import load_suite
from verispec.models.native import kernels
from verispec.models.native.retime import LibraryClock
from verispec.models.native.weights import int8_layers


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the machine type."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.machine()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="ar", choices=("ar", "block"))
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--wide-from", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    pair = api.load_pair("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct",
                         needs_draft=args.method != "ar", target_precision="int8",
                         progress=print)
    net = pair.target.net  # type: ignore[attr-defined]
    layers = int8_layers(net)
    if layers[0].kernel.wide is None or len(layers[0].packed) != 2:
        raise SystemExit(f"the target's int8 kernel ({layers[0].kernel}) does not keep two "
                         f"libraries here: nothing to re-time")
    wide_from = args.wide_from if args.wide_from > 0 else kernels.NO_ROWS
    prompts = load_suite("humaneval", args.prompts)
    rates: dict[str, list[float]] = {"recorded": [], "re-timed": []}
    clock = None
    for i, prompt in enumerate(prompts):
        sides = ["recorded", "re-timed"] if i % 2 == 0 else ["re-timed", "recorded"]
        tokens = {}
        for side in sides:
            for layer in layers:
                layer.wide_from = wide_from
            net.libraries = LibraryClock(layers) if side == "re-timed" else None
            clock = net.libraries or clock
            t0 = time.perf_counter()
            out = api.generate(pair.target, pair.draft, prompt.text, method=args.method,
                               gamma=args.gamma if args.method != "ar" else None,
                               temperature=0, max_new_tokens=args.tokens, ignore_eos=True)
            rates[side].append(len(out.tokens) / (time.perf_counter() - t0))
            tokens[side] = out.tokens
        assert tokens["recorded"] == tokens["re-timed"], "the libraries changed a token"
        print(f"prompt {i}: recorded {rates['recorded'][-1]:.2f}, "
              f"re-timed {rates['re-timed'][-1]:.2f} tok/s", flush=True)
    logs = [math.log(b / a) for a, b in zip(rates["recorded"], rates["re-timed"], strict=True)]
    print(f"CPU: {cpu_model()}; method {args.method}, "
          f"forced split: {layers[0].kernel.wide} from {args.wide_from} rows, "
          f"{args.prompts} HumanEval prompts x {args.tokens} tokens, T = 0")
    for side, r in rates.items():
        print(f"{side}: median {statistics.median(r):.2f} tok/s")
    print(f"re-timed / recorded: geometric mean {math.exp(statistics.mean(logs)):.3f} "
          f"(per prompt {', '.join(f'{math.exp(x):.3f}' for x in logs)})")
    print(clock.describe() if clock is not None else "")


if __name__ == "__main__":
    main()
