"""The int8 target's passes run two ways side by side in one process (shared by
``int8_codes.py`` and ``int8_gemm.py``): the two alternate pass by pass (which goes first
alternates by round), so a drift of the host's speed falls on both. Passes: one-token steps
of 1, 4 and 8 rows, verification passes of 8 rows × 5 tokens and 1 row × 9 tokens (each after
the first HumanEval prompts), and the first HumanEval prompt read in one pass."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import results_io
import torch

from verispec.api import encode_prompt, load_pair
from verispec.bench.measure import machine_description
from verispec.bench.suites import load_suite
from verispec.models.base import CausalLM

TARGET = "qwen2.5-coder-1.5b-instruct"
#: (rows, tokens per row) of the decoding passes; "prompt" reads the first prompt
PASSES: tuple[tuple[int, int], ...] = ((1, 1), (4, 1), (8, 1), (1, 9), (8, 5))
WARMUP = 3


def load_target() -> CausalLM:
    return load_pair(TARGET, None, needs_draft=False).target


def _step(target: CausalLM, rows: int, k: int) -> Callable[[], None]:
    """One pass of k tokens on each of ``rows`` rows, rolled back after (lengths fixed)."""
    model = target.spawn()
    model.add_rows([encode_prompt(model, x.text) for x in load_suite("humaneval")[:rows]])
    lengths, tokens = model.lengths, [[100] * k for _ in range(rows)]

    def run() -> None:
        model.extend(tokens, check=False)
        model.rollback(lengths)
    return run


def _read(target: CausalLM) -> tuple[Callable[[], None], int]:
    ids = encode_prompt(target, load_suite("humaneval")[0].text)
    return (lambda: target.spawn().add_rows([ids])), len(ids)


def alternate(target: CausalLM, paths: Sequence[str], use: Callable[[str], None],
              rounds: int, passes: Sequence[tuple[int, int]] = PASSES,
              prompt: bool = True) -> dict[str, dict[str, list[float]]]:
    """{pass: {path: ms per round}}: each pass run on each of ``paths`` (``use(path)`` sets
    one up) in turns, the order reversed every other round, after :data:`WARMUP` rounds."""
    runs = {f"{r} × {k}": _step(target, r, k) for r, k in passes}
    if prompt:
        read, prompt_tokens = _read(target)
        runs[f"prompt read ({prompt_tokens} tokens)"] = read
    times: dict[str, dict[str, list[float]]] = {n: {p: [] for p in paths} for n in runs}
    for i in range(WARMUP + rounds):
        for name, run in runs.items():
            for path in (paths if i % 2 == 0 else paths[::-1]):
                use(path)
                start = time.perf_counter()
                run()
                if i >= WARMUP:
                    times[name][path].append(1e3 * (time.perf_counter() - start))
    return times


def logits_by_path(target: CausalLM, paths: Sequence[str],
                   use: Callable[[str], None]) -> dict[str, torch.Tensor]:
    """{path: logits [3, 5, V]} of the same 3 rows × 5 tokens (after a 3-token prompt each)
    on each of ``paths`` (``use(path)`` sets one up): what a script compares before timing."""
    ids = [[100 + 7 * i + j for j in range(5)] for i in range(3)]
    out = {}
    for path in paths:
        use(path)
        model = target.spawn()
        model.add_rows([[11, 12, 13]] * 3)
        out[path] = model.extend(ids, check=False)  # [3, 5, V]
    return out


def header() -> dict[str, Any]:
    """The machine, torch and its threads, for a results file."""
    return {"machine": machine_description(), "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def table(data: dict[str, Any], paths: Sequence[str], what: str, ratio: str) -> str:
    """The medians per pass and path, and the median of the rounds' ratios of the first path
    to the second with their range; ``what``: the line's words on what ran; ``ratio``: the
    ratio's column head."""
    first, second = paths
    lines = [f"{data['machine']}; torch {data['torch']}, {data['threads']} threads; "
             f"{what}; medians of {data['rounds']} rounds", "",
             "| pass (rows × tokens) | " + " | ".join(f"{p} (ms)" for p in paths)
             + f" | {ratio}: median of the rounds' ratios [min, max] |",
             "|---|---|---|---|"]
    for name, by_path in data["passes"].items():
        slow, fast = by_path[first], by_path[second]
        ratios = [a / b for a, b in zip(slow, fast)]
        lines.append(f"| {name} | {statistics.median(slow):.1f} | {statistics.median(fast):.1f} "
                     f"| {statistics.median(ratios):.3f}× [{min(ratios):.3f}, "
                     f"{max(ratios):.3f}] |")
    return "\n".join(lines)



def main(description: str, measure: Callable[[int], dict[str, Any]],
         table: Callable[[dict[str, Any]], str], argv: list[str] | None = None) -> int:
    """The command line of a script of this kind: ``--rounds``, ``--out``, ``--table``."""
    return results_io.cli(description, lambda args: measure(args.rounds), table, argv,
                          lambda p: p.add_argument("--rounds", type=int, default=15,
                                                   help="passes per path and kind"))
