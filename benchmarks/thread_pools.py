"""torch's parallel kernels on a thread whose OpenMP team came second, with and without the
first thread's team handed back (:func:`verispec.models.threads.release_worker_threads`).

A server loads its models on one thread and decodes on another (its scheduler thread). The
script times, on (a) the thread that loaded the int8 target, (b) a second thread while the
first keeps its team, (c) a second thread after the first released its team: three kernels
(an elementwise product and a row max over [64, 8960] float32, a [560, 16] × [16, 16]
float64 matmul as in the int8 layers' input rotation) and plain decoding's time per token
(48 tokens after each of the first 2 HumanEval prompts, median gap between tokens).

    python benchmarks/thread_pools.py --out thread-pools.json
    python benchmarks/thread_pools.py --table thread-pools.json
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import results_io
import torch

from verispec import generate
from verispec.api import load_pair
from verispec.bench.measure import machine_description
from verispec.bench.suites import load_suite
from verispec.models.threads import release_worker_threads

TARGET = "qwen2.5-coder-1.5b-instruct"
TOKENS, PROMPTS, REPS = 48, 2, 2000
SIDES = ("loading thread", "second thread", "second thread, first released")


def _us(fn: Callable[[], Any]) -> float:
    for _ in range(100):
        fn()
    start = time.perf_counter()
    for _ in range(REPS):
        fn()
    return (time.perf_counter() - start) / REPS * 1e6


def _kernels() -> dict[str, float]:
    """Microseconds per call of each kernel."""
    big = torch.randn(64, 8960)  # [64, 8960]
    u = torch.randn(560, 16, dtype=torch.float64)  # [560, 16]
    rot = torch.randn(16, 16, dtype=torch.float64)  # [16, 16]
    return {"mul [64, 8960]": _us(lambda: big * 1.5),
            "abs().amax(-1) [64, 8960]": _us(lambda: big.abs().amax(-1)),
            "float64 [560, 16] @ [16, 16]": _us(lambda: u @ rot)}


def _tpot_ms(target: Any, prompts: list[str]) -> float:
    """Median milliseconds between two tokens of plain decoding, over the prompts."""
    gaps: list[float] = []
    for prompt in prompts:
        stamps: list[float] = []
        generate(target, None, prompt, method="ar", temperature=0, max_new_tokens=TOKENS,
                 ignore_eos=True, on_tokens=lambda new: stamps.append(time.perf_counter()))
        gaps += [b - a for a, b in zip(stamps, stamps[1:])]
    return 1e3 * statistics.median(gaps)


def _on_new_thread(fn: Callable[[], dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    thread = threading.Thread(target=lambda: out.update(fn()))
    thread.start()
    thread.join()
    return out


def measure() -> dict[str, Any]:
    target = load_pair(TARGET, None, needs_draft=False).target
    prompts = [p.text for p in load_suite("humaneval")[:PROMPTS]]

    def side() -> dict[str, float]:
        return {**_kernels(), "ar ms per token": _tpot_ms(target, prompts)}

    rows = {SIDES[0]: side(), SIDES[1]: _on_new_thread(side)}
    released = release_worker_threads()
    rows[SIDES[2]] = _on_new_thread(side)
    return {"machine": machine_description(), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "released": released,
            "command": "python benchmarks/thread_pools.py", "rows": rows}


def table(data: dict[str, Any]) -> str:
    rows = data["rows"]
    names = list(rows[SIDES[0]])
    lines = [f"{data['machine']}; torch {data['torch']}, {data['threads']} threads",
             "", "| measure | " + " | ".join(SIDES) + " |", "|---" * (len(SIDES) + 1) + "|"]
    for name in names:
        unit = "" if name.endswith("per token") else " (µs)"
        lines.append(f"| {name}{unit} | " + " | ".join(f"{rows[s][name]:.1f}" for s in SIDES)
                     + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return results_io.cli(__doc__.split("\n\n")[0], lambda _args: measure(), table, argv)


if __name__ == "__main__":
    sys.exit(main())
